#pragma once
// Helpers for writing dense materializations from a per-element definition.

#include <functional>
#include <limits>

#include "sdpa/attn_bias.h"

namespace sdpa::bias_detail {

/// Bool [B or 1, 1, L, S] mask with keep(b, i, j).
Tensor bool_mask(int64_t batch, int64_t q_len, int64_t kv_len,
                 const std::function<bool(int64_t b, int64_t i, int64_t j)>& keep);

/// Additive [1, H, L, S] tensor of `dtype` with value(h, i, j).
Tensor additive_bias(int64_t num_heads, int64_t q_len, int64_t kv_len, DType dtype,
                     const std::function<double(int64_t h, int64_t i, int64_t j)>& value);

/// Checks `bias` against a call of `shape` exactly as lowering it does (its lower() into a
/// scratch descriptor), so materialize() rejects every call lower() rejects: a bias that
/// does not fit the call is an error on every backend, natively run or materialized.
inline void check_fits(const AttnBias& bias, const BiasShape& shape) {
  MaskDescriptor scratch;
  bias.lower(shape, scratch);
}

/// "top-left" / "bottom-right".
const char* alignment_name(DiagonalAlignment alignment);

/// Key j of query i is inside `band` measured on a q_len x kv_len grid.
bool in_band(const DiagonalBand& band, int64_t i, int64_t j, int64_t q_len, int64_t kv_len);

}  // namespace sdpa::bias_detail
