// attention_varlen: validate the packing, then one attention call per sequence on
// [1, H, n, E] views of the packed tensors, so masks and ALiBi align to each sequence's
// own lengths; results are copied into the packed outputs.

#include "sdpa/varlen.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "sdpa/error.h"
#include "serving/cache_layout.h"
#include "serving/sequence_mask.h"

namespace sdpa {
namespace {

// The offsets of cu_seqlens (int32 [B + 1] from 0 to `total`, or to any end when total is
// -1), each length at most max_seqlen; `entries` (B + 1) when known from the other
// offsets, else -1.
std::vector<int64_t> read_offsets(const Tensor& cu, const char* name, int64_t total,
                                  int64_t max_seqlen, const char* max_name, int64_t entries) {
  SDPA_CHECK(cu.defined() && cu.dtype() == DType::kInt32, name,
             ": expected an int32 tensor [B + 1], got ",
             cu.defined() ? std::string(dtype_name(cu.dtype())) : "none");
  SDPA_CHECK(cu.device() == Device{}, name, ": expected a CPU tensor, got ",
             device_name(cu.device()));
  SDPA_CHECK(cu.dim() == 1 && cu.size(0) >= 1, name, ": expected shape [B + 1], got ",
             shape_str(cu.sizes()));
  SDPA_CHECK(entries < 0 || cu.size(0) == entries, name, ": expected ", entries,
             " offsets (B + 1, as cu_seqlens_q), got ", cu.size(0));
  SDPA_CHECK(max_seqlen >= 0, max_name, ": expected a value >= 0, got ", max_seqlen);
  std::vector<int64_t> offsets(static_cast<size_t>(cu.size(0)));
  for (int64_t i = 0; i < cu.size(0); ++i) {
    offsets[static_cast<size_t>(i)] = static_cast<int64_t>(cu.item({i}));
  }
  SDPA_CHECK(offsets.front() == 0, name, "[0]: expected 0, got ", offsets.front());
  for (size_t i = 1; i < offsets.size(); ++i) {
    const int64_t len = offsets[i] - offsets[i - 1];
    SDPA_CHECK(len >= 0, name, ": expected non-decreasing offsets, got ", offsets[i - 1],
               " then ", offsets[i], " at ", i);
    SDPA_CHECK(len <= max_seqlen, name, ": sequence ", i - 1, " has length ", len, " above ",
               max_name, " = ", max_seqlen);
  }
  SDPA_CHECK(total < 0 || offsets.back() == total, name, "[B]: expected the packed length ",
             total, ", got ", offsets.back());
  return offsets;
}

// Sequence rows [begin, end) of a packed [total, H, D] tensor as a [1, H, n, D] view.
Tensor sequence(const Tensor& packed, int64_t begin, int64_t end) {
  return packed.slice(0, begin, end).transpose(0, 1).unsqueeze(0);
}

// The validated packing of one call: per sequence its query and key ranges and call.
struct Packing {
  std::vector<int64_t> cu_q, cu_k;
  std::vector<serving::SequenceCall> calls;

  int64_t batch() const { return static_cast<int64_t>(cu_q.size()) - 1; }
  int64_t q_begin(int64_t b) const { return cu_q[static_cast<size_t>(b)]; }
  int64_t q_end(int64_t b) const { return cu_q[static_cast<size_t>(b) + 1]; }
  int64_t k_begin(int64_t b) const { return cu_k[static_cast<size_t>(b)]; }
  int64_t k_end(int64_t b) const { return cu_k[static_cast<size_t>(b) + 1]; }
  // Sequences with queries and keys run; the others' rows keep out 0, lse -inf and
  // gradients 0.
  bool runs(int64_t b) const { return q_end(b) > q_begin(b) && k_end(b) > k_begin(b); }
};

void check_query(const Tensor& q) {
  serving::check_dims(q, "q", 3, "[total_q, Hq, E]", "attention_varlen");
  SDPA_CHECK(q.dtype() == DType::kFloat32 || q.dtype() == DType::kBFloat16 ||
                 q.dtype() == DType::kFloat16,
             "q: expected float32, bfloat16 or float16, got ", dtype_name(q.dtype()));
}

Packing check_packing(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                      const Tensor& cu_k, int64_t max_q, int64_t max_k, const SequenceOptions& o) {
  check_query(q);
  serving::check_dims(k, "k", 3, "[total_k, Hkv, E]", "attention_varlen");
  serving::check_dims(v, "v", 3, "[total_k, Hkv, Ev]", "attention_varlen");
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    SDPA_CHECK(t->dtype() == q.dtype(), name, ": expected q's dtype ", dtype_name(q.dtype()),
               ", got ", dtype_name(t->dtype()));
  }
  SDPA_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1), "v: expected [",
             k.size(0), ", ", k.size(1), ", Ev] (total_k and Hkv of k), got ",
             shape_str(v.sizes()));
  SDPA_CHECK(k.size(2) == q.size(2), "k: expected head dimension E = ", q.size(2),
             " (q's), got ", k.size(2));
  const int64_t Hq = q.size(1), Hkv = k.size(1);
  SDPA_CHECK(Hkv > 0 && Hq % Hkv == 0, "q: the query head count ", Hq,
             " must be a multiple of the kv head count ", Hkv, " (GQA)");
  serving::check_sequence_options(o, Hq);
  Packing p;
  p.cu_q = read_offsets(cu_q, "cu_seqlens_q", q.size(0), max_q, "max_seqlen_q", -1);
  p.cu_k = read_offsets(cu_k, "cu_seqlens_k", k.size(0), max_k, "max_seqlen_k",
                        static_cast<int64_t>(p.cu_q.size()));
  p.calls.reserve(static_cast<size_t>(p.batch()));
  for (int64_t b = 0; b < p.batch(); ++b) {
    p.calls.emplace_back(o, p.q_end(b) - p.q_begin(b), p.k_end(b) - p.k_begin(b), Hq != Hkv);
    if (p.runs(b)) {
      p.calls.back().check(sequence(q, p.q_begin(b), p.q_end(b)),
                           sequence(k, p.k_begin(b), p.k_end(b)),
                           sequence(v, p.k_begin(b), p.k_end(b)));
    }
  }
  return p;
}

