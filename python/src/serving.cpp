// Serving entry points: attention through a KV cache (written in place) and the merge of
// partial attention states.

#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "sdpa/kv_cache.h"
#include "sdpa/registry.h"

namespace sdpa::python {
namespace {

// An optional array argument: None stays an undefined Tensor.
Tensor optional_array(nb::handle obj, const char* arg) {
  return obj.is_none() ? Tensor() : import_array(obj, arg);
}

// Returns (out, lse, backend).
nb::tuple attention_with_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache,
                                 nb::handle cache_seqlens, nb::handle k_new, nb::handle v_new,
                                 nb::handle rotary_cos, nb::handle rotary_sin,
                                 bool rotary_interleaved, bool causal, int64_t window_left,
                                 int64_t window_right, std::vector<float> alibi_slopes,
                                 double softcap, std::optional<double> scale) {
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
  o.causal = causal;
  o.window_left = window_left;
  o.window_right = window_right;
  o.alibi_slopes = std::move(alibi_slopes);
  o.softcap = softcap;
  o.scale = scale;
  AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = sdpa::attention_with_kvcache(query, keys, values, seqlens, o);
  }
  return nb::make_tuple(export_tensor(std::move(r.out)), export_tensor(std::move(r.lse)),
                        r.backend);
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
        nb::arg("scale").none());
  m.def("merge_attention_states", &merge_states, nb::arg("out_a"), nb::arg("lse_a"),
        nb::arg("out_b"), nb::arg("lse_b"));
}

}  // namespace sdpa::python
