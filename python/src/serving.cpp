// Serving entry points: attention through a KV cache (written in place), packed varlen
// attention with its backward, and the merge of partial attention states.

#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>

#include "bindings.h"
#include "sdpa/kv_cache.h"
#include "sdpa/registry.h"
#include "sdpa/varlen.h"

namespace sdpa::python {
namespace {

// An optional array argument: None stays an undefined Tensor.
Tensor optional_array(nb::handle obj, const char* arg) {
  return obj.is_none() ? Tensor() : import_array(obj, arg);
}

// A float8 cache's scale: None, a number (a float32 scalar) or an array [] / [Hkv].
Tensor optional_scale(nb::handle obj, const char* arg) {
  if (nb::isinstance<nb::float_>(obj) || nb::isinstance<nb::int_>(obj)) {
    return Tensor::full({}, nb::cast<double>(obj), DType::kFloat32);
  }
  return optional_array(obj, arg);
}

void append_paged(nb::handle k_new, nb::handle v_new, nb::handle k_cache, nb::handle v_cache,
                  nb::handle block_table, nb::handle positions, nb::handle k_scale,
                  nb::handle v_scale) {
  const Tensor kn = import_array(k_new, "k_new"), vn = import_array(v_new, "v_new");
  const Tensor kc = import_array(k_cache, "k_cache"), vc = import_array(v_cache, "v_cache");
  const Tensor table = import_array(block_table, "block_table");
  const Tensor at = import_array(positions, "positions");
  const Tensor ks = optional_scale(k_scale, "k_scale"), vs = optional_scale(v_scale, "v_scale");
  nb::gil_scoped_release release;
  append_paged_kv_cache(kn, vn, kc, vc, table, at, ks, vs);
}

// The per-sequence options of the serving calls.
SequenceOptions sequence_options(bool causal, int64_t window_left, int64_t window_right,
                                 std::vector<float> alibi_slopes, double softcap,
                                 std::optional<double> scale) {
  SequenceOptions o;
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.alibi_slopes = std::move(alibi_slopes);
  o.softcap = softcap;
  o.scale = scale;
  return o;
}

// Returns (out, lse, backend).
nb::tuple attention_with_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache,
                                 nb::handle cache_seqlens, nb::handle k_new, nb::handle v_new,
                                 nb::handle rotary_cos, nb::handle rotary_sin,
                                 bool rotary_interleaved, bool causal, int64_t window_left,
                                 int64_t window_right, std::vector<float> alibi_slopes,
                                 double softcap, std::optional<double> scale,
                                 nb::handle block_table, nb::handle k_scale,
                                 nb::handle v_scale) {
  const Tensor query = import_array(q, "q");
  const Tensor keys = import_array(k_cache, "k_cache");
  const Tensor values = import_array(v_cache, "v_cache");
  const Tensor seqlens = import_array(cache_seqlens, "cache_seqlens");
  KvCacheOptions o;
  o.k_new = optional_array(k_new, "k_new");
  o.v_new = optional_array(v_new, "v_new");
  o.rotary_cos = optional_array(rotary_cos, "rotary_cos");
  o.rotary_sin = optional_array(rotary_sin, "rotary_sin");
  o.rotary_interleaved = rotary_interleaved;
  o.block_table = optional_array(block_table, "block_table");
  o.k_scale = optional_scale(k_scale, "k_scale");
  o.v_scale = optional_scale(v_scale, "v_scale");
  static_cast<SequenceOptions&>(o) = sequence_options(causal, window_left, window_right,
                                                      std::move(alibi_slopes), softcap, scale);
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = sdpa::attention_with_kvcache(query, keys, values, seqlens, o);
  }
  return nb::make_tuple(export_tensor(std::move(r.out)), export_tensor(std::move(r.lse)),
                        r.backend);
}

// (seed, offset) of a dropout state, as the attention bindings pass it.
using DropoutState = std::tuple<uint64_t, uint64_t>;

// The per-sequence options with attention_varlen's dropout.
SequenceOptions with_dropout(SequenceOptions o, double dropout_p,
                             const std::optional<DropoutState>& state) {
  o.dropout_p = dropout_p;
  if (state) o.dropout_state = PhiloxState{std::get<0>(*state), std::get<1>(*state)};
  return o;
}

