// Forward, backward and explain. Inputs are imported zero-copy; compute runs with the GIL
// released (a Python bias's materialize() takes it back for itself).

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"

namespace sdpa::python {
namespace {

using DropoutState = std::tuple<uint64_t, uint64_t>;
// (q_offset, kv_offset, q_len, kv_len): DropoutPosition.
using Position = std::tuple<int64_t, int64_t, int64_t, int64_t>;

SDPAOptions make_options(nb::handle attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa, Generator* generator,
                         std::optional<DropoutState> dropout_state,
                         std::optional<Position> dropout_position = std::nullopt) {
  SDPAOptions o;
  o.attn_mask = import_mask(attn_mask);
  o.dropout_p = dropout_p;
  o.is_causal = is_causal;
  o.scale = scale;
  o.enable_gqa = enable_gqa;
  o.generator = generator;
  if (dropout_state) o.dropout_state = PhiloxState{std::get<0>(*dropout_state), std::get<1>(*dropout_state)};
  if (dropout_position) {
    const auto& [q_offset, kv_offset, q_len, kv_len] = *dropout_position;
    o.dropout_position = DropoutPosition{q_offset, kv_offset, q_len, kv_len};
  }
  return o;
}

// Returns (out, lse, backend, (seed, offset)).
nb::tuple attention(nb::handle query, nb::handle key, nb::handle value, nb::handle attn_mask,
                    double dropout_p, bool is_causal, std::optional<double> scale,
                    bool enable_gqa, Generator* generator,
                    std::optional<DropoutState> dropout_state, uintptr_t stream,
                    std::optional<Position> dropout_position) {
  const Tensor q = import_array(query, "query", stream);
  const Tensor k = import_array(key, "key", stream);
  const Tensor v = import_array(value, "value", stream);
  SDPAOptions options = make_options(attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                     generator, dropout_state, dropout_position);
  options.stream = reinterpret_cast<void*>(stream);
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = scaled_dot_product_attention_with_lse(q, k, v, options);
  }
  return nb::make_tuple(export_tensor(std::move(r.out), stream),
                        export_tensor(std::move(r.lse), stream),
                        r.backend, nb::make_tuple(r.philox.seed, r.philox.offset));
}

// Returns (grad_q, grad_k, grad_v, grad_attn_mask or None, backend).
nb::tuple attention_backward(nb::handle grad_out, nb::handle query, nb::handle key,
                             nb::handle value, nb::handle out, nb::handle lse,
                             nb::handle attn_mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa,
                             std::optional<DropoutState> dropout_state,
                             bool attn_mask_requires_grad, uintptr_t stream,
                             std::optional<Position> dropout_position) {
  const Tensor g = import_array(grad_out, "grad_out", stream);
  const Tensor q = import_array(query, "query", stream);
  const Tensor k = import_array(key, "key", stream);
  const Tensor v = import_array(value, "value", stream);
  const Tensor o = import_array(out, "out", stream);
  const Tensor l = import_array(lse, "lse", stream);
  SDPAOptions options = make_options(attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                     nullptr, dropout_state, dropout_position);
  options.attn_mask_requires_grad = attn_mask_requires_grad;
  options.stream = reinterpret_cast<void*>(stream);
  AttentionGradients r;
  {
    nb::gil_scoped_release release;
    r = scaled_dot_product_attention_backward(g, q, k, v, o, l, options);
  }
  nb::object grad_mask = r.grad_attn_mask.defined()
                             ? export_tensor(std::move(r.grad_attn_mask), stream) : nb::none();
  return nb::make_tuple(export_tensor(std::move(r.grad_q), stream),
                        export_tensor(std::move(r.grad_k), stream),
                        export_tensor(std::move(r.grad_v), stream), grad_mask, r.backend);
}

// A contiguous tensor that is never read. Off the CPU it owns no memory: explaining a
// CUDA call allocates nothing on the device (and needs no device at all).
Tensor placeholder(const Shape& shape, DType dtype, Device device) {
  if (device.type == DeviceType::kCPU) return Tensor::zeros(shape, dtype);
  return Tensor::from_blob(nullptr, shape, contiguous_strides(shape), dtype, device);
}

Explanation explain_call(nb::handle query, nb::handle key, nb::handle value,
                         nb::handle attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa, bool backward) {
  const Tensor q = import_array(query, "query");
  const Tensor k = import_array(key, "key");
  const Tensor v = import_array(value, "value");
  // A fixed dropout state, so explaining never advances the default generator.
  SDPAOptions options = make_options(attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                     nullptr, DropoutState{0, 0});
  nb::gil_scoped_release release;
  if (!backward) return explain(make_params(q, k, v, options));
  // Placeholder out / grad_out / lse of the right shapes on the query's device: the
  // checks read only shapes, dtypes, strides and devices.
  SDPA_CHECK(q.dim() >= 1 && v.dim() >= 1, "query: expected a 3-D or 4-D tensor, got ",
             q.dim(), "-D");
  Shape out_shape = q.sizes();
  out_shape.back() = v.sizes().back();
  Shape lse_shape = q.sizes();
  lse_shape.pop_back();
  const Tensor o = placeholder(out_shape, q.dtype(), q.device());
  const Tensor l = placeholder(lse_shape, DType::kFloat32, q.device());
  return explain(make_backward_params(o, q, k, v, o, l, options));
}

}  // namespace

