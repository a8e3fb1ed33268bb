// Attention biases: the built-in AttnBias kinds (created through factory functions that
// sdpa/attention/bias.py wraps) and PythonBias, which lets a Python object that implements
// materialize(shape, dtype) act as an AttnBias (it runs everywhere through the dense path).

#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"

namespace sdpa::python {
namespace {

using BiasPtr = std::shared_ptr<AttnBias>;

// A const bias from the library, held by Python as the (non-const) bound type. Biases are
// immutable after construction, so dropping const never enables a mutation.
template <typename B>
BiasPtr hold(std::shared_ptr<B> bias) {
  return std::const_pointer_cast<AttnBias>(std::static_pointer_cast<const AttnBias>(bias));
}

// Adapts a Python object with materialize(shape, dtype) -> array (and optionally
// describe() -> str) to AttnBias. Called from attention calls that run without the GIL,
// so every entry takes it.
class PythonBias final : public AttnBias {
 public:
  explicit PythonBias(nb::object obj) : obj_(std::move(obj)) {}
  ~PythonBias() override {
    if (!Py_IsInitialized()) {
      obj_.release();  // The interpreter is gone; leak rather than touch it.
      return;
    }
    nb::gil_scoped_acquire gil;
    obj_.reset();
  }

  Tensor materialize(const BiasShape& shape, DType dtype) const override {
    nb::gil_scoped_acquire gil;
    nb::object result = obj_.attr("materialize")(
        nb::make_tuple(shape.batch, shape.num_heads_q, shape.q_len, shape.kv_len),
        std::string(dtype_name(dtype)));
    return import_array(result, "attn_mask (the result of materialize())");
  }

  std::string describe() const override {
    nb::gil_scoped_acquire gil;
    if (nb::hasattr(obj_, "describe")) return nb::cast<std::string>(nb::str(obj_.attr("describe")()));
    return nb::cast<std::string>(nb::handle(Py_TYPE(obj_.ptr())).attr("__qualname__"));
  }

 private:
  nb::object obj_;
};

BiasShape to_bias_shape(const std::vector<int64_t>& shape) {
  SDPA_CHECK(shape.size() == 4, "shape: expected (batch, num_heads_q, q_len, kv_len), got ",
             shape.size(), " sizes");
  return BiasShape{shape[0], shape[1], shape[2], shape[3]};
}

}  // namespace

AttnMask import_mask(nb::handle obj) {
  if (obj.is_none()) return {};
  if (nb::isinstance<AttnBias>(obj)) {
    return AttnMask(std::static_pointer_cast<const AttnBias>(nb::cast<BiasPtr>(obj)));
  }
  return AttnMask(import_array(obj, "attn_mask"));
}

void bind_bias(nb::module_& m) {
  nb::enum_<CausalVariant>(m, "CausalVariant",
                           "PyTorch's torch.nn.attention.bias.CausalVariant (same values).")
      .value("UPPER_LEFT", CausalVariant::UPPER_LEFT)
      .value("LOWER_RIGHT", CausalVariant::LOWER_RIGHT);
  nb::enum_<DiagonalAlignment>(m, "DiagonalAlignment",
                               "Where a band's diagonal sits when q_len != kv_len.")
      .value("TOP_LEFT", DiagonalAlignment::kTopLeft)
      .value("BOTTOM_RIGHT", DiagonalAlignment::kBottomRight);

  nb::class_<AttnBias>(m, "AttnBias", "A native attention bias (see sdpa.attention.bias).")
      .def("materialize",
           [](const AttnBias& b, const std::vector<int64_t>& shape, std::string_view dtype) {
             return b.materialize(to_bias_shape(shape), parse_dtype(dtype));
           },
           nb::arg("shape"), nb::arg("dtype") = "float32",
           "Returns the dense equivalent broadcastable to shape (B, Hq, L, S): bool (True = "
           "take part) or additive float of `dtype`.")
      .def("describe", &AttnBias::describe)
      .def_prop_ro("needs_materialization", &AttnBias::needs_materialization)
      .def("__repr__", [](const AttnBias& b) { return "<sdpa AttnBias: " + b.describe() + ">"; });

  m.def("causal_bias", [](CausalVariant variant, int64_t q_len, int64_t kv_len) {
    return hold(std::make_shared<CausalBias>(variant, q_len, kv_len));
  }, nb::arg("variant"), nb::arg("q_len"), nb::arg("kv_len"));
  m.def("local_attention_bias",
        [](std::optional<int64_t> left, std::optional<int64_t> right, DiagonalAlignment a) {
          return hold(std::make_shared<LocalAttentionBias>(left, right, a));
        }, nb::arg("left").none(), nb::arg("right").none(), nb::arg("alignment"));
  m.def("alibi_bias_heads", [](int64_t num_heads, DiagonalAlignment a) {
    return hold(std::make_shared<AlibiBias>(num_heads, a));
  }, nb::arg("num_heads"), nb::arg("alignment"));
  m.def("alibi_bias_slopes", [](std::vector<float> slopes, DiagonalAlignment a) {
    return hold(std::make_shared<AlibiBias>(std::move(slopes), a));
  }, nb::arg("slopes"), nb::arg("alignment"));
  m.def("alibi_slopes", &alibi_slopes, nb::arg("num_heads"));
  m.def("alibi_bias_slopes_of", [](const AttnBias& b) {
    const auto* alibi = dynamic_cast<const AlibiBias*>(&b);
    SDPA_CHECK(alibi != nullptr, "bias: expected an AlibiBias, got ", b.describe());
    return alibi->slopes();
  });
  m.def("block_diagonal_bias",
        [](std::vector<int64_t> cu_q, std::vector<int64_t> cu_kv, bool causal,
           DiagonalAlignment a) {
          return hold(std::make_shared<BlockDiagonalBias>(std::move(cu_q), std::move(cu_kv),
                                                          causal, a));
        }, nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_kv"), nb::arg("causal"),
        nb::arg("alignment"));
  m.def("padded_keys_bias", [](std::vector<int64_t> kv_lengths, bool causal) {
    return hold(std::make_shared<PaddedKeysBias>(std::move(kv_lengths), causal));
  }, nb::arg("kv_lengths"), nb::arg("causal"));
  m.def("compose", [](const std::vector<BiasPtr>& parts) {
    std::vector<AttnBiasPtr> const_parts(parts.begin(), parts.end());
    return hold(compose(std::move(const_parts)));
  }, nb::arg("parts"));
  m.def("tensor_bias", [](nb::handle array) {
    return hold(std::make_shared<TensorBias>(import_array(array, "attn_mask")));
  }, nb::arg("mask"));
  m.def("python_bias", [](nb::object obj) -> BiasPtr {
    if (!nb::hasattr(obj, "materialize")) {
      throw nb::type_error("attn_mask: expected an object with materialize(shape, dtype)");
    }
    return std::make_shared<PythonBias>(std::move(obj));
  }, nb::arg("bias"),
     "Wraps a Python object with materialize(shape, dtype) -> array as an AttnBias.");
}

}  // namespace sdpa::python
