#pragma once
// GraphSpec: everything that shapes a cuDNN SDPA graph, lowered from AttentionParams.
// The graph builders read only this struct and the cache keys on all of it, so a cached
// graph always matches the call it is reused for.

#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "dispatch/backend_impl.h"

namespace sdpa::cudnn {

struct ScoreModGraph;
struct ScoreModCall;

/// A tensor's dims and element strides, [B, H, rows, cols].
struct TensorSpec {
  std::array<int64_t, 4> dims{};
  std::array<int64_t, 4> strides{};
};

/// Only int64 fields (no padding), so memcmp and byte hashing are exact.
struct GraphSpec {
  int64_t backward = 0;
  int64_t dtype = 0;   // sdpa::DType
  int64_t device = 0;  // CUDA ordinal
  TensorSpec q, k, v;
  TensorSpec out, grad_out, lse;  // backward only
  int64_t has_bias = 0;
  TensorSpec bias;                // [B or 1, H or 1, L, S]
  int64_t bias_repacked = 0;      // the bias is copied to 16-byte aligned rows per call
  int64_t has_band = 0;
  int64_t bottom_right = 0;
  int64_t has_left = 0, left = 0;    // sdpa's bounds (cuDNN's left bound is left + 1)
  int64_t has_right = 0, right = 0;
  int64_t scale_bits = 0;      // float bits of the score scale
  int64_t dropout_bits = 0;    // float bits of dropout p (0 without dropout)
  int64_t deterministic = 0;   // backward: deterministic dQ/dK/dV
  int64_t has_score_mod = 0;
  int64_t score_mod_fingerprint = 0;  // ScoreModGraph::fingerprint (programs and layouts)

  bool operator==(const GraphSpec& o) const { return std::memcmp(this, &o, sizeof(*this)) == 0; }
};

struct GraphSpecHash {
  size_t operator()(const GraphSpec& s) const;
};

/// Lowers `params` to a GraphSpec, and to `score_mod` (when given) its flex score_mod or
/// the native mask parts that reach cuDNN as one (ALiBi, native_score_mod.h). Returns
/// false, adding the reason, when cuDNN's SDPA node cannot express the call (a mask kind,
/// a layout, a dtype, ...).
bool lower(const AttentionParams& params, GraphSpec& spec, Reasons& reasons,
           ScoreModCall* score_mod = nullptr);

/// The additive mask as cuDNN reads it: [B or 1, H or 1, L, S] (broadcast batch and head
/// dimensions cut to one).
Tensor bias_view(const AttentionParams& params);

/// Whether cuDNN can read `t` in place: a dense last dimension and 16-byte aligned rows.
bool rows_aligned(const Tensor& t);

/// "forward bfloat16 q [2, 8, 1000, 64] ... causal(bottom-right)": for errors and explain.
std::string describe(const GraphSpec& spec);

}  // namespace sdpa::cudnn
