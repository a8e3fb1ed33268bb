// QkSoftmaxTileBf16 (src/cpu/qk_softmax_bf16-inl.h), the fused q.k^T and lazy-max online
// softmax of the vdpbf16ps forward, against float64 over a run of key tiles: attention
// outputs and logsumexps assembled from its P, alpha and sums as FlashQBlock does, and
// each tile's probabilities relative to the row's running max. Row maxes rise within the
// slack on some rows (no rescale), past it on others (rescale) and fall on others; row
// counts leave register-tile tails (37 = 6 x 6 + 1, 64 = 10 x 6 + 4). Runs where the CPU
// has AVX512_BF16; the kernel tests cover it end to end as well.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/qk_softmax_bf16_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/bf16_bits.h"
#include "cpu/qk_softmax_bf16-inl.h"
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX3
using test::Bf16ToDouble;
using test::CpuHasBf16;
using test::ToBf16Bits;

// Scaled score offset of rows of kind `kind` in tile `tile`: kind 0 rises within the slack
// (ln 2^8 = 5.5) at tile 2, kind 1 rises past it at tiles 1 and 3, kind 2 falls, kind 3
// stays.
float Offset(int64_t kind, int tile) {
  switch (kind) {
    case 0:
      return tile >= 2 ? 3.0f : 0.0f;
    case 1:
      return tile == 0 ? -2.0f : (tile < 3 ? 8.0f : 23.0f);
    case 2:
      return -10.0f * static_cast<float>(tile);
    default:
      return 0.0f;
  }
}

