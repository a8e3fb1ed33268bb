#pragma once
// The operator registry: ops declared once by schema (PyTorch notation), kernels per
// (op, dispatch key), out=/in-place variants derived from functional kernels, a counted
// CPU fallback for ops a backend lacks, and external devices registered at run time
// (usually by plugins, see plugin.h and docs/backend_guide.md).

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "sdpa/sdpa.h"

namespace sdpa {

// ---------------------------------------------------------------------------------------
// Schemas

/// One argument or return of a schema, e.g. `Tensor(a!) out` or `float? scale=None`.
struct SchemaArgument {
  std::string name;           ///< may be empty for returns
  std::string type;           ///< "Tensor", "float", "bool", "int", "Tensor[]" (without '?')
  bool optional = false;      ///< `Type?`
  std::string alias_set;      ///< "a" for `Tensor(a!)` / `Tensor(a)`, else empty
  bool is_write = false;      ///< `(a!)`: the op writes this tensor
  bool kwarg_only = false;    ///< after `*`
  std::string default_value;  ///< text after '=', empty when none
  bool is_tensor() const { return type == "Tensor"; }
};

/// A parsed schema: `name[.overload](arguments) -> returns`.
struct FunctionSchema {
  std::string name;      ///< "attention_backward"
  std::string overload;  ///< "out" or empty
  std::vector<SchemaArgument> arguments;
  std::vector<SchemaArgument> returns;

  /// "attention.out" (name plus ".overload" when there is one).
  std::string full_name() const;
  /// The overload is `out`: kwarg-only `Tensor(x!)` arguments receive the results.
  bool is_out() const { return overload == "out"; }
  /// The name ends with '_': the op writes its first argument (PyTorch's convention).
  bool is_inplace() const { return !name.empty() && name.back() == '_'; }
  bool is_functional() const { return !is_out() && !is_inplace(); }
  /// The functional op this variant derives from: "attention" for "attention.out" and
  /// "attention_"; its own name for a functional op.
  std::string functional_name() const;
  /// Canonical text (what parse_schema read, normalized spacing).
  std::string to_string() const;
};

/// Parses PyTorch's schema notation. Throws sdpa::Error naming the position of a syntax
/// error.
FunctionSchema parse_schema(std::string_view schema);

// ---------------------------------------------------------------------------------------
// Boxed calls and kernels

/// One op call in boxed form: what every kernel receives, whatever its dispatch key.
///
/// Attention-family ops (attention, attention.out, attention_, attention_backward[.out],
/// materialize_bias) receive their positional schema arguments normalized into one
/// AttentionParams (q/k/v as 4-D views, the mask as a MaskDescriptor, scale, dropout, ...):
/// kernels read only that struct. Every other Tensor argument (the kwarg-only outs,
/// merge_attention_states' inputs) is in `args`, in schema order.
struct OpCall {
  const AttentionParams* params = nullptr;
  std::vector<Tensor> args;
  /// Filled by the kernel: the schema's Tensor returns, in order. Out= and in-place
  /// kernels may leave it empty (the registry returns the written tensors).
  std::vector<Tensor> returns;
  /// The `Tensor[]` return, when the schema has one (attention_backward: gradients of a
  /// flex score_mod's captured tensors).
  std::vector<Tensor> tensor_list;
  /// The backend selection chose for an attention-family call (the CPU kernels run it);
  /// ERROR when the caller did not select (kernels then select themselves).
  SDPBackend backend = SDPBackend::ERROR;
};

using BoxedKernel = std::function<void(OpCall& call)>;

/// A selection check of an external backend: true when it can run `params`, otherwise
/// false with a reason added (when reasons.collect).
using BackendCheck = std::function<bool(const AttentionParams& params, Reasons& reasons)>;

/// An op together with the C++ signature its kernels have. Registering a kernel through
/// it (BackendHandle::impl) checks the signature at compile time.
template <typename Signature>
struct Op {
  std::string_view name;
};

/// The ops, with their kernel signatures. Shapes are the 4-D kernel views.
namespace op {
/// Returns out [B, Hq, L, Ev] (query dtype) and lse [B, Hq, L] (float32) on the query's
/// device.
inline constexpr Op<std::tuple<Tensor, Tensor>(const AttentionParams&)> attention{"attention"};
/// Writes out [B, Hq, L, Ev] and lse [B, Hq, L] (contiguous, checked, preallocated).
inline constexpr Op<void(const AttentionParams&, const Tensor& out, const Tensor& lse)>
    attention_out{"attention.out"};
/// Writes the output into params.q (E == Ev).
inline constexpr Op<void(const AttentionParams&)> attention_{"attention_"};
/// Returns grad_q, grad_k, grad_v shaped like params.q/k/v (params.backward is set; reads
/// params.grad_out/out/lse).
inline constexpr Op<std::tuple<Tensor, Tensor, Tensor>(const AttentionParams&)>
    attention_backward{"attention_backward"};
/// Writes grad_q, grad_k, grad_v (contiguous, checked, preallocated).
inline constexpr Op<void(const AttentionParams&, const Tensor& grad_q, const Tensor& grad_k,
                         const Tensor& grad_v)>
    attention_backward_out{"attention_backward.out"};
/// Returns (out, lse) merged from two partial results over disjoint key sets.
inline constexpr Op<std::tuple<Tensor, Tensor>(const Tensor& out_a, const Tensor& lse_a,
                                               const Tensor& out_b, const Tensor& lse_b)>
    merge_attention_states{"merge_attention_states"};
/// Returns the call's mask as an additive [B, Hq, L, S] tensor of the query dtype.
inline constexpr Op<Tensor(const AttentionParams&)> materialize_bias{"materialize_bias"};
}  // namespace op

namespace detail {
template <typename Signature>
struct Boxer;

template <typename T>
inline void push_returns(OpCall& call, T&& value) {
  using V = std::decay_t<T>;
  if constexpr (std::is_same_v<V, Tensor>) {
    call.returns.push_back(std::forward<T>(value));
  } else {
    std::apply([&](auto&&... t) { (call.returns.push_back(std::move(t)), ...); },
               std::forward<T>(value));
  }
}

// Kernels either take (const AttentionParams&, const Tensor&...) or (const Tensor&...);
// the Tensor parameters come from OpCall::args in order.
template <typename R, typename... A>
struct Boxer<R(A...)> {
  static constexpr bool kTakesParams =
      sizeof...(A) > 0 &&
      std::is_same_v<std::tuple_element_t<0, std::tuple<A..., void>>, const AttentionParams&>;

