// FLASH_ATTENTION backward for float64 inputs: FlashAttention-2's backward (Dao 2023) in
// float64. One (batch, kv head) per work item owns dK / dV of its kv head and dQ of its
// query heads, so its loop can take FlashAttention-2's order (kv blocks outer, query rows
// inner) without atomics, and the sums run in a fixed order for any thread count.
//
// P is recomputed from row statistics computed here in float64, not from the forward's
// lse, which is float32: exp(s - lse) would carry lse's rounding (about |lse| * 6e-8
// relative) into every float64 gradient.

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/parallel.h"
#include "core/scratch.h"
#include "core/threading.h"
#include "cpu/flash_f64.h"
#include "cpu/flash_tile.h"
#include "cpu/kernel_context.h"
#include "cpu/kernels.h"
#include "cpu/online_softmax.h"
#include "cpu/rows.h"
#include "cpu/score_mod_grad.h"

namespace sdpa::cpu {
namespace {

// One thread's buffers for one (batch, kv head) item: the k / v / dK / dV rows of one kv
// block, one query's rows, one row of scores and its score_mod inputs, and per query row
// of the group its float64 lse, softmax sum and D = rowsum(dO o O).
struct BackwardTiles {
  BackwardTiles(const AttentionParams& p, const FlexBackward* grad)
      : k(kF64BlockKv * p.head_dim_qk),
        k_t(kF64BlockKv * p.head_dim_qk),
        v(kF64BlockKv * p.head_dim_vo),
        v_t(kF64BlockKv * p.head_dim_vo),
        dk(kF64BlockKv * p.head_dim_qk),
        dv(kF64BlockKv * p.head_dim_vo),
        q(p.head_dim_qk),
        dq(p.head_dim_qk),
        dout(p.head_dim_vo),
        out(p.head_dim_vo),
        s(kF64BlockKv),
        dp(kF64BlockKv),
        row(std::max(p.head_dim_qk, p.head_dim_vo)),
        raw(kF64BlockKv),
        keep(kF64BlockKv),
        lse(p.group_size() * p.q_len),
        sum(p.group_size() * p.q_len),
        delta(p.group_size() * p.q_len),
        flex(p.mask, kMaxLanes) {
    if (grad) grad_eval.emplace(*grad->program.program, grad->program.captured);
  }
  detail::ScratchArray<double> k, k_t, v, v_t, dk, dv, q, dq, dout, out, s, dp, row, raw, keep, lse,
      sum, delta;
  flex::RowState flex;
  std::optional<flex::ScalarEvaluator> grad_eval;
};

// The rows of one query head h of an item.
struct HeadRows {
  HeadRows(const AttentionParams& p, const detail::BackwardOutputs& g, int64_t b, int64_t h)
      : q(p.q, b, h), dout(p.grad_out, b, h), out(p.out, b, h), dq(g.grad_q, b, h),
        dense(p.mask, b, h) {}
  RowView q, dout, out, dq;
  DenseMaskRows dense;
};

// For every query row of the item's group (h - h0) * L + i: lse in float64 and
// D = rowsum(dO o O), at tiles.lse and tiles.delta; dQ rows set to zero.
void row_statistics(const AttentionParams& p, const detail::BackwardOutputs& g, int64_t b,
                    int64_t hk, BackwardTiles& tiles) {
  const int64_t L = p.q_len, S = p.kv_len, Ev = p.head_dim_vo;
  const int64_t G = p.group_size(), h0 = hk * G;
  double* m = tiles.lse.data();  // the running max until the final pass
  double* l = tiles.sum.data();
  std::fill(tiles.dq.begin(), tiles.dq.end(), 0.0);
  for (int64_t h = h0; h < h0 + G; ++h) {
    const HeadRows rows(p, g, b, h);
    for (int64_t i = 0; i < L; ++i) {
      rows.dout.load(i, tiles.dout.data());
      rows.out.load(i, tiles.out.data());
      double d = 0;
      for (int64_t e = 0; e < Ev; ++e) d += tiles.dout[e] * tiles.out[e];
      tiles.delta[(h - h0) * L + i] = d;
      rows.dq.store(i, tiles.dq.data());
    }
  }
  std::fill(m, m + G * L, -std::numeric_limits<double>::infinity());
  std::fill(l, l + G * L, 0.0);
  const RowView k_rows(p.k, b, hk);
  for (int64_t j0 = 0; j0 < S; j0 += kF64BlockKv) {
    const int64_t n = std::min(kF64BlockKv, S - j0);
    load_transposed(k_rows, j0, n, tiles.row.data(), tiles.k_t.data());
    for (int64_t h = h0; h < h0 + G; ++h) {
      const HeadRows rows(p, g, b, h);
      const HeadMasking masking{p.mask, rows.dense, &tiles.flex, b, h, L, S};
      for (int64_t i = 0; i < L; ++i) {
        const ColumnRange cols = row_columns(p.mask, b, i, L, S);
        if (cols.end <= j0 || cols.begin >= j0 + n) continue;
        rows.q.load(i, tiles.q.data());
        double* s = tiles.s.data();
        score_cols_f64(p, masking, i, j0, n, tiles.q.data(), tiles.k_t.data(), s);
        double block_max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) block_max = max_keeping_nan(block_max, s[j]);
        const int64_t r = (h - h0) * L + i;
        const double m_new = max_keeping_nan(m[r], block_max);
        if (!has_finite_score(m_new)) continue;
        double sum = m[r] == m_new ? l[r] : l[r] * std::exp(m[r] - m_new);
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - m_new);
        l[r] = sum;
        m[r] = m_new;
      }
    }
  }
  for (int64_t r = 0; r < G * L; ++r) m[r] = finalize(m[r], l[r]).lse;
}