void bind_attention(nb::module_& m) {
  nb::class_<BackendVerdict>(m, "BackendVerdict", "One backend's verdict on a call.")
      .def_ro("backend", &BackendVerdict::backend)
      .def_ro("allowed", &BackendVerdict::allowed)
      .def_ro("supported", &BackendVerdict::supported)
      .def_ro("reasons", &BackendVerdict::reasons)
      .def_ro("bias_handling", &BackendVerdict::bias_handling)
      .def("__repr__", [](const BackendVerdict& v) {
        return "BackendVerdict(" + std::string(backend_name(v.backend)) +
               ", allowed=" + (v.allowed ? "True" : "False") +
               ", supported=" + (v.supported ? "True" : "False") + ")";
      });
  nb::class_<Explanation>(m, "Explanation",
                          "The backend a call would use and every backend's verdict, in "
                          "priority order. str() gives the text `sdpa explain` prints.")
      .def_ro("chosen", &Explanation::chosen)
      .def_ro("verdicts", &Explanation::verdicts)
      .def_ro("flex", &Explanation::flex)
      .def("to_string", &Explanation::to_string)
      .def("__str__", &Explanation::to_string)
      .def("__repr__", [](const Explanation& e) {
        return "<sdpa Explanation: chosen " + std::string(backend_name(e.chosen)) + ">";
      });

  m.def("attention", &attention, nb::arg("query"), nb::arg("key"), nb::arg("value"),
        nb::arg("attn_mask").none() = nb::none(), nb::arg("dropout_p") = 0.0,
        nb::arg("is_causal") = false, nb::arg("scale").none() = nb::none(),
        nb::arg("enable_gqa") = false, nb::arg("generator").none() = nb::none(),
        nb::arg("dropout_state").none() = nb::none(), nb::arg("stream") = 0,
        nb::arg("dropout_position").none() = nb::none(),
        "Returns (out, lse, backend, (seed, offset)). stream: the cudaStream_t a CUDA call "
        "runs on (0: the legacy default stream); CPU calls ignore it. dropout_position: "
        "(q_offset, kv_offset, q_len, kv_len) of the whole call whose dropout mask this "
        "block draws (sdpa::DropoutPosition).");
  m.def("attention_backward", &attention_backward, nb::arg("grad_out"), nb::arg("query"),
        nb::arg("key"), nb::arg("value"), nb::arg("out"), nb::arg("lse"),
        nb::arg("attn_mask").none() = nb::none(), nb::arg("dropout_p") = 0.0,
        nb::arg("is_causal") = false, nb::arg("scale").none() = nb::none(),
        nb::arg("enable_gqa") = false, nb::arg("dropout_state").none() = nb::none(),
        nb::arg("attn_mask_requires_grad") = false, nb::arg("stream") = 0,
        nb::arg("dropout_position").none() = nb::none(),
        "Returns (grad_q, grad_k, grad_v, grad_attn_mask or None, backend). stream and "
        "dropout_position: as attention's.");
  m.def("explain", &explain_call, nb::arg("query"), nb::arg("key"), nb::arg("value"),
        nb::arg("attn_mask").none() = nb::none(), nb::arg("dropout_p") = 0.0,
        nb::arg("is_causal") = false, nb::arg("scale").none() = nb::none(),
        nb::arg("enable_gqa") = false, nb::arg("backward") = false);
}

}  // namespace sdpa::python
