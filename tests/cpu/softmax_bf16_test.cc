// SoftmaxTileToBf16 (src/cpu/softmax_bf16-inl.h), the online softmax of the vdpbf16ps
// kernels, against float64 over two successive key tiles: running maxes, the factors
// alpha, the running sums and the bf16 probabilities, on rows with masked keys, fully
// masked rows and a row count that is not a multiple of the vector width. Runs where the
// CPU has AVX512_BF16; the kernel tests cover it end to end as well.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/softmax_bf16_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/bf16_bits.h"
#include "cpu/softmax_bf16-inl.h"
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX3
using test::Bf16ToDouble;
using test::CpuHasBf16;

// A tile of `rows` score rows: normal scores of standard deviation 3 around a per-row
// offset; when `masked`, every 5th key of row 3k is -inf and row 7 is fully masked. Tile 1
// moves some rows' offsets up (their maxes rise) and others down.
std::vector<float> ScoreTile(int64_t rows, int tile, bool masked, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> s(static_cast<size_t>(rows * kBlockKv));
  for (int64_t r = 0; r < rows; ++r) {
    const float offset = tile == 0 ? 0.0f : (r % 2 == 0 ? 6.0f : -6.0f);
    for (int64_t j = 0; j < kBlockKv; ++j) {
      float& x = s[static_cast<size_t>(r * kBlockKv + j)];
      x = offset + normal(rng);
      if (masked && ((r % 3 == 0 && j % 5 == 0) || r == 7)) x = kNegInf;
    }
  }
  return s;
}

void CheckTwoTiles(float score_scale, bool masked) {
  constexpr int64_t rows = 37;
  constexpr int64_t padded = 48;  // round_up(rows, 16)
  std::mt19937 rng(1234);
  std::vector<float> row_max(padded, kNegInf), row_sum(padded, 0.0f), alpha(padded);
  std::vector<double> want_sum(rows, 0.0), want_max(rows, -HUGE_VAL);
  std::vector<uint16_t> p(static_cast<size_t>(rows * kBlockKv));
  for (int tile = 0; tile < 2; ++tile) {
    std::vector<float> s = ScoreTile(rows, tile, masked, rng);
    SoftmaxTileToBf16({s.data(), rows, score_scale},
                      {row_max.data(), row_sum.data(), alpha.data(), nullptr, 0}, p.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = s.data() + r * kBlockKv;
      float tile_max = kNegInf;
      for (int64_t j = 0; j < kBlockKv; ++j) tile_max = std::max(tile_max, row[j]);
      const float old_max = static_cast<float>(want_max[r]);
      const float new_max = std::max(old_max, tile_max * score_scale);
      ASSERT_EQ(row_max[r], new_max) << "row " << r << " tile " << tile;
      double want_alpha = 1.0;
      if (new_max != kNegInf) want_alpha = old_max == kNegInf ? 0.0 : std::exp(old_max - new_max);
      ASSERT_NEAR(alpha[r], want_alpha, 3e-6 * want_alpha) << "row " << r << " tile " << tile;
      double tile_sum = 0.0;
      for (int64_t j = 0; j < kBlockKv; ++j) {
        const double want = new_max == kNegInf
                                ? 0.0
                                : std::exp(static_cast<double>(row[j]) * score_scale - new_max);
        tile_sum += want;
        // bf16 rounding (8 significant bits: 2^-8 relative) plus the float32 value's error:
        // the polynomial's 2.7e-6 and the exponent argument's rounding (|t| < 40: < 6e-6).
        ASSERT_NEAR(Bf16ToDouble(p[static_cast<size_t>(r * kBlockKv + j)]), want,
                    (std::ldexp(1.0, -8) + 1e-5) * want)
            << "row " << r << " key " << j << " tile " << tile;
      }
      want_sum[r] = want_sum[r] * want_alpha + tile_sum;
      want_max[r] = new_max;
      ASSERT_NEAR(row_sum[r], want_sum[r], 1e-5 * want_sum[r]) << "row " << r << " tile " << tile;
    }
  }
  if (masked) EXPECT_EQ(row_sum[7], 0.0f);  // the fully masked row
}
#endif

void TestPrescaledScores() {
#if HWY_TARGET == HWY_AVX3
  if (!CpuHasBf16()) return;
  for (bool masked : {true, false}) CheckTwoTiles(1.0f, masked);
#endif
}

void TestScaleFoldedIntoExponent() {
#if HWY_TARGET == HWY_AVX3
  if (!CpuHasBf16()) return;
  for (bool masked : {true, false}) {
    CheckTwoTiles(0.125f, masked);
    CheckTwoTiles(0.08838834764831845f, masked);  // 1 / sqrt(128), not a power of two
  }
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::cpu {
HWY_BEFORE_TEST(SoftmaxBf16Test);
HWY_EXPORT_AND_TEST_P(SoftmaxBf16Test, TestPrescaledScores);
HWY_EXPORT_AND_TEST_P(SoftmaxBf16Test, TestScaleFoldedIntoExponent);
}  // namespace sdpa::cpu
#endif  // HWY_ONCE
