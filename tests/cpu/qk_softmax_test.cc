// QkSoftmaxTileBf16 and QkSoftmaxTileF32 (src/cpu/qk_softmax_{bf16,f32}-inl.h), the fused
// q.k^T and lazy-max online softmax of the AVX-512 forward, against float64 over a run of
// key tiles: attention outputs and logsumexps assembled from their P, alpha and sums as
// FlashQBlock does, and each tile's probabilities relative to the row's running max. Row
// maxes rise within the slack on some rows (no rescale), past it on others (rescale) and
// fall on others; row counts leave register-tile tails (37 = 6 x 6 + 1, 64 = 10 x 6 + 4).
// The bf16 kernel runs where the CPU has AVX512_BF16; the kernel tests cover both end to
// end as well.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/qk_softmax_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/bf16_bits.h"
#include "cpu/qk_softmax_bf16-inl.h"
#include "cpu/qk_softmax_f32-inl.h"
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

// What differs between the two kernels' inputs and outputs. bf16: q and k rounded to
// bf16, q unscaled (the kernel multiplies the scale in). float32: q carries the scale.
template <bool kBf16>
struct TileKernel {
  std::vector<uint16_t> q_bits, k_pairs, p_bits;  // bf16
  std::vector<float> q, k_t, p;                   // float32
  int64_t head_dim = 0;

  // The value the kernel sees for x (bf16-rounded or not).
  static float Input(float x) {
    return kBf16 ? static_cast<float>(Bf16ToDouble(ToBf16Bits(x))) : x;
  }
  void Run(int64_t rows, float score_scale, const SoftmaxRows& state) {
    if constexpr (kBf16) {
      QkSoftmaxTileBf16({q_bits.data(), head_dim, rows}, {k_pairs.data(), head_dim / 2},
                        score_scale, state, p_bits.data());
    } else {
      QkSoftmaxTileF32({q.data(), head_dim, rows}, {k_t.data(), head_dim}, state, p.data());
    }
  }
  double P(int64_t i) const {
    return kBf16 ? Bf16ToDouble(p_bits[static_cast<size_t>(i)]) : p[static_cast<size_t>(i)];
  }
};

