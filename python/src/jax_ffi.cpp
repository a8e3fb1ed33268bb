// XLA FFI handlers of sdpa's jax custom calls (sdpa/_jax.py): the forward and backward run
// sdpa's C++ API on XLA's buffers, viewed as sdpa::Tensors without a copy. Built only when
// jax's XLA FFI headers were found (python/CMakeLists.txt: SDPA_XLA_FFI_INCLUDE_DIR).
//
// The handlers run later, on a thread XLA picks, so nothing of the tracing thread's state
// reaches them: the backends the sdpa_kernel guard allowed at trace time arrive as an
// attribute and are re-applied here.

#include <exception>
#include <optional>
#include <vector>

#include "bindings.h"
#include "sdpa/registry.h"
#include "xla/ffi/api/ffi.h"

namespace sdpa::python {
namespace {

namespace ffi = xla::ffi;

std::optional<DType> sdpa_dtype(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32: return DType::kFloat32;
    case ffi::DataType::F64: return DType::kFloat64;
    case ffi::DataType::BF16: return DType::kBFloat16;
    case ffi::DataType::F16: return DType::kFloat16;
    case ffi::DataType::PRED: return DType::kBool;
    default: return std::nullopt;
  }
}

// A view of an XLA buffer. sdpa/_jax.py requests no layout, so XLA passes the default
// row-major one.
Tensor view(const ffi::AnyBuffer& buffer, const char* arg) {
  const std::optional<DType> dtype = sdpa_dtype(buffer.element_type());
  SDPA_CHECK(dtype.has_value(), arg, ": expected float32, float64, bfloat16, float16 or bool, "
             "got XLA element type ", static_cast<int>(buffer.element_type()));
  const auto dims = buffer.dimensions();
  Shape shape(dims.begin(), dims.end());
  Shape strides = contiguous_strides(shape);
  return Tensor::from_blob(buffer.untyped_data(), std::move(shape), std::move(strides), *dtype);
}

// `t` with each size-1 dimension that is larger in `want` broadcast (zero stride). Under
// jax.vmap (vmap_method="expand_dims") an unbatched input arrives with a size-1 batch
// dimension where the outputs have the batch size; the outputs' shapes say which inputs
// must be broadcast. Other mismatches are left for sdpa's checks to report.
Tensor broadcast_like(const Tensor& t, const Shape& want) {
  if (t.dim() != static_cast<int64_t>(want.size())) return t;
  Shape sizes = t.sizes();
  bool changed = false;
  for (size_t d = 0; d < want.size(); ++d) {
    if (sizes[d] == 1 && want[d] != 1) {
      sizes[d] = want[d];
      changed = true;
    }
  }
  return changed ? t.expand(sizes) : t;
}

// `shape` with its last dimension replaced by `last` (out [.., L, Ev] from q [.., L, E]).
Shape with_last(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

Shape without_last(Shape shape) {
  shape.pop_back();
  return shape;
}

// True when q, k, v are 4-D with k/v broadcast nowhere but in the grouped-query head
// dimension: the shapes sdpa's out= variants take. Other calls take the functional API,
// which reduces ranks and broadcasts, and their results are copied out.
bool takes_out_variant(const Tensor& q, const Tensor& k, const Tensor& v, bool enable_gqa) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  for (const Tensor* t : {&k, &v}) {
    if (t->size(0) != q.size(0)) return false;
    if (!enable_gqa && t->size(1) != q.size(1)) return false;
  }
  return true;
}

SDPAOptions make_options(const std::optional<ffi::AnyBuffer>& mask, bool is_causal,
                         bool has_scale, double scale, bool enable_gqa) {
  SDPAOptions o;
  if (mask) o.attn_mask = view(*mask, "attn_mask");
  o.is_causal = is_causal;
  if (has_scale) o.scale = scale;
  o.enable_gqa = enable_gqa;
  return o;
}

std::vector<SDPBackend> backend_list(ffi::Span<const int32_t> backends) {
  std::vector<SDPBackend> list;
  for (const int32_t b : backends) list.push_back(static_cast<SDPBackend>(b));
  return list;
}

// Runs `body`, turning exceptions into XLA errors that carry sdpa's message (jax raises
// them on the Python side).
template <class Body>
ffi::Error run(Body&& body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const Error& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(e.what());
  }
}

// Writes out [*, L, Ev] (q's dtype) and lse [*, L] (float32) of attention over q [*, L, E],
// k [*, S, E], v [*, S, Ev] and an optional mask, allowed `backends` in that order.
ffi::Error forward(ffi::AnyBuffer q_buf, ffi::AnyBuffer k_buf, ffi::AnyBuffer v_buf,
                   std::optional<ffi::AnyBuffer> mask, ffi::Result<ffi::AnyBuffer> out_buf,
                   ffi::Result<ffi::AnyBuffer> lse_buf, bool is_causal, bool has_scale,
                   double scale, bool enable_gqa, ffi::Span<const int32_t> backends) {
  return run([&] {
    Tensor out = view(*out_buf, "out");
    Tensor lse = view(*lse_buf, "lse");
    const Tensor q_full = view(q_buf, "query");
    const Tensor q = broadcast_like(q_full, with_last(out.sizes(), q_full.size(-1)));
    const Tensor k = view(k_buf, "key");
    const Tensor v = view(v_buf, "value");
    const SDPAOptions options = make_options(mask, is_causal, has_scale, scale, enable_gqa);
    const sdpa_kernel guard(backend_list(backends), /*set_priority=*/true);
    if (takes_out_variant(q, k, v, enable_gqa)) {
      scaled_dot_product_attention_out(q, k, v, out, lse, options);
      return;
    }
    const AttentionResult r = scaled_dot_product_attention_with_lse(q, k, v, options);
    out.copy_(r.out);
    lse.copy_(r.lse);
  });
}

