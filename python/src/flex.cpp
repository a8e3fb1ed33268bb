// Flex attention: traced expressions (the Python tracer in sdpa/flex builds them through
// these functions), programs, BlockMask, flex_attention and its backward.

#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "sdpa/flex_attention.h"

namespace sdpa::python {
namespace {

using flex::Expr;
using flex::Program;

SDPAOptions flex_options(std::optional<double> scale, bool enable_gqa) {
  SDPAOptions o;
  o.scale = scale;
  o.enable_gqa = enable_gqa;
  return o;
}

// Returns (out, lse, backend).
nb::tuple flex_forward(nb::handle query, nb::handle key, nb::handle value,
                       const std::optional<Program>& score_mod, const flex::BlockMask* block_mask,
                       std::optional<double> scale, bool enable_gqa, uintptr_t stream) {
  const Tensor q = import_array(query, "query", stream);
  const Tensor k = import_array(key, "key", stream);
  const Tensor v = import_array(value, "value", stream);
  SDPAOptions options = flex_options(scale, enable_gqa);
  options.stream = reinterpret_cast<void*>(stream);
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = flex_attention(q, k, v, score_mod, block_mask, options);
  }
  return nb::make_tuple(export_tensor(std::move(r.out), stream),
                        export_tensor(std::move(r.lse), stream), r.backend);
}

// Returns max_scores [B, Hq, L] float32.
nb::object flex_max_scores(nb::handle query, nb::handle key, nb::handle value,
                           const std::optional<Program>& score_mod,
                           const flex::BlockMask* block_mask, std::optional<double> scale,
                           bool enable_gqa) {
  const Tensor q = import_array(query, "query");
  const Tensor k = import_array(key, "key");
  const Tensor v = import_array(value, "value");
  Tensor max_scores;
  {
    nb::gil_scoped_release release;
    max_scores = flex_attention_max_scores(q, k, v, score_mod, block_mask,
                                           flex_options(scale, enable_gqa));
  }
  return export_tensor(std::move(max_scores));
}

// Returns (grad_q, grad_k, grad_v, [grad of each captured tensor or None]).
nb::tuple flex_backward(nb::handle grad_out, nb::handle query, nb::handle key, nb::handle value,
                        nb::handle out, nb::handle lse, const std::optional<Program>& score_mod,
                        const flex::BlockMask* block_mask, std::optional<double> scale,
                        bool enable_gqa, uintptr_t stream) {
  const Tensor g = import_array(grad_out, "grad_out", stream);
  const Tensor q = import_array(query, "query", stream);
  const Tensor k = import_array(key, "key", stream);
  const Tensor v = import_array(value, "value", stream);
  const Tensor o = import_array(out, "out", stream);
  const Tensor l = import_array(lse, "lse", stream);
  SDPAOptions options = flex_options(scale, enable_gqa);
  options.stream = reinterpret_cast<void*>(stream);
  AttentionGradients r;
  {
    nb::gil_scoped_release release;
    r = flex_attention_backward(g, q, k, v, o, l, score_mod, block_mask, options);
  }
  nb::list captured;
  for (Tensor& t : r.grad_captured) {
    captured.append(t.defined() ? export_tensor(std::move(t), stream) : nb::none());
  }
  return nb::make_tuple(export_tensor(std::move(r.grad_q), stream),
                        export_tensor(std::move(r.grad_k), stream),
                        export_tensor(std::move(r.grad_v), stream), captured);
}

}  // namespace

