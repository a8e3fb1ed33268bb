// torch tensors in and out without Python in between (sdpa.torch's calls).
//
// A tiny eager call from Python spent most of its time outside the kernel: Python checks
// that nothing records the call, a Python-level DLPack export per input and a round trip
// through sdpa._C.Tensor.__dlpack__ per output (issue 27). Here one call does it all:
// sdpa.torch registers torch's own functions once (torch.Tensor's DLPack C exchange table,
// or torch._C._to_dlpack and _from_dlpack on a torch without one; the torch.Tensor type;
// the mode and grad-mode queries; functorch's wrapper test), and these bindings call them
// directly. No torch header is included: the protocol is DLPack and Python calls, so the
// extension builds and imports without torch.

#include <dlpack/dlpack.h>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include "bindings.h"
#include "dlpack_versioned.h"
#include "sdpa/dlpack.h"

namespace sdpa::python {
namespace {

using DropoutState = std::tuple<uint64_t, uint64_t>;

// torch's functions, set once by register_torch. Plain references guarded by the GIL and
// never released (the interpreter may be gone when statics are destroyed).
struct TorchFunctions {
  PyTypeObject* tensor_type = nullptr;     // torch.Tensor (exactly: subclasses take the op)
  PyObject* to_dlpack = nullptr;           // torch._C._to_dlpack(tensor) -> capsule
  PyObject* from_dlpack = nullptr;         // torch._C._from_dlpack(capsule) -> tensor
  // torch.Tensor.__dlpack_c_exchange_api__ (null on a torch without it): views an input
  // and wraps an output without a capsule or a Python call. A tiny call's three inputs
  // and one output cost about 0.9 us through the two functions above, 0.2 us through it.
  const DLPackExchangeAPI* exchange = nullptr;
  // The queries of what may record a call; null when this torch lacks one (then every
  // call takes the op).
  PyObject* is_functorch_wrapped = nullptr;  // torch._C._functorch.is_functorch_wrapped_tensor
  PyObject* in_dispatch_mode = nullptr;    // torch.utils._python_dispatch.is_in_torch_dispatch_mode
  PyObject* in_function_mode = nullptr;    // torch._C._is_torch_function_mode_enabled
  PyObject* grad_enabled = nullptr;        // torch.is_grad_enabled
  // (device index) -> torch.cuda.current_stream(device).cuda_stream, for a torch whose
  // exchange table lacks current_work_stream.
  PyObject* current_stream = nullptr;
  // torch._C._get_math_sdp_allow_fp16_bf16_reduction (null on a torch without it).
  PyObject* reduction_allowed = nullptr;
  PyObject* is_cpu = nullptr;              // interned attribute names
  PyObject* is_cuda = nullptr;
  PyObject* requires_grad = nullptr;
};
TorchFunctions torch_fns;

const TorchFunctions& torch_functions() {
  if (torch_fns.to_dlpack == nullptr) {
    throw std::runtime_error("sdpa._C: torch functions are not registered (import sdpa.torch)");
  }
  return torch_fns;
}

// How a call on torch tensors runs; sdpa.torch names the same values.
enum Route : int {
  kThroughOp = 0,  // torch.ops.sdpa.attention: something may record or redirect the call
  kDirect = 1,     // the kernel directly: nothing to differentiate
  kAutograd = 2,   // sdpa.torch._EagerAttention: gradients, but nothing records the call
};

// True when `value` (a new reference, or null with a Python error set) is True.
bool is_true(PyObject* value) {
  if (value == nullptr) throw nb::python_error();
  const bool result = value == Py_True;
  Py_DECREF(value);
  return result;
}

// The route of a call on `tensors` (None entries skipped). The caller (sdpa.torch) has
// checked that torch.compile is not tracing: that test must stay in Python, where the
// tracer reads it, before any call into this extension. Here: no dispatch mode
// (FakeTensorMode, make_fx's tracer) and no __torch_function__ mode (`with
// torch.device(...)` included); per tensor, exactly torch.Tensor (a subclass may override
// __torch_function__), on the CPU or a CUDA device (on torch's current stream) and not a
// functorch wrapper (vmap, grad,
// functionalize); then kAutograd when grad mode is on and a tensor requires grad.
Route route_of(PyObject* const* tensors, size_t count) {
  const TorchFunctions& fns = torch_functions();
  if (fns.is_functorch_wrapped == nullptr || fns.in_dispatch_mode == nullptr ||
      fns.in_function_mode == nullptr) {
    return kThroughOp;  // a torch that cannot tell
  }
  if (is_true(PyObject_CallNoArgs(fns.in_dispatch_mode)) ||
      is_true(PyObject_CallNoArgs(fns.in_function_mode))) {
    return kThroughOp;
  }
  bool requires_grad = false;
  for (size_t i = 0; i < count; ++i) {
    PyObject* t = tensors[i];
    if (t == Py_None) continue;
    if (Py_TYPE(t) != fns.tensor_type ||
        !(is_true(PyObject_GetAttr(t, fns.is_cpu)) || is_true(PyObject_GetAttr(t, fns.is_cuda))) ||
        is_true(PyObject_CallOneArg(fns.is_functorch_wrapped, t))) {
      return kThroughOp;
    }
    requires_grad = requires_grad || is_true(PyObject_GetAttr(t, fns.requires_grad));
  }
  return requires_grad && is_true(PyObject_CallNoArgs(fns.grad_enabled)) ? kAutograd
                                                                          : kDirect;
}

// A torch tensor read zero-copy for the duration of one call. The library tensor views it
// without an owner of its own: the library keeps no input past the call (views of it may
// outlive the holder, never read), and a tiny call saves the allocations. Through the
// exchange table the caller's reference to the tensor keeps the memory alive; otherwise
// through torch's C-level DLPack export, whose capsule does. Both take tensors that
// require grad (sdpa only reads them).
class TorchInput {
 public:
  TorchInput(nb::handle tensor, const char* arg) {
    const TorchFunctions& fns = torch_functions();
    DLManagedTensor view{};
    const DLManagedTensor* managed = &view;
    if (fns.exchange != nullptr) {
      if (fns.exchange->dltensor_from_py_object_no_sync(tensor.ptr(), &view.dl_tensor) != 0) {
        throw nb::python_error();
      }
    } else {
      PyObject* capsule = PyObject_CallOneArg(fns.to_dlpack, tensor.ptr());
      if (capsule == nullptr) throw nb::python_error();
      capsule_ = nb::steal(capsule);
      managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      if (managed == nullptr) throw nb::python_error();
    }
    try {
      tensor_ = view_dlpack(*managed);
    } catch (const Error& e) {
      throw Error(std::string(arg) + ": " + e.what());  // name the argument
    }
  }
  const Tensor& tensor() const { return tensor_; }