  template <typename F>
  static constexpr bool kInvocable = std::is_invocable_r_v<R, const F&, A...>;

  template <typename F>
  static BoxedKernel box(F fn) {
    return [fn = std::move(fn)](OpCall& call) {
      invoke(fn, call, std::make_index_sequence<sizeof...(A) - (kTakesParams ? 1 : 0)>{});
    };
  }

  template <typename F, size_t... I>
  static void invoke(const F& fn, OpCall& call, std::index_sequence<I...>) {
    auto run = [&]() -> decltype(auto) {
      if constexpr (kTakesParams) {
        return fn(*call.params, call.args.at(I)...);
      } else {
        return fn(call.args.at(I)...);
      }
    };
    if constexpr (std::is_void_v<R>) {
      run();
    } else {
      push_returns(call, run());
    }
  }
};
}  // namespace detail

// ---------------------------------------------------------------------------------------
// Devices and dispatch keys

/// What an external device provides: memory and copies to and from host memory. The
/// registry moves tensors with these alone (CPU fallback, derived wrappers); kernels for
/// the device are registered separately.
struct DeviceInterface {
  /// The device's (and its dispatch key's) name, e.g. "arena". Must be unique.
  std::string name;
  /// Returns `nbytes` of device memory (64-byte aligned), or null when out of memory.
  std::function<void*(size_t nbytes)> allocate;
  /// Frees memory returned by allocate.
  std::function<void(void* ptr)> free;
  std::function<void(void* host_dst, const void* device_src, size_t nbytes)> copy_to_host;
  std::function<void(void* device_dst, const void* host_src, size_t nbytes)> copy_from_host;
  /// Optional: device-to-device copy (otherwise the registry copies through the host).
  std::function<void(void* device_dst, const void* device_src, size_t nbytes)> copy_on_device;
};

/// A dispatch key's registration handle: kernels and selection checks for one device
/// kind (the built-in keys "CPU" and "CUDA", or one per registered external device).
class BackendHandle {
 public:
  BackendHandle() = default;
  explicit BackendHandle(int key) : key_(key) {}