void CheckTiles(int64_t rows, int64_t head_dim, float score_scale) {
  constexpr int kTiles = 4;
  const int64_t depth_pairs = head_dim / 2, ev = 3;  // a few value columns suffice
  std::mt19937 rng(static_cast<uint32_t>(rows * 131 + head_dim));
  std::normal_distribution<float> normal;
  // Elements 0..3 of q are one-hot in the row kind r % 4, and element e < 4 of every key
  // of a tile is Offset(e, tile) / score_scale plus noise: the scaled scores of row r then
  // move by Offset(r % 4, tile) from tile to tile.
  std::vector<uint16_t> q(static_cast<size_t>(rows * head_dim));
  std::vector<float> qf(q.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t e = 0; e < head_dim; ++e) {
      // Elements 0..3 select the row kind (one-hot); the rest are small and random.
      const float x = e < 4 ? (e == r % 4 ? 1.0f : 0.0f) : 0.5f * normal(rng);
      q[static_cast<size_t>(r * head_dim + e)] = ToBf16Bits(x);
      qf[static_cast<size_t>(r * head_dim + e)] = static_cast<float>(Bf16ToDouble(ToBf16Bits(x)));
    }
  }
  std::vector<double> out_acc(static_cast<size_t>(rows * ev), 0.0);
  std::vector<double> want_scores(static_cast<size_t>(rows * kTiles * kBlockKv));
  std::vector<double> values(static_cast<size_t>(kTiles * kBlockKv * ev));
  for (double& v : values) v = normal(rng);

  alignas(64) float row_max[kBlockQ], row_sum[kBlockQ], alpha[kBlockQ];
  alignas(64) float sum_lanes[kBlockQ * 16];
  std::fill(row_max, row_max + kBlockQ, kNegInf);
  std::fill(row_sum, row_sum + kBlockQ, 0.0f);
  std::fill(sum_lanes, sum_lanes + kBlockQ * 16, 0.0f);
  std::vector<uint16_t> p(static_cast<size_t>(rows * kBlockKv));
  std::vector<uint16_t> k_pairs(static_cast<size_t>(depth_pairs * kBlockKv * 2));
  for (int tile = 0; tile < kTiles; ++tile) {
    std::vector<float> kf(static_cast<size_t>(kBlockKv * head_dim));
    for (int64_t j = 0; j < kBlockKv; ++j) {
      for (int64_t e = 0; e < head_dim; ++e) {
        const float x = e < 4 ? (Offset(e, tile) + 0.25f * normal(rng)) / score_scale : normal(rng);
        const uint16_t bits = ToBf16Bits(x);
        kf[static_cast<size_t>(j * head_dim + e)] = static_cast<float>(Bf16ToDouble(bits));
        k_pairs[static_cast<size_t>((e / 2) * 2 * kBlockKv + 2 * j + e % 2)] = bits;
      }
    }
    // As FlashQBlock before a tile that takes the unfused path: row_sum then holds earlier
    // tiles' sums when a later tile raises the max.
    if (tile == 2) FoldSumLanes(rows, sum_lanes, row_sum);
    QkSoftmaxTileBf16(q.data(), head_dim, rows, k_pairs.data(), depth_pairs, score_scale, row_max,
                      row_sum, sum_lanes, alpha, p.data());
    for (int64_t r = 0; r < rows; ++r) {
      double tile_max = -HUGE_VAL;
      for (int64_t j = 0; j < kBlockKv; ++j) {
        double s = 0.0;
        for (int64_t e = 0; e < head_dim; ++e) {
          s += static_cast<double>(qf[static_cast<size_t>(r * head_dim + e)]) *
               kf[static_cast<size_t>(j * head_dim + e)];
        }
        s *= score_scale;
        want_scores[static_cast<size_t>((r * kTiles + tile) * kBlockKv + j)] = s;
        tile_max = std::max(tile_max, s);
      }
      // The running max trails the true one by less than the slack (ln 2^8 in scaled
      // units), and this tile's probabilities are relative to it.
      const double m = row_max[r];
      ASSERT_LE(tile_max - m, kLazyMaxSlackLog2 * std::log(2.0) + 1e-3)
          << "row " << r << " tile " << tile;
      for (int64_t j = 0; j < kBlockKv; ++j) {
        const double want =
            std::exp(want_scores[static_cast<size_t>((r * kTiles + tile) * kBlockKv + j)] - m);
        const double got = Bf16ToDouble(p[static_cast<size_t>(r * kBlockKv + j)]);
        // bf16 rounding (2^-8 relative), plus the polynomial (2.7e-6) and the float32
        // score and exponent argument (|t| < 60: < 2e-5).
        ASSERT_NEAR(got, want, (std::ldexp(1.0, -8) + 5e-5) * want + 1e-30)
            << "row " << r << " key " << j << " tile " << tile;
      }
      for (int64_t c = 0; c < ev; ++c) {
        double& acc = out_acc[static_cast<size_t>(r * ev + c)];
        acc *= alpha[r];
        for (int64_t j = 0; j < kBlockKv; ++j) {
          acc += Bf16ToDouble(p[static_cast<size_t>(r * kBlockKv + j)]) *
                 values[static_cast<size_t>((tile * kBlockKv + j) * ev + c)];
        }
      }
    }
  }
  FoldSumLanes(rows, sum_lanes, row_sum);
  for (int64_t r = 0; r < rows; ++r) {
    double max = -HUGE_VAL, sum = 0.0;
    const double* s = want_scores.data() + r * kTiles * kBlockKv;
    for (int64_t j = 0; j < kTiles * kBlockKv; ++j) max = std::max(max, s[j]);
    for (int64_t j = 0; j < kTiles * kBlockKv; ++j) sum += std::exp(s[j] - max);
    const double want_lse = max + std::log(sum);
    EXPECT_NEAR(row_max[r] + std::log(static_cast<double>(row_sum[r])), want_lse,
                2e-5 * std::max(1.0, std::fabs(want_lse)))
        << "row " << r;
    for (int64_t c = 0; c < ev; ++c) {
      double want = 0.0, largest = 0.0;
      for (int64_t j = 0; j < kTiles * kBlockKv; ++j) {
        const double v = values[static_cast<size_t>(j * ev + c)];
        want += std::exp(s[j] - max) / sum * v;
        largest = std::max(largest, std::fabs(v));
      }
      // bf16 P: 2^-8 relative per probability.
      EXPECT_NEAR(out_acc[static_cast<size_t>(r * ev + c)] / row_sum[r], want,
                  std::ldexp(1.0, -8) * largest)
          << "row " << r << " column " << c;
    }
  }
}
#endif

void TestFusedTileMatchesFloat64() {
#if HWY_TARGET == HWY_AVX3
  if (!CpuHasBf16()) return;
  for (int64_t rows : {1, 37, 64}) {
    CheckTiles(rows, 40, 0.125f);
    CheckTiles(rows, 128, 0.08838834764831845f);  // 1 / sqrt(128), not a power of two
    CheckTiles(rows, 6, 1.0f);
  }
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::cpu {
HWY_BEFORE_TEST(QkSoftmaxBf16Test);
HWY_EXPORT_AND_TEST_P(QkSoftmaxBf16Test, TestFusedTileMatchesFloat64);
}  // namespace sdpa::cpu
#endif  // HWY_ONCE