 private:
  nb::object capsule_;  // destroyed after tensor_
  Tensor tensor_;
};

// The cudaStream_t a call on `device` runs on: torch's current stream for the device, as
// for torch's own ops, so the call is ordered after the work that wrote its inputs and
// before the work that reads its outputs (no synchronization needed). CPU calls: none.
void* torch_stream(Device device) {
  if (device.type != DeviceType::kCUDA) return nullptr;
  const TorchFunctions& fns = torch_functions();
  if (fns.exchange != nullptr && fns.exchange->current_work_stream != nullptr) {
    void* stream = nullptr;
    if (fns.exchange->current_work_stream(kDLCUDA, device.index, &stream) != 0) {
      throw nb::python_error();
    }
    return stream;
  }
  if (fns.current_stream == nullptr) {
    throw std::runtime_error("sdpa._C: torch's current_stream is not registered");
  }
  nb::object handle = nb::steal(PyObject_CallOneArg(fns.current_stream,
                                                    nb::int_(device.index).ptr()));
  if (!handle.is_valid()) throw nb::python_error();
  return reinterpret_cast<void*>(nb::cast<uintptr_t>(handle));
}

// Returns a library tensor as a torch tensor sharing its storage.
nb::object export_torch(Tensor tensor) {
  if (const DLPackExchangeAPI* exchange = torch_functions().exchange) {
    DLManagedTensorVersioned* managed = export_versioned(std::move(tensor));
    void* result = nullptr;
    // `managed` is the table's from here on: DLPack's import steals it.
    if (exchange->managed_tensor_to_py_object_no_sync(managed, &result) != 0) {
      throw nb::python_error();
    }
    return nb::steal(static_cast<PyObject*>(result));
  }
  nb::object capsule = legacy_capsule(std::move(tensor));
  PyObject* result = PyObject_CallOneArg(torch_functions().from_dlpack, capsule.ptr());
  if (result == nullptr) throw nb::python_error();
  return nb::steal(result);
}

// attn_mask: None, an sdpa._C.AttnBias (a built-in bias rebuilt from its spec) or a torch
// tensor, read through `holder`.
AttnMask import_torch_mask(nb::handle mask, std::optional<TorchInput>& holder) {
  if (mask.is_none() || nb::isinstance<AttnBias>(mask)) return import_mask(mask);
  holder.emplace(mask, "attn_mask");
  return AttnMask(holder->tensor());
}

// Every option but the mask, which needs a TorchInput that outlives the options.
SDPAOptions torch_options(double dropout_p, bool is_causal, std::optional<double> scale,
                          bool enable_gqa, Generator* generator,
                          std::optional<DropoutState> dropout_state) {
  SDPAOptions o;
  o.dropout_p = dropout_p;
  o.is_causal = is_causal;
  o.scale = scale;
  o.enable_gqa = enable_gqa;
  o.generator = generator;
  // torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp applies to torch callers.
  o.allow_fp16_bf16_reduction_math = torch_fns.reduction_allowed != nullptr &&
                                     is_true(PyObject_CallNoArgs(torch_fns.reduction_allowed));
  if (dropout_state) {
    o.dropout_state = PhiloxState{std::get<0>(*dropout_state), std::get<1>(*dropout_state)};
  }
  return o;
}

// Runs the forward on torch tensors. Returns out, or with `with_lse`
// (out, lse, backend, (seed, offset)).
nb::object forward(nb::handle query, nb::handle key, nb::handle value, nb::handle attn_mask,
                   SDPAOptions options, bool with_lse) {
  const TorchInput q(query, "query"), k(key, "key"), v(value, "value");
  std::optional<TorchInput> mask;
  options.attn_mask = import_torch_mask(attn_mask, mask);
  options.stream = torch_stream(q.tensor().device());
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = scaled_dot_product_attention_with_lse(q.tensor(), k.tensor(), v.tensor(), options);
  }
  nb::object out = export_torch(std::move(r.out));
  if (!with_lse) return out;
  return nb::make_tuple(out, export_torch(std::move(r.lse)), r.backend,
                        nb::make_tuple(r.philox.seed, r.philox.offset));
}

nb::object attention(nb::handle query, nb::handle key, nb::handle value, nb::handle attn_mask,
                     double dropout_p, bool is_causal, std::optional<double> scale,
                     bool enable_gqa, Generator* generator,
                     std::optional<DropoutState> dropout_state, bool with_lse) {
  return forward(query, key, value, attn_mask,
                 torch_options(dropout_p, is_causal, scale, enable_gqa, generator,
                               dropout_state),
                 with_lse);
}

// A Python number as float() reads it; false (and no error set) for anything else, which
// the caller hands to the general path to convert or reject.
bool number(nb::handle obj, double* value) {
  if (PyFloat_Check(obj.ptr())) {
    *value = PyFloat_AS_DOUBLE(obj.ptr());
    return true;
  }
  if (PyLong_Check(obj.ptr())) {
    *value = PyLong_AsDouble(obj.ptr());
    if (*value == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    return true;
  }
  return false;
}

// A Python truth value as bool() reads it; false (and no error set) when bool() raises.
bool truth(nb::handle obj, bool* value) {
  const int t = PyObject_IsTrue(obj.ptr());
  if (t < 0) {
    PyErr_Clear();
    return false;
  }
  *value = t != 0;
  return true;
}

// sdpa.torch.scaled_dot_product_attention's fast path: the user's arguments as given.
// Returns the result as `forward` does when the call runs directly (route kDirect,
// attn_mask None or a tensor, the arguments plain numbers and bools); None otherwise, and
// the caller takes the general path, which converts, rejects or records as before.
nb::object eager_attention(nb::handle query, nb::handle key,
                           nb::handle value, nb::handle attn_mask, nb::handle dropout_p,
                           nb::handle is_causal, nb::handle scale, nb::handle enable_gqa,
                           nb::handle generator, bool with_lse) {
  const TorchFunctions& fns = torch_functions();
  // A bias object (torch's CausalBias is a Tensor subclass) needs sdpa.torch._mask_args.
  if (!attn_mask.is_none() && Py_TYPE(attn_mask.ptr()) != fns.tensor_type) return nb::none();
  PyObject* const tensors[] = {query.ptr(), key.ptr(), value.ptr(), attn_mask.ptr()};
  if (query.is_none() || key.is_none() || value.is_none() ||
      route_of(tensors, 4) != kDirect) {
    return nb::none();
  }
  double p = 0.0;
  std::optional<double> s;
  bool causal = false, gqa = false;
  if (!number(dropout_p, &p) || !truth(is_causal, &causal) || !truth(enable_gqa, &gqa)) {
    return nb::none();
  }
  if (!scale.is_none()) {
    double value_of_scale = 0.0;
    if (!number(scale, &value_of_scale)) return nb::none();
    s = value_of_scale;
  }
  Generator* gen = nullptr;
  if (!generator.is_none() && !nb::try_cast<Generator*>(generator, gen)) return nb::none();
  return forward(query, key, value, attn_mask,
                 torch_options(p, causal, s, gqa, gen, std::nullopt), with_lse);
}

// Returns (grad_q, grad_k, grad_v, grad_attn_mask or None) as torch tensors.
nb::tuple attention_backward(nb::handle grad_out, nb::handle query, nb::handle key,
                             nb::handle value, nb::handle out, nb::handle lse,
                             nb::handle attn_mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa,
                             std::optional<DropoutState> dropout_state,
                             bool attn_mask_requires_grad) {
  const TorchInput g(grad_out, "grad_out"), q(query, "query"), k(key, "key"),
      v(value, "value"), o(out, "out"), l(lse, "lse");
  std::optional<TorchInput> mask;
  SDPAOptions options =
      torch_options(dropout_p, is_causal, scale, enable_gqa, nullptr, dropout_state);
  options.attn_mask = import_torch_mask(attn_mask, mask);
  options.attn_mask_requires_grad = attn_mask_requires_grad;
  options.stream = torch_stream(q.tensor().device());
  AttentionGradients r;
  {
    nb::gil_scoped_release release;
    r = scaled_dot_product_attention_backward(g.tensor(), q.tensor(), k.tensor(), v.tensor(),
                                              o.tensor(), l.tensor(), options);
  }
  nb::object grad_mask = r.grad_attn_mask.defined()
                             ? export_torch(std::move(r.grad_attn_mask)) : nb::none();
  return nb::make_tuple(export_torch(std::move(r.grad_q)), export_torch(std::move(r.grad_k)),
                        export_torch(std::move(r.grad_v)), grad_mask);
}

// A registered function: a new reference, or null for None.
PyObject* keep(nb::handle fn) { return fn.is_none() ? nullptr : fn.inc_ref().ptr(); }

// torch.Tensor.__dlpack_c_exchange_api__, or null when `capsule` is None or a table this
// build cannot read (another major version, or older than the table's first release).
const DLPackExchangeAPI* exchange_table(nb::handle capsule) {
  if (capsule.is_none() || !PyCapsule_IsValid(capsule.ptr(), kExchangeApiName)) return nullptr;
  const auto* api = static_cast<const DLPackExchangeAPI*>(
      PyCapsule_GetPointer(capsule.ptr(), kExchangeApiName));
  const DLPackVersion v = api->header.version;
  const bool readable = v.major == kDLPackMajor && v.minor >= 2 &&
                        api->dltensor_from_py_object_no_sync != nullptr &&
                        api->managed_tensor_to_py_object_no_sync != nullptr;
  return readable ? api : nullptr;
}

bool register_torch(nb::handle tensor_type, nb::handle to_dlpack, nb::handle from_dlpack,
                    nb::handle exchange_api, nb::handle is_functorch_wrapped,
                    nb::handle in_dispatch_mode, nb::handle in_function_mode,
                    nb::handle grad_enabled, nb::handle current_stream,
                    nb::handle reduction_allowed) {
  if (!PyType_Check(tensor_type.ptr())) throw nb::type_error("tensor_type: expected a type");
  // Re-registration (importlib.reload(sdpa.torch)) replaces the functions; the old ones
  // are kept alive, as a concurrent call may still hold them.
  torch_fns.tensor_type = reinterpret_cast<PyTypeObject*>(keep(tensor_type));
  torch_fns.to_dlpack = keep(to_dlpack);
  torch_fns.from_dlpack = keep(from_dlpack);
  torch_fns.exchange = exchange_table(exchange_api);
  if (torch_fns.exchange != nullptr) keep(exchange_api);  // the capsule owns the table
  torch_fns.is_functorch_wrapped = keep(is_functorch_wrapped);
  torch_fns.in_dispatch_mode = keep(in_dispatch_mode);
  torch_fns.in_function_mode = keep(in_function_mode);
  torch_fns.grad_enabled = keep(grad_enabled);
  torch_fns.current_stream = keep(current_stream);
  torch_fns.reduction_allowed = keep(reduction_allowed);
  if (torch_fns.is_cpu == nullptr) {
    torch_fns.is_cpu = PyUnicode_InternFromString("is_cpu");
    torch_fns.is_cuda = PyUnicode_InternFromString("is_cuda");
    torch_fns.requires_grad = PyUnicode_InternFromString("requires_grad");
  }
  return torch_fns.exchange != nullptr;
}

}  // namespace

void bind_torch(nb::module_& m) {
  m.def("register_torch", &register_torch, nb::arg("tensor_type"), nb::arg("to_dlpack"),
        nb::arg("from_dlpack"), nb::arg("exchange_api").none(),
        nb::arg("is_functorch_wrapped").none(),
        nb::arg("in_dispatch_mode").none(), nb::arg("in_function_mode").none(),
        nb::arg("grad_enabled"), nb::arg("current_stream"),
        nb::arg("reduction_allowed").none() = nb::none(),
        "Registers torch.Tensor, torch._C._to_dlpack, torch._C._from_dlpack, "
        "torch.Tensor.__dlpack_c_exchange_api__ (None: the two before are used), "
        "is_functorch_wrapped_tensor, is_in_torch_dispatch_mode, "
        "_is_torch_function_mode_enabled, is_grad_enabled and (device index) -> "
        "torch.cuda.current_stream(device).cuda_stream for the torch_* functions "
        "(a query None: every call takes the op), and "
        "torch._C._get_math_sdp_allow_fp16_bf16_reduction (None: treated as off). Called by "
        "sdpa.torch at import. Returns whether the exchange table is used.");
  m.def("torch_route",
        [](nb::tuple tensors) {
          return static_cast<int>(
              route_of(&PyTuple_GET_ITEM(tensors.ptr(), 0), tensors.size()));
        },
        nb::arg("tensors"),
        "Returns 0 (through the op), 1 (directly) or 2 (autograd without the op) for a call "
        "on these torch tensors (None skipped); the caller has checked that torch.compile "
        "is not tracing.");
  m.def("torch_attention", &attention, nb::arg("query"), nb::arg("key"), nb::arg("value"),
        nb::arg("attn_mask").none(), nb::arg("dropout_p"), nb::arg("is_causal"),
        nb::arg("scale").none(), nb::arg("enable_gqa"), nb::arg("generator").none(),
        nb::arg("dropout_state").none(), nb::arg("with_lse"),
        "attention() on torch tensors (attn_mask: None, a tensor or an AttnBias). Returns "
        "out, or with with_lse (out, lse, backend, (seed, offset)), as torch tensors.");
  // Every user argument may be anything, None included: what this path cannot take goes
  // to the general path, which converts or rejects it with its own errors.
  m.def("torch_eager_attention", &eager_attention, nb::arg("query").none(), nb::arg("key").none(), nb::arg("value").none(),
        nb::arg("attn_mask").none(), nb::arg("dropout_p").none(), nb::arg("is_causal").none(),
        nb::arg("scale").none(), nb::arg("enable_gqa").none(), nb::arg("generator").none(),
        nb::arg("with_lse"),
        "torch_attention for a call that runs directly (torch_route 1, attn_mask None or a "
        "tensor, plain numbers and bools); None for any other call.");
  m.def("torch_attention_backward", &attention_backward, nb::arg("grad_out"),
        nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("out"), nb::arg("lse"),
        nb::arg("attn_mask").none(), nb::arg("dropout_p"), nb::arg("is_causal"),
        nb::arg("scale").none(), nb::arg("enable_gqa"), nb::arg("dropout_state").none(),
        nb::arg("attn_mask_requires_grad"),
        "attention_backward() on torch tensors: (grad_q, grad_k, grad_v, grad_attn_mask or "
        "None) as torch tensors.");
}

}  // namespace sdpa::python