  int key() const { return key_; }
  /// The dispatch key's name ("CPU", "arena", ...).
  std::string name() const;
  /// The device (type and index) the key serves.
  Device device() const;

  /// Registers `kernel` for `op` on this key, replacing an earlier explicit kernel. An
  /// explicit kernel always wins over a derived variant and over the CPU fallback.
  template <typename Signature, typename F>
  BackendHandle& impl(const Op<Signature>& op, F kernel) {
    static_assert(detail::Boxer<Signature>::template kInvocable<F>,
                  "sdpa: this kernel's signature does not match the op's (see the Op<...> "
                  "type in this error and include/sdpa/registry.h, namespace sdpa::op)");
    if constexpr (detail::Boxer<Signature>::template kInvocable<F>) {
      return impl_boxed(op.name,
                        detail::Boxer<Signature>::box(std::function<Signature>(std::move(kernel))));
    } else {
      return *this;  // only the static_assert above reports the mismatch
    }
  }
  /// Registers a boxed kernel for the op named `op` ("attention.out"). Throws sdpa::Error
  /// for an unknown op.
  BackendHandle& impl_boxed(std::string_view op, BoxedKernel kernel);
  /// Removes this key's explicit kernel for `op`; returns whether there was one.
  bool remove(std::string_view op);

  /// Adds a named selection check (external devices): OVERRIDEABLE runs this key's
  /// kernels only when every check passes; failures appear in explain() as
  /// "<name>: <reason>".
  BackendHandle& add_check(std::string check_name, BackendCheck check);

