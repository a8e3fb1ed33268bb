// The standard mods, written with the same expression API users write.

#include "sdpa/flex_mods.h"

#include "sdpa/error.h"

namespace sdpa::flex::mods {

MaskMod causal() {
  return [](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return q >= kv; };
}

MaskMod sliding_window(int64_t window) {
  SDPA_CHECK(window >= 0, "sliding_window: expected window >= 0, got ", window);
  return [window](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    return (q >= kv) & (q - kv <= window);
  };
}

MaskMod prefix_lm(int64_t prefix_len) {
  SDPA_CHECK(prefix_len >= 0, "prefix_lm: expected prefix_len >= 0, got ", prefix_len);
  return [prefix_len](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    return (kv < prefix_len) | (q >= kv);
  };
}

MaskMod document(const Tensor& document_id) {
  SDPA_CHECK(document_id.dim() == 1 && (document_id.dtype() == DType::kInt32 ||
                                        document_id.dtype() == DType::kInt64),
             "document: expected an int32/int64 [L] tensor of document ids, got ",
             document_id.describe());
  const Captured doc("document_id", document_id);
  return [doc](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    return doc[q] == doc[kv];
  };
}

ScoreMod alibi(const Tensor& slopes) {
  const Captured s("alibi_slopes", slopes);
  return [s](const Expr& score, const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
    return score - s[h] * abs(q - kv);
  };
}

ScoreMod relative_position(const Tensor& table, int64_t max_distance, bool requires_grad) {
  SDPA_CHECK(table.dim() == 2 && table.size(1) == 2 * max_distance + 1,
             "relative_position: expected a table [H, ", 2 * max_distance + 1, "], got ",
             table.describe());
  const Captured t("relative_bias", table, requires_grad);
  return [t, max_distance](const Expr& score, const Expr&, const Expr& h, const Expr& q,
                           const Expr& kv) {
    return score + t[h][q - kv + max_distance];
  };
}

ScoreMod soft_cap(double cap) {
  SDPA_CHECK(cap > 0.0, "soft_cap: expected cap > 0, got ", cap);
  return [cap](const Expr& score, const Expr&, const Expr&, const Expr&, const Expr&) {
    return cap * tanh(score / cap);
  };
}

}  // namespace sdpa::flex::mods