// With dropout, every sequence's call draws with `state` at its own place in the packed
// [1, Hq, total_q, total_k] call (SequenceOptions::dropout_p).
void place_dropout(Packing& p, const PhiloxState& state, int64_t total_q, int64_t total_k) {
  for (int64_t b = 0; b < p.batch(); ++b) {
    SDPAOptions& o = p.calls[static_cast<size_t>(b)].options;
    o.dropout_state = state;
    o.dropout_position = DropoutPosition{p.q_begin(b), p.k_begin(b), total_q, total_k};
  }
}

// One sequence's keys and values as [1, Hkv, n, E/Ev] views, and the pages they are read
// through (null for packed tensors).
struct SequenceKv {
  Tensor k, v;
  std::shared_ptr<const KvPages> pages;
  std::shared_ptr<const KvDequant> dequant;  ///< float8 pages (scale 1)
};

// The forward of every sequence of `p` (validated) into packed out [total_q, Hq, Ev] and
// lse [Hq, total_q]; kv_of(b) gives sequence b's keys and values.
template <class KvOf>
AttentionResult run_sequences(const Tensor& q, const Packing& p, int64_t Ev, KvOf&& kv_of) {
  const int64_t total_q = q.size(0), Hq = q.size(1);
  AttentionResult result;
  result.out = Tensor::zeros({total_q, Hq, Ev}, q.dtype());
  result.lse =
      Tensor::full({Hq, total_q}, -std::numeric_limits<double>::infinity(), DType::kFloat32);
  for (int64_t b = 0; b < p.batch(); ++b) {
    if (!p.runs(b)) continue;
    const SequenceKv kv = kv_of(b);
    const AttentionResult r = p.calls[static_cast<size_t>(b)].forward(
        sequence(q, p.q_begin(b), p.q_end(b)), kv.k, kv.v, kv.pages, kv.dequant);
    result.out.slice(0, p.q_begin(b), p.q_end(b)).copy_(r.out.select(0, 0).transpose(0, 1));
    result.lse.slice(1, p.q_begin(b), p.q_end(b)).copy_(r.lse.select(0, 0));
    result.backend = r.backend;
  }
  return result;
}

void check_like(const Tensor& t, const char* name, const Shape& shape, DType dtype) {
  SDPA_CHECK(t.defined() && t.sizes() == shape && t.dtype() == dtype, name, ": expected ",
             dtype_name(dtype), " ", shape_str(shape), ", got ",
             t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_str(t.sizes())
                         : std::string("none"));
}

}  // namespace

AttentionResult attention_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                 int64_t max_seqlen_q, int64_t max_seqlen_k,
                                 const SequenceOptions& options) {
  Packing p = check_packing(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            options);
  PhiloxState state;
  if (options.dropout_p > 0.0) {
    // One draw for the whole call, after every check (a refused call draws nothing).
    state = options.dropout_state.value_or(
        (options.generator != nullptr ? *options.generator : default_generator()).next());
    place_dropout(p, state, q.size(0), k.size(0));
  }
  AttentionResult result = run_sequences(q, p, v.size(2), [&](int64_t b) {
    return SequenceKv{sequence(k, p.k_begin(b), p.k_end(b)),
                      sequence(v, p.k_begin(b), p.k_end(b)), nullptr, nullptr};
  });
  result.philox = state;
  return result;
}