// Gradients of kv head hk of batch b and of its group's query heads.
void backward_item(const AttentionParams& p, int64_t item, BackwardTiles& tiles,
                   FlexBackward* grad, const detail::BackwardOutputs& g) {
  const int64_t b = item / p.num_heads_kv, hk = item % p.num_heads_kv;
  const int64_t L = p.q_len, S = p.kv_len, E = p.head_dim_qk, Ev = p.head_dim_vo;
  const int64_t G = p.group_size(), h0 = hk * G;
  const double scale = p.scale;
  const RowView k_rows(p.k, b, hk), v_rows(p.v, b, hk);
  const RowView dk_rows(g.grad_k, b, hk), dv_rows(g.grad_v, b, hk);
  row_statistics(p, g, b, hk, tiles);
  for (int64_t j0 = 0; j0 < S; j0 += kF64BlockKv) {
    const int64_t n = std::min(kF64BlockKv, S - j0);
    for (int64_t j = 0; j < n; ++j) {
      k_rows.load(j0 + j, tiles.k.data() + j * E);
      v_rows.load(j0 + j, tiles.v.data() + j * Ev);
      for (int64_t e = 0; e < E; ++e) tiles.k_t[e * kF64BlockKv + j] = tiles.k[j * E + e];
      for (int64_t e = 0; e < Ev; ++e) tiles.v_t[e * kF64BlockKv + j] = tiles.v[j * Ev + e];
    }
    std::fill(tiles.dk.begin(), tiles.dk.end(), 0.0);
    std::fill(tiles.dv.begin(), tiles.dv.end(), 0.0);
    for (int64_t h = h0; h < h0 + G; ++h) {
      const HeadRows rows(p, g, b, h);
      const HeadMasking masking{p.mask, rows.dense, &tiles.flex, b, h, L, S};
      for (int64_t i = 0; i < L; ++i) {
        const double lse = tiles.lse[(h - h0) * L + i];
        const ColumnRange cols = row_columns(p.mask, b, i, L, S);
        // A fully masked row sends no gradient; keys outside the row's band get P = 0.
        if (is_masked_lse(lse) || cols.end <= j0 || cols.begin >= j0 + n) continue;
        rows.q.load(i, tiles.q.data());
        rows.dout.load(i, tiles.dout.data());
        rows.dq.load(i, tiles.dq.data());
        double* s = tiles.s.data();
        score_cols_f64(p, masking, i, j0, n, tiles.q.data(), tiles.k_t.data(), s,
                       grad ? tiles.raw.data() : nullptr);
        // dL/dP_j = keep_j (dO . v_j), for every key of the block along the keys.
        double* dp = tiles.dp.data();
        std::fill(dp, dp + n, 0.0);
        for (int64_t e = 0; e < Ev; ++e) {
          const double d = tiles.dout[e];
          const double* v_e = tiles.v_t.data() + e * kF64BlockKv;
          for (int64_t j = 0; j < n; ++j) dp[j] += d * v_e[j];
        }
        std::fill(tiles.keep.begin(), tiles.keep.begin() + n, 1.0);
        if (p.has_dropout()) apply_dropout(p, {b, h, i, j0}, tiles.keep.data(), n);
        const double delta = tiles.delta[(h - h0) * L + i];
        for (int64_t j = 0; j < n; ++j) {
          const double prob = std::exp(s[j] - lse);
          const double weight = prob * tiles.keep[j];
          double* dvj = tiles.dv.data() + j * Ev;
          for (int64_t e = 0; e < Ev; ++e) dvj[e] += weight * tiles.dout[e];
          double ds = prob * (dp[j] * tiles.keep[j] - delta);  // dL/d(score after score_mod)
          if (grad && prob != 0.0) {
            ds = chain_score_mod(*grad, *tiles.grad_eval, tiles.raw[j], b, h, i, j0 + j, ds,
                                 item);
          }
          ds *= scale;
          const double* kj = tiles.k.data() + j * E;
          double* dkj = tiles.dk.data() + j * E;
          for (int64_t e = 0; e < E; ++e) {
            dkj[e] += ds * tiles.q[e];
            tiles.dq[e] += ds * kj[e];
          }
        }
        rows.dq.store(i, tiles.dq.data());
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      dk_rows.store(j0 + j, tiles.dk.data() + j * E);
      dv_rows.store(j0 + j, tiles.dv.data() + j * Ev);
    }
  }
}

}  // namespace

void flash_backward_f64(const AttentionParams& p, detail::BackwardOutputs& out) {
  const int64_t items = p.batch * p.num_heads_kv;
  std::optional<FlexBackward> grad;
  if (p.mask.score_mod) {
    grad.emplace(FlexBackward{flex::differentiate(*p.mask.score_mod), std::nullopt});
    grad->captured.emplace(grad->program, p.mask.score_mod->captured(), items);
  }
  FlexBackward* fg = grad ? &*grad : nullptr;
  detail::ParallelErrors errors;
  const int threads = detail::ThreadingContext::current().threads_for(items, backward_work(p));
  detail::run_region(threads, [&] {
    std::optional<BackwardTiles> tiles;
    errors.guard([&] { tiles.emplace(p, fg); });
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      if (tiles) errors.guard([&] { backward_item(p, item, *tiles, fg, out); });
    }
  });
  errors.rethrow();
  if (fg && fg->captured->active()) out.grad_captured = fg->captured->finish();
}

}  // namespace sdpa::cpu
