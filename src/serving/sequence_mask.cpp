// SequenceOptions as one attention call per sequence: the band and ALiBi bottom-right in
// the sequence's own q_len x kv_len, soft-capping (with ALiBi after it, when both are
// given) as a flex score_mod.

#include "serving/sequence_mask.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "dispatch/lowering.h"
#include "sdpa/attn_bias.h"
#include "sdpa/error.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"

namespace sdpa::serving {
namespace {

// The options' mask, and their ALiBi when `alibi`, for a sequence of q_len queries and
// kv_len keys.
AttnMask sequence_bias(const SequenceOptions& o, int64_t q_len, int64_t kv_len, bool alibi) {
  std::vector<AttnBiasPtr> parts;
  const int64_t right = o.causal ? 0 : o.window_right;
  if (o.window_left < 0 && right == 0) {
    parts.push_back(causal_lower_right(q_len, kv_len));
  } else if (o.window_left >= 0 || right >= 0) {
    parts.push_back(std::make_shared<LocalAttentionBias>(
        o.window_left < 0 ? std::nullopt : std::optional<int64_t>(o.window_left),
        right < 0 ? std::nullopt : std::optional<int64_t>(right), DiagonalAlignment::kBottomRight));
  }
  if (alibi && !o.alibi_slopes.empty()) {
    parts.push_back(std::make_shared<AlibiBias>(o.alibi_slopes, DiagonalAlignment::kBottomRight));
  }
  if (parts.empty()) return {};
  if (parts.size() == 1) return parts.front();
  return std::make_shared<ComposedBias>(std::move(parts));
}

// Soft-capping, then ALiBi aligned bottom-right (diagonal offset kv_len - q_len), as one
// score_mod: flash-attn caps the scores before adding ALiBi, while a native ALiBi bias
// comes before any score_mod.
flex::Program capped_alibi(double cap, const std::vector<float>& slopes, int64_t offset) {
  Tensor t = Tensor::empty({static_cast<int64_t>(slopes.size())}, DType::kFloat32);
  std::memcpy(t.data_ptr(), slopes.data(), slopes.size() * sizeof(float));
  const flex::Captured s("alibi_slopes", t);
  const flex::ScoreMod capped = flex::mods::soft_cap(cap);
  return flex::Program::from_score_mod([=](const flex::Expr& score, const flex::Expr& b,
                                           const flex::Expr& h, const flex::Expr& q,
                                           const flex::Expr& kv) {
    const flex::Expr distance = flex::abs(q + flex::Expr(offset) - kv);
    return capped(score, b, h, q, kv) - flex::Expr(s[h]) * flex::to_float(distance);
  });
}

}  // namespace

void check_sequence_options(const SequenceOptions& o, int64_t num_heads_q) {
  SDPA_CHECK(o.window_left >= -1 && o.window_right >= -1,
             "window_size: expected bounds >= -1 (-1: unbounded), got (", o.window_left, ", ",
             o.window_right, ")");
  SDPA_CHECK(std::isfinite(o.softcap) && o.softcap >= 0.0,
             "softcap: expected a finite value >= 0 (0: none), got ", o.softcap);
  SDPA_CHECK(o.alibi_slopes.empty() || static_cast<int64_t>(o.alibi_slopes.size()) == num_heads_q,
             "alibi_slopes: expected one slope per query head (", num_heads_q, "), got ",
             o.alibi_slopes.size());
  SDPA_CHECK(o.dropout_p >= 0.0 && o.dropout_p <= 1.0,
             "dropout_p: expected a probability in [0, 1], got ", o.dropout_p);
}

SequenceCall::SequenceCall(const SequenceOptions& o, int64_t q_len, int64_t kv_len, bool gqa) {
  options.scale = o.scale;
  options.enable_gqa = gqa;
  const bool capped = o.softcap > 0.0;
  options.attn_mask = sequence_bias(o, q_len, kv_len, /*alibi=*/!capped);
  options.dropout_p = o.dropout_p;
  if (capped && !o.alibi_slopes.empty()) {
    softcap = capped_alibi(o.softcap, o.alibi_slopes, kv_len - q_len);
  } else if (capped) {
    softcap = flex::Program::from_score_mod(flex::mods::soft_cap(o.softcap));
  }
}

AttentionParams SequenceCall::params(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const std::shared_ptr<const KvDequant>& dequant) const {
  if (!dequant) return make_params(q, k, v, options);
  // make_params checks q's dtype on k / v too: it checks shapes on stand-ins of q's dtype
  // (broadcast views, nothing read), then the float8 views and their scales go in.
  const auto stand_in = [&](const Tensor& t) {
    return Tensor::from_blob(t.data_ptr(), t.sizes(), Shape(static_cast<size_t>(t.dim()), 0), q.dtype());
  };
  AttentionParams p = make_params(q, stand_in(k), stand_in(v), options);
  p.k = k;
  p.v = v;
  p.kv_dequant = dequant;
  return p;
}

void SequenceCall::check(const Tensor& q, const Tensor& k, const Tensor& v,
                         const std::shared_ptr<const KvDequant>& dequant) const {
  if (options.dropout_p > 0.0 && !options.dropout_state) {
    // Validating must not draw the dropout state from the generator (the call draws once).
    SequenceCall stated = *this;
    stated.options.dropout_state = PhiloxState{};
    (void)stated.params(q, k, v, dequant);
    return;
  }
  (void)params(q, k, v, dequant);
}

AttentionResult SequenceCall::forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const std::shared_ptr<const KvPages>& pages,
                                      const std::shared_ptr<const KvDequant>& dequant) const {
  if (!pages && !dequant) {
    return softcap ? flex_attention(q, k, v, softcap, nullptr, options)
                   : scaled_dot_product_attention_with_lse(q, k, v, options);
  }
  AttentionParams p = params(q, k, v, dequant);
  if (softcap) p.mask.score_mod = std::make_shared<const flex::Program>(*softcap);
  p.kv_pages = pages;
  return run_forward(p);
}

AttentionGradients SequenceCall::backward(const Tensor& grad_out, const Tensor& q,
                                          const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& lse) const {
  return softcap ? flex_attention_backward(grad_out, q, k, v, out, lse, softcap, nullptr, options)
                 : scaled_dot_product_attention_backward(grad_out, q, k, v, out, lse, options);
}

}  // namespace sdpa::serving
