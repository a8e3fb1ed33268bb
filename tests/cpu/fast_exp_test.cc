// FastExp / FastExp2 / Exp2Unclamped (src/cpu/fast_exp-inl.h) against std::exp2 in double
// on every SIMD target this CPU runs: the softmax of every CPU flash kernel rests on them.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/fast_exp_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>
#include <limits>
#include <vector>

#include "cpu/fast_exp-inl.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Applies `fn` to x[i] one vector at a time; x.size() a multiple of the lanes.
template <class Fn>
std::vector<float> Map(const std::vector<float>& x, Fn fn) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); i += lanes) {
    hn::StoreU(fn(d, hn::LoadU(d, x.data() + i)), d, y.data() + i);
  }
  return y;
}

// Every 1/64 in [-131, 131] (exact binary fractions, so ties at half-integers occur),
// plus values just around the range's ends and FastExp's zero points; padded to a multiple of the
// lanes.
std::vector<float> Arguments() {
  std::vector<float> t;
  for (int i = -131 * 64; i <= 131 * 64; ++i) t.push_back(static_cast<float>(i) / 64.0f);
  for (float edge : {-126.0f, -125.5f, 127.0f, -87.0f}) {
    t.push_back(std::nextafter(edge, -1e9f));
    t.push_back(std::nextafter(edge, 1e9f));
  }
  while (t.size() % 64 != 0) t.push_back(0.3f);
  return t;
}

// Within its range [-126, 127] (outside it the callers zero the lanes or never go).
void TestExp2Unclamped() {
  const std::vector<float> t = Arguments();
  const std::vector<float> y = Map(t, [](auto d, auto v) { return Exp2Unclamped(d, v); });
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] < -126.0f || t[i] > 127.0f) continue;
    ASSERT_NEAR(y[i] / std::exp2(static_cast<double>(t[i])), 1.0, 4e-7) << "t = " << t[i];
  }
}

// A NaN argument (a NaN score) gives NaN, as PyTorch's softmax keeps it; -inf gives 0.
void TestNaNStaysNaN() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(64, -3.0f);
  for (size_t i = 0; i < x.size(); i += 3) x[i] = nan;
  for (size_t i = 1; i < x.size(); i += 7) x[i] = -inf;
  const std::vector<float> fast = Map(x, [](auto d, auto v) { return FastExp(d, v); });
  const std::vector<float> fast2 = Map(x, [](auto d, auto v) { return FastExp2(d, v); });
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      ASSERT_TRUE(std::isnan(fast[i])) << "lane " << i;
      ASSERT_TRUE(std::isnan(fast2[i])) << "lane " << i;
    } else if (std::isinf(x[i])) {
      ASSERT_EQ(fast[i], 0.0f) << "lane " << i;
      ASSERT_EQ(fast2[i], 0.0f) << "lane " << i;
    } else {
      ASSERT_NEAR(fast[i] / std::exp(-3.0), 1.0, 1e-6) << "lane " << i;
      ASSERT_NEAR(fast2[i] / std::exp2(-3.0), 1.0, 1e-6) << "lane " << i;
    }
  }
}

void TestFastExp2() {
  const std::vector<float> t = Arguments();
  const std::vector<float> y = Map(t, [](auto d, auto v) { return FastExp2(d, v); });
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] < -125.5f) {
      ASSERT_EQ(y[i], 0.0f) << "t = " << t[i];
    } else if (t[i] <= 127.0f) {
      ASSERT_NEAR(y[i] / std::exp2(static_cast<double>(t[i])), 1.0, 4e-7) << "t = " << t[i];
    }
  }
}

void TestFastExp() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {-inf, -1e30f, -88.0f, -87.5f, -20.0f, -1.0f, -1e-3f, 0.0f};
  for (int i = 0; i <= 87 * 32; ++i) x.push_back(-static_cast<float>(i) / 32.0f);
  while (x.size() % 64 != 0) x.push_back(-0.7f);
  const std::vector<float> y = Map(x, [](auto d, auto v) { return FastExp(d, v); });
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] < -87.0f) {
      ASSERT_EQ(y[i], 0.0f) << "x = " << x[i];  // masked scores give exact zeros
    } else {
      // x * log2e is rounded to float first: the error grows with |x| (|x| <= 87).
      ASSERT_NEAR(y[i] / std::exp(static_cast<double>(x[i])), 1.0, 4e-7 + 1.2e-7 * -x[i])
          << "x = " << x[i];
    }
  }
}

// Integer powers of two come out exact: both polynomials give exactly 1 at 0, so an
// online-softmax rescale exp(m - m) is exactly 1 (accumulators untouched) and so is the
// probability of a row's max.
void TestIntegerPowersAreExact() {
  std::vector<float> t;
  for (int n = -125; n <= 127; ++n) t.push_back(static_cast<float>(n));
  while (t.size() % 64 != 0) t.push_back(0.0f);
  const std::vector<float> exp2 = Map(t, [](auto d, auto v) { return Exp2Unclamped(d, v); });
  const std::vector<float> fast2 = Map(t, [](auto d, auto v) { return FastExp2(d, v); });
  for (size_t i = 0; i < t.size(); ++i) {
    const float want = std::exp2(t[i]);
    ASSERT_EQ(exp2[i], want) << "t = " << t[i];
    ASSERT_EQ(fast2[i], want) << "t = " << t[i];
  }
  const std::vector<float> zeros(64, 0.0f);
  for (float y : Map(zeros, [](auto d, auto v) { return FastExp(d, v); })) ASSERT_EQ(y, 1.0f);
  for (float y : Map(zeros, [](auto d, auto v) { return Exp2FractionBf16(d, v); })) {
    ASSERT_EQ(y, 1.0f);
  }
#if HWY_TARGET == HWY_AVX3
  const std::vector<float> bf16 = Map(zeros, [](auto d, auto v) {
    return Exp2OrZero</*kForBf16=*/true>(d, __mmask16{0xFFFF}, v);
  });
  for (float y : bf16) ASSERT_EQ(y, 1.0f);
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace sdpa::cpu {
HWY_BEFORE_TEST(FastExpTest);
HWY_EXPORT_AND_TEST_P(FastExpTest, TestExp2Unclamped);
HWY_EXPORT_AND_TEST_P(FastExpTest, TestNaNStaysNaN);
HWY_EXPORT_AND_TEST_P(FastExpTest, TestFastExp2);
HWY_EXPORT_AND_TEST_P(FastExpTest, TestFastExp);
HWY_EXPORT_AND_TEST_P(FastExpTest, TestIntegerPowersAreExact);
}  // namespace sdpa::cpu
#endif  // HWY_ONCE