template <bool kBf16>
void CheckTiles(int64_t rows, int64_t head_dim, float score_scale) {
  constexpr int kTiles = 4;
  const int64_t ev = 3;  // a few value columns suffice
  // Relative error of P. bf16: its rounding (2^-8), the polynomial (2.7e-6) and the float32
  // score and exponent argument (|t| < 60: < 2e-5). float32: the polynomial (1e-7) and the
  // absolute error of the score's float32 sum (the standard bound: depth rounding errors
  // relative to the sum of |products|) and of subtracting the max.
  const auto p_tolerance = [&](double abs_products, double m) {
    return kBf16 ? std::ldexp(1.0, -8) + 5e-5
                 : 1e-6 + std::ldexp(static_cast<double>(head_dim + 4), -24) *
                              (abs_products + std::fabs(m));
  };
  std::mt19937 rng(static_cast<uint32_t>(rows * 131 + head_dim));
  std::normal_distribution<float> normal;
  TileKernel<kBf16> kernel;
  kernel.head_dim = head_dim;
  // Elements 0..3 of q are one-hot in the row kind r % 4, and element e < 4 of every key
  // of a tile is Offset(e, tile) / score_scale plus noise: the scaled scores of row r then
  // move by Offset(r % 4, tile) from tile to tile. qf: q as the float64 reference takes
  // it, with the scale that the kernel applies.
  const size_t q_size = static_cast<size_t>(rows * head_dim);
  std::vector<float> qf(q_size);
  kernel.q_bits.resize(q_size);
  kernel.q.resize(q_size);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t e = 0; e < head_dim; ++e) {
      const float x = e < 4 ? (e == r % 4 ? 1.0f : 0.0f) : 0.5f * normal(rng);
      const size_t i = static_cast<size_t>(r * head_dim + e);
      kernel.q_bits[i] = ToBf16Bits(x);
      kernel.q[i] = x * score_scale;
      qf[i] = kBf16 ? TileKernel<kBf16>::Input(x) : kernel.q[i];
    }
  }
  const double reference_scale = kBf16 ? score_scale : 1.0;
  std::vector<double> out_acc(static_cast<size_t>(rows * ev), 0.0);
  std::vector<double> want_scores(static_cast<size_t>(rows * kTiles * kBlockKv));
  std::vector<double> abs_products(want_scores.size());  // sum of |q_e k_e| of each score
  std::vector<double> values(static_cast<size_t>(kTiles * kBlockKv * ev));
  for (double& v : values) v = normal(rng);

  alignas(64) float row_max[kBlockQ], row_sum[kBlockQ], alpha[kBlockQ];
  alignas(64) float sum_lanes[kBlockQ * 16];
  std::fill(row_max, row_max + kBlockQ, kNegInf);
  std::fill(row_sum, row_sum + kBlockQ, 0.0f);
  std::fill(sum_lanes, sum_lanes + kBlockQ * 16, 0.0f);
  const SoftmaxRows state{row_max, row_sum, alpha, nullptr, 0, sum_lanes};
  kernel.p_bits.resize(static_cast<size_t>(rows * kBlockKv));
  kernel.p.resize(static_cast<size_t>(rows * kBlockKv));
  kernel.k_pairs.resize(static_cast<size_t>(round_up(head_dim, 2) * kBlockKv));
  kernel.k_t.resize(static_cast<size_t>(head_dim * kBlockKv));
  for (int tile = 0; tile < kTiles; ++tile) {
    std::vector<float> kf(static_cast<size_t>(kBlockKv * head_dim));
    for (int64_t j = 0; j < kBlockKv; ++j) {
      for (int64_t e = 0; e < head_dim; ++e) {
        const float x = e < 4 ? (Offset(e, tile) + 0.25f * normal(rng)) / score_scale : normal(rng);
        kf[static_cast<size_t>(j * head_dim + e)] = TileKernel<kBf16>::Input(x);
        kernel.k_pairs[static_cast<size_t>((e / 2) * 2 * kBlockKv + 2 * j + e % 2)] = ToBf16Bits(x);
        kernel.k_t[static_cast<size_t>(e * kBlockKv + j)] = x;
      }
    }
    // As FlashQBlock before a tile that takes the unfused path: row_sum then holds earlier
    // tiles' sums when a later tile raises the max.
    if (tile == 2) FoldSumLanes(state, rows);
    kernel.Run(rows, score_scale, state);
    for (int64_t r = 0; r < rows; ++r) {
      double tile_max = -HUGE_VAL;
      for (int64_t j = 0; j < kBlockKv; ++j) {
        double s = 0.0, abs_sum = 0.0;
        for (int64_t e = 0; e < head_dim; ++e) {
          const double product = static_cast<double>(qf[static_cast<size_t>(r * head_dim + e)]) *
                                 kf[static_cast<size_t>(j * head_dim + e)];
          s += product;
          abs_sum += std::fabs(product);
        }
        s *= reference_scale;
        const size_t i = static_cast<size_t>((r * kTiles + tile) * kBlockKv + j);
        want_scores[i] = s;
        abs_products[i] = abs_sum * reference_scale;
        tile_max = std::max(tile_max, s);
      }
      // The running max trails the true one by less than the slack (ln 2^8 in scaled
      // units), and this tile's probabilities are relative to it.
      const double m = row_max[r];
      ASSERT_LE(tile_max - m, kLazyMaxSlackLog2 * std::log(2.0) + 1e-3)
          << "row " << r << " tile " << tile;
      for (int64_t j = 0; j < kBlockKv; ++j) {
        const size_t i = static_cast<size_t>((r * kTiles + tile) * kBlockKv + j);
        const double want = std::exp(want_scores[i] - m);
        ASSERT_NEAR(kernel.P(r * kBlockKv + j), want,
                    p_tolerance(abs_products[i], m) * want + 1e-30)
            << "row " << r << " key " << j << " tile " << tile;
      }
      for (int64_t c = 0; c < ev; ++c) {
        double& acc = out_acc[static_cast<size_t>(r * ev + c)];
        acc *= alpha[r];
        for (int64_t j = 0; j < kBlockKv; ++j) {
          acc += kernel.P(r * kBlockKv + j) *
                 values[static_cast<size_t>((tile * kBlockKv + j) * ev + c)];
        }
      }
    }
  }
  FoldSumLanes(state, rows);
  for (int64_t r = 0; r < rows; ++r) {
    double max = -HUGE_VAL, sum = 0.0;
    const double* s = want_scores.data() + r * kTiles * kBlockKv;
    for (int64_t j = 0; j < kTiles * kBlockKv; ++j) max = std::max(max, s[j]);
    for (int64_t j = 0; j < kTiles * kBlockKv; ++j) sum += std::exp(s[j] - max);
    const double want_lse = max + std::log(sum);
    EXPECT_NEAR(row_max[r] + std::log(static_cast<double>(row_sum[r])), want_lse,
                2e-5 * std::max(1.0, std::fabs(want_lse)))
        << "row " << r;
    // The largest P tolerance of the row's scores (against its final max: the largest
    // probabilities weigh most).
    double tolerance = 0.0;
    for (int64_t j = 0; j < kTiles * kBlockKv; ++j) {
      tolerance =
          std::max(tolerance,
                   p_tolerance(abs_products[static_cast<size_t>(r * kTiles * kBlockKv + j)], max));
    }
    for (int64_t c = 0; c < ev; ++c) {
      double want = 0.0, largest = 0.0;
      for (int64_t j = 0; j < kTiles * kBlockKv; ++j) {
        const double v = values[static_cast<size_t>(j * ev + c)];
        want += std::exp(s[j] - max) / sum * v;
        largest = std::max(largest, std::fabs(v));
      }
      EXPECT_NEAR(out_acc[static_cast<size_t>(r * ev + c)] / row_sum[r], want, tolerance * largest)
          << "row " << r << " column " << c;
    }
  }
}
#endif

void TestBf16TileMatchesFloat64() {
#if HWY_TARGET == HWY_AVX3
  if (!CpuHasBf16()) return;
  for (int64_t rows : {1, 37, 64}) {
    CheckTiles<true>(rows, 40, 0.125f);
    CheckTiles<true>(rows, 128, 0.08838834764831845f);  // 1 / sqrt(128), not a power of two
    CheckTiles<true>(rows, 6, 1.0f);
  }
#endif
}

void TestF32TileMatchesFloat64() {
#if HWY_TARGET == HWY_AVX3
  for (int64_t rows : {1, 37, 64}) {
    CheckTiles<false>(rows, 7, 1.0f);
    CheckTiles<false>(rows, 64, 0.125f);
    CheckTiles<false>(rows, 128, 0.08838834764831845f);
  }
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::cpu {
HWY_BEFORE_TEST(QkSoftmaxTest);
HWY_EXPORT_AND_TEST_P(QkSoftmaxTest, TestBf16TileMatchesFloat64);
HWY_EXPORT_AND_TEST_P(QkSoftmaxTest, TestF32TileMatchesFloat64);
}  // namespace sdpa::cpu
#endif  // HWY_ONCE