// Returns (out, lse, backend, (seed, offset) of the dropout state used).
nb::tuple attention_varlen(nb::handle q, nb::handle k, nb::handle v, nb::handle cu_seqlens_q,
                           nb::handle cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                           bool causal, int64_t window_left, int64_t window_right,
                           std::vector<float> alibi_slopes, double softcap,
                           std::optional<double> scale, nb::handle block_table, double dropout_p,
                           std::optional<DropoutState> dropout_state) {
  const Tensor query = import_array(q, "q"), keys = import_array(k, "k"),
               values = import_array(v, "v");
  const Tensor cu_q = import_array(cu_seqlens_q, "cu_seqlens_q"),
               cu_k = import_array(cu_seqlens_k, "cu_seqlens_k");
  const Tensor table = optional_array(block_table, "block_table");
  const SequenceOptions o = with_dropout(
      sequence_options(causal, window_left, window_right, std::move(alibi_slopes), softcap,
                       scale),
      dropout_p, dropout_state);
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = table.defined() ? sdpa::attention_varlen_paged(query, keys, values, cu_q, cu_k, table,
                                                       max_seqlen_q, max_seqlen_k, o)
                        : sdpa::attention_varlen(query, keys, values, cu_q, cu_k, max_seqlen_q,
                                                 max_seqlen_k, o);
  }
  return nb::make_tuple(export_tensor(std::move(r.out)), export_tensor(std::move(r.lse)),
                        r.backend, nb::make_tuple(r.philox.seed, r.philox.offset));
}

// Returns (grad_q, grad_k, grad_v).
nb::tuple attention_varlen_backward(nb::handle grad_out, nb::handle q, nb::handle k,
                                    nb::handle v, nb::handle out, nb::handle lse,
                                    nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
                                    int64_t max_seqlen_q, int64_t max_seqlen_k, bool causal,
                                    int64_t window_left, int64_t window_right,
                                    std::vector<float> alibi_slopes, double softcap,
                                    std::optional<double> scale, double dropout_p,
                                    std::optional<DropoutState> dropout_state) {
  const Tensor g = import_array(grad_out, "grad_out"), query = import_array(q, "q"),
               keys = import_array(k, "k"), values = import_array(v, "v"),
               o_in = import_array(out, "out"), l_in = import_array(lse, "lse");
  const Tensor cu_q = import_array(cu_seqlens_q, "cu_seqlens_q"),
               cu_k = import_array(cu_seqlens_k, "cu_seqlens_k");
  const SequenceOptions o = with_dropout(
      sequence_options(causal, window_left, window_right, std::move(alibi_slopes), softcap,
                       scale),
      dropout_p, dropout_state);
  AttentionGradients r;
  {
    nb::gil_scoped_release release;
    r = sdpa::attention_varlen_backward(g, query, keys, values, o_in, l_in, cu_q, cu_k,
                                        max_seqlen_q, max_seqlen_k, o);
  }
  return nb::make_tuple(export_tensor(std::move(r.grad_q)), export_tensor(std::move(r.grad_k)),
                        export_tensor(std::move(r.grad_v)));
}

// Returns (out, lse).
nb::tuple merge_states(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b) {
  const Tensor oa = import_array(out_a, "out_a"), la = import_array(lse_a, "lse_a");
  const Tensor ob = import_array(out_b, "out_b"), lb = import_array(lse_b, "lse_b");
  AttentionState s;
  {
    nb::gil_scoped_release release;
    s = merge_attention_states(oa, la, ob, lb);
  }
  return nb::make_tuple(export_tensor(std::move(s.out)), export_tensor(std::move(s.lse)));
}

}  // namespace

void bind_serving(nb::module_& m) {
  m.def("attention_with_kvcache", &attention_with_kvcache, nb::arg("q"), nb::arg("k_cache"),
        nb::arg("v_cache"), nb::arg("cache_seqlens"), nb::arg("k_new").none(),
        nb::arg("v_new").none(), nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(),
        nb::arg("rotary_interleaved"), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("alibi_slopes"), nb::arg("softcap"),
        nb::arg("scale").none(), nb::arg("block_table").none(), nb::arg("k_scale").none(),
        nb::arg("v_scale").none());
  m.def("append_paged_kv_cache", &append_paged, nb::arg("k_new"), nb::arg("v_new"),
        nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("block_table"), nb::arg("positions"),
        nb::arg("k_scale").none(), nb::arg("v_scale").none());
  m.def("attention_varlen", &attention_varlen, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("alibi_slopes"), nb::arg("softcap"),
        nb::arg("scale").none(), nb::arg("block_table").none() = nb::none(),
        nb::arg("dropout_p") = 0.0, nb::arg("dropout_state").none() = nb::none());
  m.def("attention_varlen_backward", &attention_varlen_backward, nb::arg("grad_out"),
        nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"),
        nb::arg("max_seqlen_k"), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("alibi_slopes"), nb::arg("softcap"),
        nb::arg("scale").none(), nb::arg("dropout_p") = 0.0,
        nb::arg("dropout_state").none() = nb::none());
  m.def("merge_attention_states", &merge_states, nb::arg("out_a"), nb::arg("lse_a"),
        nb::arg("out_b"), nb::arg("lse_b"));
}

}  // namespace sdpa::python
