// Dropout: the keep rate, the mask layout documented in docs/semantics.md (Philox4x32-10,
// element n of [B, Hq, L, S] = word n % 4 of the block at counter (n / 4, offset), kept
// when the word >= p * 2^32), identical masks on MATH and FLASH, replay in the backward,
// and the generator's seed/offset behaviour.
//
// Reading the mask: with q = 0 every score is 0, so the softmax is uniform 1/S; with
// S = Ev and v = the identity per head, out[b, h, i, j] = keep[b, h, i, j] / (S (1 - p)).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::Generator;
using sdpa::PhiloxState;
using sdpa::SDPAOptions;
using sdpa::SDPBackend;

// Philox4x32-10 written from Salmon et al. (SC 2011) / Random123, independently of the
// library's copy; checked against Random123's known-answer vectors below.
std::array<uint32_t, 4> philox(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += 0x9E3779B9u;
      key[1] += 0xBB67AE85u;
    }
    const uint64_t prod0 = uint64_t{0xD2511F53u} * ctr[0];
    const uint64_t prod1 = uint64_t{0xCD9E8D57u} * ctr[2];
    const uint32_t hi0 = static_cast<uint32_t>(prod0 >> 32), lo0 = static_cast<uint32_t>(prod0);
    const uint32_t hi1 = static_cast<uint32_t>(prod1 >> 32), lo1 = static_cast<uint32_t>(prod1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
  }
  return ctr;
}

