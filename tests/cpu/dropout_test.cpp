// Dropout on every backend: the exact documented Philox mask (checked against an
// independent Philox in tests/common), MATH/FLASH agreement, seeding, generator offsets and
// the keep rate.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "common/harness.h"

namespace sdpa::test {
namespace {

// Every backend drops exactly the elements the documented rule drops, scaled by 1/(1-p).
TEST(Dropout, EveryBackendMatchesDocumentedPhiloxMask) {
  const std::pair<int64_t, int64_t> lengths[] = {{1, 7}, {7, 63}, {65, 257}, {257, 65}};
  for (const auto& [l, s] : lengths) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
      for (double p : {0.3, 0.9}) {
        Case c;
        c.batch = 2;
        c.heads_q = 4;
        c.heads_kv = 2;
        c.enable_gqa = true;
        c.q_len = l;
        c.kv_len = s;
        c.head_dim = 24;
        c.dtype = dtype;
        c.dropout_p = p;
        c.causal = l > s;
        c.philox = {0x1234567890abcdefull + static_cast<uint64_t>(l), static_cast<uint64_t>(s)};
        const CaseReport r = check_case(c);
        EXPECT_TRUE(r.ran_backend(SDPBackend::MATH)) << c.describe();
        EXPECT_TRUE(r.ran_backend(SDPBackend::FLASH_ATTENTION))
            << c.describe() << ": "
            << (r.not_supported.count(SDPBackend::FLASH_ATTENTION)
                    ? r.not_supported.at(SDPBackend::FLASH_ATTENTION)
                    : "");
      }
    }
  }
}

TEST(Dropout, WithMaskAndMaskedRows) {
  Case c;
  c.heads_q = c.heads_kv = 2;
  c.q_len = 33;
  c.kv_len = 70;
  c.mask = MaskKind::kFloat;
  c.mask_shape = {33, 70};
  c.masked_rows = {4};
  c.dropout_p = 0.5;
  c.philox = {77, 3};
  const CaseReport r = check_case(c);
  EXPECT_TRUE(r.ran_backend(SDPBackend::MATH));
  EXPECT_TRUE(r.ran_backend(SDPBackend::FLASH_ATTENTION));
  // Unbatched: element indices run over [1, Hq, L, S].
  c.unbatched = true;
  c.q_layout = Layout::kBSHD;
  const CaseReport u = check_case(c);
  EXPECT_TRUE(u.ran_backend(SDPBackend::MATH));
  EXPECT_TRUE(u.ran_backend(SDPBackend::FLASH_ATTENTION));
}

struct Inputs {
  Tensor q, k, v;
};
Inputs make_qkv(int64_t b, int64_t h, int64_t l, int64_t s, int64_t e, uint32_t seed) {
  std::mt19937 rng(seed);
  return {random_tensor({b, h, l, e}, DType::kFloat32, Layout::kBHSD, rng),
          random_tensor({b, h, s, e}, DType::kFloat32, Layout::kBHSD, rng),
          random_tensor({b, h, s, e}, DType::kFloat32, Layout::kBHSD, rng)};
}

Tensor run_with_generator(const Inputs& in, SDPBackend backend, uint64_t seed, double p,
                          PhiloxState* used = nullptr) {
  Generator gen(seed);
  SDPAOptions o;
  o.dropout_p = p;
  o.generator = &gen;
  sdpa_kernel guard(backend);
  AttentionResult r = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, o);
  EXPECT_EQ(r.backend, backend);
  if (used) *used = r.philox;
  return r.out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = to_doubles(a), y = to_doubles(b);
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

TEST(Dropout, MathAndFlashAgreeForTheSameSeed) {
  const Inputs in = make_qkv(2, 3, 65, 129, 64, 1);
  const Tensor math = run_with_generator(in, SDPBackend::MATH, 2024, 0.3);
  const Tensor flash = run_with_generator(in, SDPBackend::FLASH_ATTENTION, 2024, 0.3);
  // Same dropped elements: only float32 rounding differs (outputs are O(1)).
  EXPECT_LT(max_abs_diff(math, flash), 1e-5);
}

TEST(Dropout, SameSeedSameOutputDifferentSeedDifferentOutput) {
  const Inputs in = make_qkv(1, 2, 33, 40, 24, 2);
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    PhiloxState s1, s2, s3;
    const Tensor a = run_with_generator(in, b, 7, 0.3, &s1);
    const Tensor again = run_with_generator(in, b, 7, 0.3, &s2);
    const Tensor other = run_with_generator(in, b, 8, 0.3, &s3);
    EXPECT_EQ(to_doubles(a), to_doubles(again)) << backend_name(b);
    EXPECT_GT(max_abs_diff(a, other), 1e-2) << backend_name(b);
    EXPECT_EQ(s1.seed, 7u);
    EXPECT_EQ(s1.offset, 0u);
    EXPECT_EQ(s3.seed, 8u);
  }
}