AttentionResult attention_varlen_paged(const Tensor& q, const Tensor& k_pages,
                                       const Tensor& v_pages, const Tensor& cu_seqlens_q,
                                       const Tensor& cu_seqlens_k, const Tensor& block_table,
                                       int64_t max_seqlen_q, int64_t max_seqlen_k,
                                       const SequenceOptions& options) {
  check_query(q);
  SDPA_CHECK(block_table.defined(), "block_table: expected an int32 tensor [B, max_pages], "
             "got none");
  SDPA_CHECK(options.dropout_p == 0.0, "dropout_p: the paged varlen path is inference "
             "(forward only, as flash-attn's) and takes no dropout, got ", options.dropout_p);
  Packing p;
  p.cu_q = read_offsets(cu_seqlens_q, "cu_seqlens_q", q.size(0), max_seqlen_q, "max_seqlen_q",
                        -1);
  p.cu_k = read_offsets(cu_seqlens_k, "cu_seqlens_k", -1, max_seqlen_k, "max_seqlen_k",
                        static_cast<int64_t>(p.cu_q.size()));
  const serving::CacheLayout cache(k_pages, v_pages, block_table, p.batch(), q.dtype(),
                                   q.size(2));
  const int64_t Hq = q.size(1), Hkv = cache.kv_heads();
  SDPA_CHECK(Hkv > 0 && Hq % Hkv == 0, "q: the query head count ", Hq,
             " must be a multiple of the kv head count ", Hkv, " (GQA)");
  serving::check_sequence_options(options, Hq);
  auto keys = [&](int64_t b) {
    const int64_t n = p.k_end(b) - p.k_begin(b);
    return SequenceKv{cache.rows(false, b, n), cache.rows(true, b, n), cache.pages(b),
                      cache.dequant()};
  };
  for (int64_t b = 0; b < p.batch(); ++b) {
    p.calls.emplace_back(options, p.q_end(b) - p.q_begin(b), p.k_end(b) - p.k_begin(b),
                         Hq != Hkv);
    if (!p.runs(b)) continue;
    const int64_t n = p.k_end(b) - p.k_begin(b);
    SDPA_CHECK(n <= cache.capacity(), "cu_seqlens_k: sequence ", b, " has ", n,
               " keys, more than its block_table row holds (max_pages * page_size = ",
               cache.capacity(), ")");
    cache.check_pages(b, n);
    const SequenceKv kv = keys(b);
    p.calls.back().check(sequence(q, p.q_begin(b), p.q_end(b)), kv.k, kv.v, kv.dequant);
  }
  return run_sequences(q, p, cache.value_dim(), keys);
}

AttentionGradients attention_varlen_backward(const Tensor& grad_out, const Tensor& q,
                                             const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& lse, const Tensor& cu_seqlens_q,
                                             const Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                                             int64_t max_seqlen_k,
                                             const SequenceOptions& options) {
  Packing p = check_packing(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            options);
  const int64_t total_q = q.size(0), Hq = q.size(1), Ev = v.size(2);
  check_like(grad_out, "grad_out", {total_q, Hq, Ev}, q.dtype());
  check_like(out, "out", {total_q, Hq, Ev}, q.dtype());
  check_like(lse, "lse", {Hq, total_q}, DType::kFloat32);
  if (options.dropout_p > 0.0) {
    SDPA_CHECK(options.dropout_state.has_value(), "dropout_state: a backward with dropout_p ",
               options.dropout_p, " needs the forward's state (its AttentionResult::philox)");
    place_dropout(p, *options.dropout_state, total_q, k.size(0));
  }
  AttentionGradients grads;
  grads.grad_q = Tensor::zeros(q.sizes(), q.dtype());
  grads.grad_k = Tensor::zeros(k.sizes(), k.dtype());
  grads.grad_v = Tensor::zeros(v.sizes(), v.dtype());
  for (int64_t b = 0; b < p.batch(); ++b) {
    if (!p.runs(b)) continue;
    const int64_t q0 = p.q_begin(b), q1 = p.q_end(b), k0 = p.k_begin(b), k1 = p.k_end(b);
    const AttentionGradients g = p.calls[static_cast<size_t>(b)].backward(
        sequence(grad_out, q0, q1), sequence(q, q0, q1), sequence(k, k0, k1),
        sequence(v, k0, k1), sequence(out, q0, q1), lse.slice(1, q0, q1).unsqueeze(0));
    grads.grad_q.slice(0, q0, q1).copy_(g.grad_q.select(0, 0).transpose(0, 1));
    grads.grad_k.slice(0, k0, k1).copy_(g.grad_k.select(0, 0).transpose(0, 1));
    grads.grad_v.slice(0, k0, k1).copy_(g.grad_v.select(0, 0).transpose(0, 1));
  }
  return grads;
}

}  // namespace sdpa