TEST(DropoutPhilox, ReferenceMatchesRandom123KnownAnswers) {
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(philox({0, 0, 0, 0}, {0, 0}), (A4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(
      philox({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
      (A4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(
      philox({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
      (A4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// The documented keep decision for element n.
bool expected_keep(const PhiloxState& state, double p, uint64_t n) {
  const uint64_t block = n / 4;
  const auto words =
      philox({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
              static_cast<uint32_t>(state.offset), static_cast<uint32_t>(state.offset >> 32)},
             {static_cast<uint32_t>(state.seed), static_cast<uint32_t>(state.seed >> 32)});
  return words[n % 4] >= static_cast<uint64_t>(p * 4294967296.0);
}

struct MaskProbe {
  int64_t batch, heads_q, heads_kv, q_len, kv_len;
};

// Runs the q = 0, v = identity probe on `backend` and returns keep[b, h, i, j] (row-major
// over [B, Hq, L, S]), checking every output is 0 or 1 / (S (1 - p)).
std::vector<bool> read_mask(SDPBackend backend, const MaskProbe& m, DType dtype, double p,
                            const PhiloxState& state) {
  const int64_t S = m.kv_len;
  const Tensor q = Tensor::zeros({m.batch, m.heads_q, m.q_len, 16}, dtype);
  const Tensor k = randn({m.batch, m.heads_kv, S, 16}, dtype, 3);
  Tensor v = Tensor::zeros({m.batch, m.heads_kv, S, S}, dtype);
  for (int64_t b = 0; b < m.batch; ++b) {
    for (int64_t h = 0; h < m.heads_kv; ++h) {
      for (int64_t j = 0; j < S; ++j) v.set_item(Shape{b, h, j, j}, 1.0);
    }
  }
  SDPAOptions o;
  o.dropout_p = p;
  o.dropout_state = state;
  o.enable_gqa = m.heads_q != m.heads_kv;
  sdpa::sdpa_kernel guard(backend);
  const sdpa::AttentionResult r = sdpa::scaled_dot_product_attention_with_lse(q, k, v, o);
  EXPECT_EQ(r.backend, backend);
  EXPECT_EQ(r.philox.seed, state.seed);
  EXPECT_EQ(r.philox.offset, state.offset);
  const double kept_value = 1.0 / (static_cast<double>(S) * (1.0 - p));
  std::vector<bool> keep;
  int bad = 0;
  for (double x : values(r.out)) {
    const bool kept = x > 0.5 * kept_value;
    // The kept value is 1 / (S (1 - p)) rounded once or twice in `dtype`.
    if (kept ? std::abs(x - kept_value) > default_tolerance(dtype) * kept_value : x != 0.0) {
      ++bad;
    }
    keep.push_back(kept);
  }
  EXPECT_EQ(bad, 0) << "outputs other than 0 and 1/(S(1-p)) on " << sdpa::backend_name(backend);
  return keep;
}

struct DropoutCase {
  std::string name;
  MaskProbe probe;
  double p;
  DType dtype;
};

class DropoutMask : public ::testing::TestWithParam<DropoutCase> {};

TEST_P(DropoutMask, MathAndFlashDropTheDocumentedElements) {
  const DropoutCase& c = GetParam();
  const PhiloxState state{0x123456789abcdefull, 5};
  const std::vector<bool> math = read_mask(SDPBackend::MATH, c.probe, c.dtype, c.p, state);
  const std::vector<bool> flash =
      read_mask(SDPBackend::FLASH_ATTENTION, c.probe, c.dtype, c.p, state);
  ASSERT_EQ(math.size(), flash.size());
  int64_t kept = 0, differ = 0, undocumented = 0;
  for (size_t n = 0; n < math.size(); ++n) {
    kept += math[n];
    differ += math[n] != flash[n];
    undocumented += math[n] != expected_keep(state, c.p, n);
  }
  EXPECT_EQ(differ, 0) << "MATH and FLASH drop different elements";
  // Every forced SIMD capability drops the same elements.
  for (const std::string& cap : supported_capabilities()) {
    ScopedCapability scoped(cap);
    EXPECT_TRUE(read_mask(SDPBackend::FLASH_ATTENTION, c.probe, c.dtype, c.p, state) == math)
        << "FLASH on " << cap << " drops different elements than MATH";
  }
  EXPECT_EQ(undocumented, 0) << "the mask differs from docs/semantics.md's Philox layout";
  // Keep count ~ Binomial(n, 1 - p): within 5 standard deviations.
  const double n = static_cast<double>(math.size());
  const double mean = n * (1.0 - c.p), sigma = std::sqrt(n * c.p * (1.0 - c.p));
  EXPECT_NEAR(static_cast<double>(kept), mean, 5 * sigma)
      << "keep rate " << kept / n << ", expected " << 1.0 - c.p;
}

INSTANTIATE_TEST_SUITE_P(
    Dropout, DropoutMask,
    ::testing::Values(DropoutCase{"P0_1", {2, 3, 3, 40, 150}, 0.1, DType::kFloat32},
                      DropoutCase{"P0_5Gqa", {1, 4, 2, 33, 70}, 0.5, DType::kFloat32},
                      DropoutCase{"P0_9", {1, 2, 2, 65, 129}, 0.9, DType::kFloat32},
                      DropoutCase{"P0_3Bf16", {1, 2, 1, 17, 67}, 0.3, DType::kBFloat16}),
    [](const ::testing::TestParamInfo<DropoutCase>& info) { return info.param.name; });

// ---- Outputs and gradients with dropout: FLASH vs MATH golden. -----------------------

struct RandomCase {
  std::string name;
  int64_t batch, heads_q, heads_kv, q_len, kv_len, dim_qk, dim_vo;
  bool causal;
  bool bool_mask;
  double p;
  DType dtype;
};

class DropoutGradients : public ::testing::TestWithParam<RandomCase> {};

TEST_P(DropoutGradients, FlashMatchesMathWithTheSameSeed) {
  const RandomCase& c = GetParam();
  const Tensor q = randn({c.batch, c.heads_q, c.q_len, c.dim_qk}, c.dtype, 21);
  const Tensor k = randn({c.batch, c.heads_kv, c.kv_len, c.dim_qk}, c.dtype, 22);
  const Tensor v = randn({c.batch, c.heads_kv, c.kv_len, c.dim_vo}, c.dtype, 23);
  const Tensor go = randn({c.batch, c.heads_q, c.q_len, c.dim_vo}, c.dtype, 24);
  SDPAOptions o;
  o.dropout_p = c.p;
  o.is_causal = c.causal;
  o.enable_gqa = c.heads_q != c.heads_kv;
  if (c.bool_mask) o.attn_mask = random_bool({c.q_len, c.kv_len}, 0.6, 25);
  Generator gen(2024);
  o.generator = &gen;
  auto run = [&](SDPBackend backend, bool in_f64) {
    gen.manual_seed(2024);  // every backend draws the same (seed, offset)
    return in_f64 ? run_fwd_bwd(backend, f64(q), f64(k), f64(v), f64(go), o)
                  : run_fwd_bwd(backend, q, k, v, go, o);
  };
  const FwdBwd golden = run(SDPBackend::MATH, true);
  const FwdBwd naive = run(SDPBackend::MATH, false);
  const FwdBwd flash = run(SDPBackend::FLASH_ATTENTION, false);
  EXPECT_EQ(flash.fwd.backend, SDPBackend::FLASH_ATTENTION);
  EXPECT_EQ(flash.fwd.philox.seed, 2024u);
  EXPECT_EQ(flash.fwd.philox.offset, 0u);
  EXPECT_EQ(golden.fwd.philox.offset, 0u);
  expect_matches_golden(flash, golden, naive, c.dtype);

  // Sanity: dropout changed the result (the comparison above is not a p = 0 comparison).
  SDPAOptions no_drop = o;
  no_drop.dropout_p = 0;
  const FwdBwd plain = run_fwd_bwd(SDPBackend::FLASH_ATTENTION, q, k, v, go, no_drop);
  EXPECT_GT(scaled_error(flash.fwd.out, plain.fwd.out), 1e-2);
  // lse is that of the undropped scores.
  EXPECT_TRUE(
      close_to("lse with dropout vs without", flash.fwd.lse, plain.fwd.lse, DType::kFloat32));
}

INSTANTIATE_TEST_SUITE_P(
    Dropout, DropoutGradients,
    ::testing::Values(
        RandomCase{"Plain", 2, 2, 2, 63, 65, 64, 64, false, false, 0.2, DType::kFloat32},
        RandomCase{"CausalGqa", 1, 6, 3, 130, 257, 24, 80, true, false, 0.5, DType::kFloat32},
        RandomCase{"BoolMask", 1, 2, 2, 257, 63, 80, 24, false, true, 0.3, DType::kFloat32},
        RandomCase{"Bf16", 1, 4, 2, 65, 130, 64, 64, true, false, 0.1, DType::kBFloat16},
        RandomCase{"F16", 1, 2, 1, 7, 1000, 128, 128, false, false, 0.4, DType::kFloat16}),
    [](const ::testing::TestParamInfo<RandomCase>& info) { return info.param.name; });

// ---- Generator behaviour. ------------------------------------------------------------

struct SmallInputs {
  Tensor q = randn({1, 2, 70, 32}, DType::kFloat32, 31);
  Tensor k = randn({1, 2, 90, 32}, DType::kFloat32, 32);
  Tensor v = randn({1, 2, 90, 32}, DType::kFloat32, 33);
};

sdpa::AttentionResult dropout_forward(const SmallInputs& in, Generator* gen,
                                      SDPBackend backend = SDPBackend::FLASH_ATTENTION) {
  SDPAOptions o;
  o.dropout_p = 0.3;
  o.generator = gen;
  sdpa::sdpa_kernel guard(backend);
  return sdpa::scaled_dot_product_attention_with_lse(in.q, in.k, in.v, o);
}

TEST(DropoutGenerator, SameSeedGivesIdenticalResults) {
  const SmallInputs in;
  for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    Generator a(77), b(77);
    const auto ra = dropout_forward(in, &a, backend), rb = dropout_forward(in, &b, backend);
    EXPECT_TRUE(bit_identical(ra.out, rb.out)) << sdpa::backend_name(backend);
    EXPECT_EQ(ra.philox.seed, 77u);
    EXPECT_EQ(rb.philox.offset, ra.philox.offset);
  }
}

TEST(DropoutGenerator, DifferentSeedsGiveDifferentMasks) {
  const SmallInputs in;
  Generator a(77), b(78);
  const auto ra = dropout_forward(in, &a), rb = dropout_forward(in, &b);
  EXPECT_FALSE(bit_identical(ra.out, rb.out));
  EXPECT_GT(scaled_error(ra.out, rb.out), 1e-2);
}

TEST(DropoutGenerator, ConsecutiveCallsAdvanceTheOffset) {
  const SmallInputs in;
  Generator gen(5);
  const auto first = dropout_forward(in, &gen), second = dropout_forward(in, &gen);
  EXPECT_EQ(first.philox.seed, 5u);
  EXPECT_EQ(second.philox.seed, 5u);
  EXPECT_EQ(second.philox.offset, first.philox.offset + 1);
  EXPECT_FALSE(bit_identical(first.out, second.out));
  EXPECT_GT(scaled_error(first.out, second.out), 1e-2);
  // manual_seed rewinds: the next call repeats the first.
  gen.manual_seed(5);
  const auto again = dropout_forward(in, &gen);
  EXPECT_EQ(again.philox.offset, first.philox.offset);
  EXPECT_TRUE(bit_identical(first.out, again.out));
}

TEST(DropoutGenerator, DefaultGeneratorFollowsManualSeed) {
  const SmallInputs in;
  sdpa::manual_seed(99);
  const auto first = dropout_forward(in, nullptr);
  const auto second = dropout_forward(in, nullptr);
  sdpa::manual_seed(99);
  const auto replay = dropout_forward(in, nullptr);
  EXPECT_EQ(first.philox.seed, 99u);
  EXPECT_EQ(second.philox.offset, first.philox.offset + 1);
  EXPECT_TRUE(bit_identical(first.out, replay.out));
  EXPECT_FALSE(bit_identical(first.out, second.out));
}

TEST(DropoutGenerator, DropoutStateReplaysWithoutTouchingTheGenerator) {
  const SmallInputs in;
  Generator gen(11);
  const auto drawn = dropout_forward(in, &gen);
  SDPAOptions o;
  o.dropout_p = 0.3;
  o.generator = &gen;
  o.dropout_state = drawn.philox;
  sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  const auto replay = sdpa::scaled_dot_product_attention_with_lse(in.q, in.k, in.v, o);
  EXPECT_TRUE(bit_identical(drawn.out, replay.out));
  // The generator was not advanced by the replay: the next draw is offset 1.
  EXPECT_EQ(gen.next().offset, drawn.philox.offset + 1);
}

TEST(DropoutBackward, WithoutDropoutStateThrows) {
  const SmallInputs in;
  for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    Generator gen(3);
    const auto fwd = dropout_forward(in, &gen, backend);
    SDPAOptions o;
    o.dropout_p = 0.3;
    o.generator = &gen;
    sdpa::sdpa_kernel guard(backend);
    const std::string msg = error_message([&] {
      sdpa::scaled_dot_product_attention_backward(fwd.out, in.q, in.k, in.v, fwd.out, fwd.lse, o);
    });
    EXPECT_THAT(msg, ::testing::HasSubstr("dropout_state")) << sdpa::backend_name(backend);
  }
}

TEST(DropoutBackward, WrongDropoutStateGivesDifferentGradients) {
  // The backward really regenerates the mask from dropout_state: replaying another offset
  // changes grad_v (a check that the state is not ignored).
  const SmallInputs in;
  const Tensor go = randn({1, 2, 70, 32}, DType::kFloat32, 34);
  SDPAOptions o;
  o.dropout_p = 0.3;
  o.dropout_state = PhiloxState{8, 0};
  const FwdBwd right = run_fwd_bwd(SDPBackend::FLASH_ATTENTION, in.q, in.k, in.v, go, o);
  SDPAOptions wrong = o;
  wrong.dropout_state = PhiloxState{8, 1};
  sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  const auto g = sdpa::scaled_dot_product_attention_backward(go, in.q, in.k, in.v, right.fwd.out,
                                                             right.fwd.lse, wrong);
  EXPECT_GT(scaled_error(g.grad_v, right.grads.grad_v), 1e-2);
}

}  // namespace
}  // namespace sdpa_test
