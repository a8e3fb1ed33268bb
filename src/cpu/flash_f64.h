#pragma once
// FLASH_ATTENTION for float64 inputs (flash_f64_forward.cpp, flash_f64_backward.cpp):
// the FlashAttention-2 algorithm in scalar float64, sharing MATH's row-wise masking.

#include <cstdint>

#include "cpu/mask_rows.h"
#include "cpu/rows.h"
#include "dispatch/kernel_io.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// Tile sizes of the float64 kernels: a q-block of rows shares each loaded kv block.
inline constexpr int64_t kF64BlockQ = 32;
inline constexpr int64_t kF64BlockKv = 64;

/// Rows [j0, j0 + n) of `rows` (n <= kF64BlockKv) as float64 columns: t[c * kF64BlockKv + j]
/// = rows[j0 + j][c], through `row` (rows.cols() scratch elements). Dot products of every
/// key with one vector then run along the keys, which the compiler vectorizes, in the same
/// order per key as a row-wise dot product.
void load_transposed(const RowView& rows, int64_t j0, int64_t n, double* row, double* t);

/// s[j] for keys [col_begin, col_begin + n): q . k_j * scale with the call's biases,
/// score_mod and masks applied (masked scores are -inf). q: [E]; keys_t: [E, kF64BlockKv]
/// (load_transposed); mod_input (optional) receives the scores as score_mod sees them.
void score_cols_f64(const AttentionParams& p, const HeadMasking& masking, int64_t i,
                    int64_t col_begin, int64_t n, const double* q, const double* keys_t,
                    double* s, double* mod_input = nullptr);

/// Forward: out [B, Hq, L, Ev] float64 and lse [B, Hq, L] float32 (contiguous), tiled
/// over (batch, head, q-block) with an online softmax over kv blocks.
void flash_forward_f64(const AttentionParams& params, const Tensor& out, const Tensor& lse);

/// Backward: FlashAttention-2's loop order (kv blocks outer, query rows inner) per (batch,
/// kv head), with P recomputed from float64 row statistics; deterministic for any thread
/// count.
void flash_backward_f64(const AttentionParams& params, detail::BackwardOutputs& outputs);

}  // namespace sdpa::cpu