 private:
  int key_ = -1;
};

/// Registers an external device and its dispatch key; returns the handle for its kernels
/// and checks. The device is Device{DeviceType::kExternal, n}, n counting registrations
/// from 0. Throws sdpa::Error when the name is taken or a function is missing.
BackendHandle register_device(DeviceInterface device);

/// The handle of the dispatch key serving `device`. Throws sdpa::Error when no key does
/// (an external device nobody registered).
BackendHandle backend_for(Device device);
/// The handle of the key named `name` ("CPU", "CUDA", "arena"); throws when none is.
BackendHandle backend_named(std::string_view name);
/// Every dispatch key's name, in registration order ("CPU", "CUDA", then external ones).
std::vector<std::string> dispatch_keys();

/// Allocates an uninitialized contiguous tensor on `device` (its DeviceInterface for
/// external devices).
Tensor empty(const Shape& shape, DType dtype, Device device);
/// Returns `t` on `device` (contiguous, same dtype); `t` itself when already there.
Tensor to_device(const Tensor& t, Device device);
/// `to_device(t, cpu)`.
Tensor to_host(const Tensor& t);
/// Copies `src` into `dst` (same shape, any strides, dtypes converted, devices CPU or
/// external in any combination).
void copy(const Tensor& dst, const Tensor& src);

// ---------------------------------------------------------------------------------------
// Plugins

/// A backend plugin that load_backend loaded.
struct LoadedBackend {
  std::string path;                 ///< as given
  std::vector<std::string> keys;    ///< dispatch keys (devices) it registered
  std::vector<Device> devices;
};

/// Loads a backend plugin (a shared library defining SDPA_BACKEND_PLUGIN, see plugin.h)
/// and runs its registration. Loading the same file again returns the first result.
/// Throws sdpa::Error naming the path when it cannot be loaded, lacks the entry points,
/// was built for another plugin ABI, or its registration throws.
/// The host program must export libsdpa's symbols to the plugin: link libsdpa shared, or
/// the static library whole-archive with -rdynamic (CMake: ENABLE_EXPORTS and
/// $<LINK_LIBRARY:WHOLE_ARCHIVE,sdpa::sdpa>).
LoadedBackend load_backend(const std::string& path);

/// Plugins loaded so far (SDPA_BACKENDS first, then load_backend calls).
std::vector<LoadedBackend> loaded_backends();

// ---------------------------------------------------------------------------------------
// Introspection and the fallback

/// How a dispatch key serves one op.
enum class KernelSource {
  kKernel,    ///< an explicit kernel
  kDerived,   ///< derived from another variant's explicit kernel (see `from`)
  kFallback,  ///< the CPU kernel, tensors copied to host and back
  kNone,      ///< not available
};

struct OpImplementation {
  std::string dispatch_key;
  KernelSource source = KernelSource::kNone;
  std::string from;  ///< kDerived: the variant it comes from ("attention")
};

struct OpInfo {
  std::string name;    ///< "attention.out"
  std::string schema;  ///< the declaration, PyTorch notation
  std::vector<OpImplementation> implementations;  ///< one per dispatch key
};

/// Every op, its schema and how each dispatch key implements it.
std::vector<OpInfo> ops();
/// ops() as text: each schema, then "  CPU: kernel", "  arena: derived from attention", ...
std::string describe_ops();

/// Calls the op named `name` on the dispatch key of the call's device (params->device, or
/// the first Tensor argument's). Out= variants check their outs (dtype, device, shape,
/// overlap with inputs; undefined or empty outs are replaced by new tensors in
/// call.args); kernels receive contiguous outs.
void call_op(std::string_view name, OpCall& call);

/// How many times each op ran through the CPU fallback ("attention_backward" -> 2).
std::map<std::string, int64_t> fallback_counts();
/// Zeroes the counters and re-arms the once-per-op fallback warnings.
void reset_fallback_counts();

// ---------------------------------------------------------------------------------------
// Typed entry points of the variants (scaled_dot_product_attention[_with_lse] and
// scaled_dot_product_attention_backward in sdpa.h call `attention` / `attention_backward`)

/// attention.out: writes the output into `out` [B, Hq, L, Ev] and the logsumexp into `lse`
/// [B, Hq, L] (3-D / 2-D for unbatched calls). Each must have the query's device, the
/// query dtype (lse: float32) and that shape, and must not overlap an input or the
/// other; an undefined or zero-element tensor is replaced by a new one. Any strides.
/// Returns the result (out/lse being the written tensors).
AttentionResult scaled_dot_product_attention_out(const Tensor& q, const Tensor& k,
                                                 const Tensor& v, Tensor& out, Tensor& lse,
                                                 const SDPAOptions& options = {});

/// attention_: computes attention and writes the output into `q` (needs Ev == E; k and v
/// may alias q). Returns q.
Tensor scaled_dot_product_attention_(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const SDPAOptions& options = {});

/// attention_backward.out: writes the gradients into grad_q, grad_k, grad_v (checked as
/// for attention.out against the shapes of q, k, v). attn_mask_requires_grad is not
/// supported (use scaled_dot_product_attention_backward).
AttentionGradients scaled_dot_product_attention_backward_out(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
    const Tensor& out, const Tensor& lse, Tensor& grad_q, Tensor& grad_k, Tensor& grad_v,
    const SDPAOptions& options = {});

/// Output and logsumexp of attention over a set of keys.
struct AttentionState {
  Tensor out;  ///< [..., L, Ev]
  Tensor lse;  ///< [..., L] float32
};

/// Merges the results of attention over two disjoint key sets A and B of the same queries
/// into the result over A ∪ B (split-KV decoding, context parallelism):
///   lse = log(exp(lse_a) + exp(lse_b)),
///   out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b,
/// computed with the larger lse factored out. Rows with lse = -inf on both sides give
/// out 0 and lse -inf. out_a/out_b [..., L, Ev] of one float dtype, lse_a/lse_b [..., L]
/// float32, all on one device; returns contiguous tensors of out_a's dtype / float32.
AttentionState merge_attention_states(const Tensor& out_a, const Tensor& lse_a,
                                      const Tensor& out_b, const Tensor& lse_b);

/// Returns the call's whole mask (attn_mask, AttnBias or is_causal) as an additive
/// [B, Hq, L, S] tensor of the query dtype on the query's device: 0 where a key takes
/// part, -inf where masked, plus additive terms. Zeros without a mask. Throws for flex
/// programs (they have no dense form).
Tensor materialize_bias(const Tensor& q, const Tensor& k, const Tensor& v,
                        const SDPAOptions& options = {});

}  // namespace sdpa
