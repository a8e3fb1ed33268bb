// FLASH_ATTENTION forward for float64 inputs: FlashAttention-2's tiled online softmax
// (Dao 2023) computed entirely in float64, as torch's CPU flash kernel does for double.
// The float32 SIMD tiles (flash_tile.cc) cannot hold float64; this path is scalar C++ over
// the same row-wise mask application as MATH (mask_rows.h), so every mask kind, bias and
// flex program behaves identically, and it never materializes more than a [q-block,
// kv-block] tile of scores.

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
#include "cpu/kv_rows.h"
#include "cpu/mask_rows.h"
#include "cpu/online_softmax.h"
#include "cpu/rows.h"

namespace sdpa::cpu {
namespace {

// One thread's tiles: q rows, the keys of one kv block as columns and its value rows, one
// score row, one input row, and the online-softmax state {m, l, o} of the q-block's rows.
struct ForwardTiles {
  explicit ForwardTiles(const AttentionParams& p)
      : q(kF64BlockQ * p.head_dim_qk),
        k(kF64BlockKv * p.head_dim_qk),
        v(kF64BlockKv * p.head_dim_vo),
        s(kF64BlockKv),
        row(std::max(p.head_dim_qk, p.head_dim_vo)),
        m(kF64BlockQ),
        l(kF64BlockQ),
        o(kF64BlockQ * p.head_dim_vo),
        flex(p.mask, kMaxLanes) {}
  detail::ScratchArray<double> q, k, v, s, row, m, l, o;
  flex::RowState flex;
};

// Rows [q_begin, q_begin + rows) of (b, h): out and lse.
void forward_q_block(const AttentionParams& p, const QueryTile& t, ForwardTiles& tiles,
                     const Tensor& out, float* lse) {
  const int64_t E = p.head_dim_qk, Ev = p.head_dim_vo, S = p.kv_len;
  const int64_t hk = t.h / p.group_size();
  const RowView q_rows(p.q, t.b, t.h), out_rows(out, t.b, t.h);
  const RowView k_rows = key_rows(p, t.b, hk), v_rows = value_rows(p, t.b, hk);
  const DenseMaskRows dense(p.mask, t.b, t.h);
  const HeadMasking masking{p.mask, dense, &tiles.flex, t.b, t.h, p.q_len, S};
  for (int64_t r = 0; r < t.rows; ++r) q_rows.load(t.q_begin + r, tiles.q.data() + r * E);
  std::fill(tiles.m.begin(), tiles.m.end(), -std::numeric_limits<double>::infinity());
  std::fill(tiles.l.begin(), tiles.l.end(), 0.0);
  std::fill(tiles.o.begin(), tiles.o.end(), 0.0);
  // Keys outside every row's band (causal, windows, documents) are never loaded.
  const ColumnRange cols = block_columns(p, t.b, t.q_begin, t.q_begin + t.rows);
  for (int64_t j0 = cols.begin; j0 < cols.end; j0 += kF64BlockKv) {
    const int64_t n = std::min(kF64BlockKv, cols.end - j0);
    load_transposed(k_rows, j0, n, tiles.row.data(), tiles.k.data());
    for (int64_t j = 0; j < n; ++j) v_rows.load(j0 + j, tiles.v.data() + j * Ev);
    for (int64_t r = 0; r < t.rows; ++r) {
      const int64_t i = t.q_begin + r;
      double* s = tiles.s.data();
      score_cols_f64(p, masking, i, j0, n, tiles.q.data() + r * E, tiles.k.data(), s);
      double block_max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n; ++j) block_max = max_keeping_nan(block_max, s[j]);
      const double m_old = tiles.m[r], m_new = max_keeping_nan(m_old, block_max);
      if (!has_finite_score(m_new)) continue;  // nothing visible yet
      // exp(m_old - m_new), exactly 1 when the max does not move (also for a NaN row).
      const double alpha = m_old == m_new ? 1.0 : std::exp(m_old - m_new);
      double* o = tiles.o.data() + r * Ev;
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m_new));
      tiles.l[r] = tiles.l[r] * alpha + sum;
      tiles.m[r] = m_new;
      if (alpha != 1.0) {
        for (int64_t e = 0; e < Ev; ++e) o[e] *= alpha;
      }
      if (p.has_dropout()) apply_dropout(p, {t.b, t.h, i, j0}, s, n);
      for (int64_t j = 0; j < n; ++j) {
        const double* vj = tiles.v.data() + j * Ev;
        for (int64_t e = 0; e < Ev; ++e) o[e] += s[j] * vj[e];
      }
    }
  }
  for (int64_t r = 0; r < t.rows; ++r) {
    const RowFinish<double> f = finalize(tiles.m[r], tiles.l[r]);
    double* o = tiles.o.data() + r * Ev;
    for (int64_t e = 0; e < Ev; ++e) o[e] = f.masked ? 0.0 : o[e] * f.inv_l;
    out_rows.store(t.q_begin + r, o);
    lse[query_row_index(p, t.b, t.h, t.q_begin + r)] = static_cast<float>(f.lse);
  }
}

}  // namespace

void load_transposed(const RowView& rows, int64_t j0, int64_t n, double* row, double* t) {
  for (int64_t j = 0; j < n; ++j) {
    rows.load(j0 + j, row);
    for (int64_t c = 0; c < rows.cols(); ++c) t[c * kF64BlockKv + j] = row[c];
  }
}

void score_cols_f64(const AttentionParams& p, const HeadMasking& masking, int64_t i,
                    int64_t col_begin, int64_t n, const double* q, const double* keys_t,
                    double* s, double* mod_input) {
  std::fill(s, s + n, 0.0);
  for (int64_t e = 0; e < p.head_dim_qk; ++e) {
    const double qe = q[e];
    const double* k_e = keys_t + e * kF64BlockKv;
    for (int64_t j = 0; j < n; ++j) s[j] += qe * k_e[j];
  }
  for (int64_t j = 0; j < n; ++j) s[j] *= p.scale;
  mask_score_cols(masking, i, col_begin, col_begin + n, s, mod_input);
}

void flash_forward_f64(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  const int64_t q_blocks = (p.q_len + kF64BlockQ - 1) / kF64BlockQ;
  const int64_t items = p.batch * p.num_heads_q * q_blocks;
  float* lse_data = lse.data<float>();
  detail::ParallelErrors errors;
  const int threads = detail::ThreadingContext::current().threads_for(items, forward_work(p));
  detail::run_region(threads, [&] {
    std::optional<ForwardTiles> tiles;
    errors.guard([&] { tiles.emplace(p); });
    // Dynamic: under a causal mask later q-blocks see more keys.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      if (!tiles) continue;
      errors.guard([&] {
        const int64_t bh = item / q_blocks, q_begin = (item % q_blocks) * kF64BlockQ;
        const QueryTile t{bh / p.num_heads_q, bh % p.num_heads_q, q_begin,
                          std::min(kF64BlockQ, p.q_len - q_begin)};
        forward_q_block(p, t, *tiles, out, lse_data);
      });
    }
  });
  errors.rethrow();
}

}  // namespace sdpa::cpu