// Each call with dropout takes (seed, offset) and advances the offset by one, so two
// consecutive calls draw different masks; replaying the first state reproduces the first.
TEST(Dropout, GeneratorOffsetAdvancesPerCallAndReplays) {
  const Inputs in = make_qkv(1, 2, 20, 30, 16, 3);
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    sdpa_kernel guard(b);
    Generator gen(99);
    SDPAOptions o;
    o.dropout_p = 0.4;
    o.generator = &gen;
    const AttentionResult first = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, o);
    const AttentionResult second = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, o);
    EXPECT_EQ(first.philox.seed, 99u);
    EXPECT_EQ(first.philox.offset, 0u);
    EXPECT_EQ(second.philox.offset, 1u);
    EXPECT_GT(max_abs_diff(first.out, second.out), 1e-2) << backend_name(b);
    EXPECT_EQ(gen.next().offset, 2u);

    SDPAOptions replay = o;
    replay.dropout_state = first.philox;
    const AttentionResult again = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, replay);
    EXPECT_EQ(to_doubles(again.out), to_doubles(first.out)) << backend_name(b);
    EXPECT_EQ(gen.next().offset, 3u) << "a replayed call must not draw from the generator";
  }
}

// Calls without dropout do not consume generator state.
TEST(Dropout, NoDropoutDoesNotAdvanceTheGenerator) {
  const Inputs in = make_qkv(1, 1, 4, 5, 8, 4);
  Generator gen(5);
  SDPAOptions o;
  o.generator = &gen;
  scaled_dot_product_attention(in.q, in.k, in.v, o);
  EXPECT_EQ(gen.next().offset, 0u);
}

// The default generator is used when none is given, and sdpa::manual_seed reseeds it.
TEST(Dropout, DefaultGeneratorIsReseededByManualSeed) {
  const Inputs in = make_qkv(1, 2, 16, 24, 8, 5);
  SDPAOptions o;
  o.dropout_p = 0.5;
  manual_seed(31337);
  const AttentionResult a = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, o);
  manual_seed(31337);
  const AttentionResult b = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, o);
  EXPECT_EQ(a.philox.seed, 31337u);
  EXPECT_EQ(a.philox.offset, 0u);
  EXPECT_EQ(to_doubles(a.out), to_doubles(b.out));
}

// With V = ones every output element is (sum of kept probabilities) / (1 - p). Over N rows
// of S keys with uniform scores (q = 0 is avoided: k = 0 gives uniform softmax instead) the
// kept count per row is Binomial(S, 1 - p), so the mean over rows of out is 1 with standard
// deviation sqrt(p / ((1 - p) N S)).
TEST(Dropout, KeepRateIsStatisticallyOneMinusP) {
  const int64_t b = 2, h = 4, l = 256, s = 256, e = 8;
  std::mt19937 rng(6);
  const Tensor q = random_tensor({b, h, l, e}, DType::kFloat32, Layout::kBHSD, rng);
  const Tensor k = Tensor::full({b, h, s, e}, 0.25, DType::kFloat32);  // equal scores per row
  const Tensor v = Tensor::full({b, h, s, e}, 1.0, DType::kFloat32);
  for (double p : {0.1, 0.3, 0.7}) {
    for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
      sdpa_kernel guard(backend);
      Generator gen(123);
      SDPAOptions o;
      o.dropout_p = p;
      o.generator = &gen;
      const auto out = to_doubles(scaled_dot_product_attention(q, k, v, o));
      double sum = 0;
      for (double x : out) sum += x;
      const double rows = static_cast<double>(b * h * l);
      const double mean = sum / static_cast<double>(out.size());
      const double sd = std::sqrt(p / ((1 - p) * rows * static_cast<double>(s)));
      EXPECT_NEAR(mean, 1.0, 5 * sd) << backend_name(backend) << " p=" << p;
      // Each element is (kept count / S) / (1 - p): a multiple of 1 / (S (1 - p)).
      const double quantum = 1.0 / (static_cast<double>(s) * (1 - p));
      for (size_t i = 0; i < out.size(); i += 97) {
        const double kept = out[i] / quantum;
        EXPECT_NEAR(kept, std::round(kept), 1e-3) << backend_name(backend) << " p=" << p;
      }
      // All Ev columns of a row see the same dropped keys.
      for (int64_t row = 0; row < 8; ++row) {
        for (int64_t c = 1; c < e; ++c) EXPECT_NEAR(out[row * e + c], out[row * e], 1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace sdpa::test