// Writes dq, dk, dv (and dmask, when that result is present: the float mask's gradient,
// summed over its broadcast dimensions) of the attention forward gave out and lse.
ffi::Error backward(ffi::AnyBuffer grad_out_buf, ffi::AnyBuffer q_buf, ffi::AnyBuffer k_buf,
                    ffi::AnyBuffer v_buf, ffi::AnyBuffer out_buf, ffi::AnyBuffer lse_buf,
                    std::optional<ffi::AnyBuffer> mask, ffi::Result<ffi::AnyBuffer> dq_buf,
                    ffi::Result<ffi::AnyBuffer> dk_buf, ffi::Result<ffi::AnyBuffer> dv_buf,
                    std::optional<ffi::Result<ffi::AnyBuffer>> dmask_buf, bool is_causal,
                    bool has_scale, double scale, bool enable_gqa,
                    ffi::Span<const int32_t> backends) {
  return run([&] {
    Tensor dq = view(*dq_buf, "grad_query");
    Tensor dk = view(*dk_buf, "grad_key");
    Tensor dv = view(*dv_buf, "grad_value");
    // Every input broadcast to the batch shape of the gradients XLA expects.
    const Tensor q = broadcast_like(view(q_buf, "query"), dq.sizes());
    const Tensor k = broadcast_like(view(k_buf, "key"), dk.sizes());
    const Tensor v = broadcast_like(view(v_buf, "value"), dv.sizes());
    const Shape out_shape = with_last(dq.sizes(), dv.size(-1));
    const Tensor grad_out = broadcast_like(view(grad_out_buf, "grad_out"), out_shape);
    const Tensor out = broadcast_like(view(out_buf, "out"), out_shape);
    const Tensor lse = broadcast_like(view(lse_buf, "lse"), without_last(dq.sizes()));
    SDPAOptions options = make_options(mask, is_causal, has_scale, scale, enable_gqa);
    options.attn_mask_requires_grad = dmask_buf.has_value();
    const sdpa_kernel guard(backend_list(backends), /*set_priority=*/true);
    if (!dmask_buf && takes_out_variant(q, k, v, enable_gqa)) {
      scaled_dot_product_attention_backward_out(grad_out, q, k, v, out, lse, dq, dk, dv,
                                                options);
      return;
    }
    const AttentionGradients g =
        scaled_dot_product_attention_backward(grad_out, q, k, v, out, lse, options);
    dq.copy_(g.grad_q);
    dk.copy_(g.grad_k);
    dv.copy_(g.grad_v);
    if (dmask_buf) view(**dmask_buf, "grad_attn_mask").copy_(g.grad_attn_mask);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(sdpa_jax_attention_forward, forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()          // query
                                  .Arg<ffi::AnyBuffer>()          // key
                                  .Arg<ffi::AnyBuffer>()          // value
                                  .OptionalArg<ffi::AnyBuffer>()  // attn_mask
                                  .Ret<ffi::AnyBuffer>()          // out
                                  .Ret<ffi::AnyBuffer>()          // lse
                                  .Attr<bool>("is_causal")
                                  .Attr<bool>("has_scale")
                                  .Attr<double>("scale")
                                  .Attr<bool>("enable_gqa")
                                  .Attr<ffi::Span<const int32_t>>("backends"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(sdpa_jax_attention_backward, backward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()          // grad_out
                                  .Arg<ffi::AnyBuffer>()          // query
                                  .Arg<ffi::AnyBuffer>()          // key
                                  .Arg<ffi::AnyBuffer>()          // value
                                  .Arg<ffi::AnyBuffer>()          // out
                                  .Arg<ffi::AnyBuffer>()          // lse
                                  .OptionalArg<ffi::AnyBuffer>()  // attn_mask
                                  .Ret<ffi::AnyBuffer>()          // grad_query
                                  .Ret<ffi::AnyBuffer>()          // grad_key
                                  .Ret<ffi::AnyBuffer>()          // grad_value
                                  .OptionalRet<ffi::AnyBuffer>()  // grad_attn_mask
                                  .Attr<bool>("is_causal")
                                  .Attr<bool>("has_scale")
                                  .Attr<double>("scale")
                                  .Attr<bool>("enable_gqa")
                                  .Attr<ffi::Span<const int32_t>>("backends"));

void bind_jax_ffi(nb::module_& m) {
  m.def(
      "jax_ffi_targets",
      [] {
        nb::dict targets;
        targets["sdpa_attention_forward"] =
            nb::capsule(reinterpret_cast<void*>(&sdpa_jax_attention_forward));
        targets["sdpa_attention_backward"] =
            nb::capsule(reinterpret_cast<void*>(&sdpa_jax_attention_backward));
        return targets;
      },
      "The XLA FFI handlers of sdpa's jax custom calls, name -> PyCapsule, for "
      "jax.ffi.register_ffi_target (platform \"cpu\").");
}

}  // namespace sdpa::python