void bind_flex(nb::module_& m) {
  nb::class_<Expr>(m, "Expr", "A traced flex expression (built by sdpa.flex's tracer).")
      .def_prop_ro("type", [](const Expr& e) {
        switch (e.type()) {
          case flex::ValueType::kFloat: return "float";
          case flex::ValueType::kInt: return "int";
          case flex::ValueType::kBool: return "bool";
        }
        return "?";
      });
  m.def("expr_float", [](double x) { return Expr(x); });
  m.def("expr_int", [](int64_t x) { return Expr(x); });
  m.def("expr_bool", [](bool x) { return Expr(x); });
  using Binary = Expr (*)(const Expr&, const Expr&);
  const std::pair<const char*, Binary> binary[] = {
      {"add", [](const Expr& a, const Expr& b) { return a + b; }},
      {"sub", [](const Expr& a, const Expr& b) { return a - b; }},
      {"mul", [](const Expr& a, const Expr& b) { return a * b; }},
      {"truediv", [](const Expr& a, const Expr& b) { return a / b; }},
      {"mod", [](const Expr& a, const Expr& b) { return a % b; }},
      {"floordiv", [](const Expr& a, const Expr& b) { return flex::floor_div(a, b); }},
      {"lt", [](const Expr& a, const Expr& b) { return a < b; }},
      {"le", [](const Expr& a, const Expr& b) { return a <= b; }},
      {"gt", [](const Expr& a, const Expr& b) { return a > b; }},
      {"ge", [](const Expr& a, const Expr& b) { return a >= b; }},
      {"eq", [](const Expr& a, const Expr& b) { return a == b; }},
      {"ne", [](const Expr& a, const Expr& b) { return a != b; }},
      {"and_", [](const Expr& a, const Expr& b) { return a & b; }},
      {"or_", [](const Expr& a, const Expr& b) { return a | b; }},
      {"xor", [](const Expr& a, const Expr& b) { return a ^ b; }},
      {"lshift", [](const Expr& a, const Expr& b) { return a << b; }},
      {"rshift", [](const Expr& a, const Expr& b) { return a >> b; }},
      {"minimum", [](const Expr& a, const Expr& b) { return flex::minimum(a, b); }},
      {"maximum", [](const Expr& a, const Expr& b) { return flex::maximum(a, b); }},
  };
  for (const auto& [name, fn] : binary) m.def(name, fn);
  using Unary = Expr (*)(const Expr&);
  const std::pair<const char*, Unary> unary[] = {
      {"neg", [](const Expr& a) { return -a; }},
      {"not_", [](const Expr& a) { return ~a; }},
      {"abs", [](const Expr& a) { return flex::abs(a); }},
      {"exp", [](const Expr& a) { return flex::exp(a); }},
      {"log", [](const Expr& a) { return flex::log(a); }},
      {"tanh", [](const Expr& a) { return flex::tanh(a); }},
      {"sigmoid", [](const Expr& a) { return flex::sigmoid(a); }},
      {"sqrt", [](const Expr& a) { return flex::sqrt(a); }},
      {"sin", [](const Expr& a) { return flex::sin(a); }},
      {"cos", [](const Expr& a) { return flex::cos(a); }},
      {"floor", [](const Expr& a) { return flex::floor(a); }},
      {"ceil", [](const Expr& a) { return flex::ceil(a); }},
      {"to_float", [](const Expr& a) { return flex::to_float(a); }},
  };
  for (const auto& [name, fn] : unary) m.def(name, fn);
  m.def("where", &flex::where);

  nb::class_<flex::Captured>(m, "Captured", "A tensor a flex program reads.")
      .def("__init__",
           [](flex::Captured* self, std::string name, nb::handle array, bool requires_grad) {
             new (self) flex::Captured(std::move(name), import_array(array, "captured tensor"),
                                       requires_grad);
           },
           nb::arg("name"), nb::arg("array"), nb::arg("requires_grad") = false)
      .def("read", [](const flex::Captured& c, const std::vector<Expr>& index) { return c(index); })
      .def_prop_ro("name", &flex::Captured::name)
      .def_prop_ro("ndim", [](const flex::Captured& c) { return c.tensor().dim(); })
      .def_prop_ro("requires_grad", &flex::Captured::requires_grad);

  nb::class_<Program>(m, "Program", "A traced, compiled score_mod or mask_mod.")
      .def_static("from_score_mod", [](const flex::ScoreMod& mod) { return Program::from_score_mod(mod); })
      .def_static("from_mask_mod", [](const flex::MaskMod& mod) { return Program::from_mask_mod(mod); })
      .def_prop_ro("is_mask", &Program::is_mask)
      .def_prop_ro("uses_score", &Program::uses_score)
      .def_prop_ro("captured_names", [](const Program& p) {
        std::vector<std::string> names;
        for (const flex::Captured& c : p.captured()) names.push_back(c.name());
        return names;
      })
      .def("evaluate", &Program::evaluate)
      .def("__str__", &Program::to_string);

  nb::class_<flex::BlockMask>(m, "BlockMask", "FlexAttention's BlockMask.")
      .def_ro("batch", &flex::BlockMask::batch)
      .def_ro("num_heads", &flex::BlockMask::num_heads)
      .def_ro("q_len", &flex::BlockMask::q_len)
      .def_ro("kv_len", &flex::BlockMask::kv_len)
      .def_ro("q_block_size", &flex::BlockMask::q_block_size)
      .def_ro("kv_block_size", &flex::BlockMask::kv_block_size)
      .def_prop_ro("num_q_blocks", &flex::BlockMask::num_q_blocks)
      .def_prop_ro("num_kv_blocks", &flex::BlockMask::num_kv_blocks)
      .def_prop_ro("kv_num_blocks", [](const flex::BlockMask& b) { return export_tensor(b.kv_num_blocks); })
      .def_prop_ro("kv_indices", [](const flex::BlockMask& b) { return export_tensor(b.kv_indices); })
      .def_prop_ro("full_kv_num_blocks", [](const flex::BlockMask& b) { return export_tensor(b.full_kv_num_blocks); })
      .def_prop_ro("full_kv_indices", [](const flex::BlockMask& b) { return export_tensor(b.full_kv_indices); })
      .def_prop_ro("q_num_blocks", [](const flex::BlockMask& b) { return export_tensor(b.q_num_blocks); })
      .def_prop_ro("q_indices", [](const flex::BlockMask& b) { return export_tensor(b.q_indices); })
      .def_prop_ro("full_q_num_blocks", [](const flex::BlockMask& b) { return export_tensor(b.full_q_num_blocks); })
      .def_prop_ro("full_q_indices", [](const flex::BlockMask& b) { return export_tensor(b.full_q_indices); })
      .def("density", &flex::BlockMask::density)
      .def("to_string", &flex::BlockMask::to_string, nb::arg("b") = 0, nb::arg("h") = 0,
           nb::arg("max_size") = 64);

  m.def("create_block_mask",
        [](const Program& mask_mod, int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
           int64_t q_block_size, int64_t kv_block_size) {
          nb::gil_scoped_release release;
          return flex::create_block_mask(mask_mod, batch, heads, q_len, kv_len, q_block_size,
                                         kv_block_size);
        });
  m.def(
      "block_mask_from_kv_blocks",
      [](nb::handle num, nb::handle indices, nb::handle full_num, nb::handle full_indices,
         int64_t q_len, int64_t kv_len, int64_t q_block_size, int64_t kv_block_size,
         std::optional<Program> mask_mod) {
        flex::KvBlocks blocks{import_array(num, "kv_num_blocks"),
                              import_array(indices, "kv_indices"), Tensor(), Tensor()};
        if (!full_num.is_none()) blocks.full_num = import_array(full_num, "full_kv_num_blocks");
        if (!full_indices.is_none()) {
          blocks.full_indices = import_array(full_indices, "full_kv_indices");
        }
        nb::gil_scoped_release release;
        return flex::block_mask_from_kv_blocks(blocks, q_len, kv_len, q_block_size,
                                               kv_block_size, std::move(mask_mod));
      },
      nb::arg("kv_num_blocks"), nb::arg("kv_indices"), nb::arg("full_kv_num_blocks").none(),
      nb::arg("full_kv_indices").none(), nb::arg("q_len"), nb::arg("kv_len"),
      nb::arg("q_block_size"), nb::arg("kv_block_size"), nb::arg("mask_mod").none());
  // stream: the cudaStream_t CUDA inputs are read and the outputs written on (0: the
  // legacy default stream); CPU inputs ignore it.
  m.def("flex_attention", &flex_forward, nb::arg("query"), nb::arg("key"), nb::arg("value"),
        nb::arg("score_mod").none(), nb::arg("block_mask").none(), nb::arg("scale").none(),
        nb::arg("enable_gqa"), nb::arg("stream") = 0);
  m.def("flex_max_scores", &flex_max_scores, nb::arg("query"), nb::arg("key"),
        nb::arg("value"), nb::arg("score_mod").none(), nb::arg("block_mask").none(),
        nb::arg("scale").none(), nb::arg("enable_gqa"));
  m.def("flex_attention_backward", &flex_backward, nb::arg("grad_out"), nb::arg("query"),
        nb::arg("key"), nb::arg("value"), nb::arg("out"), nb::arg("lse"),
        nb::arg("score_mod").none(), nb::arg("block_mask").none(), nb::arg("scale").none(),
        nb::arg("enable_gqa"), nb::arg("stream") = 0);
}

}  // namespace sdpa::python
