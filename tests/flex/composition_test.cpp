// Composition: flex with dropout (MATH and FLASH draw the same mask from the same
// Generator seed), with an attn_mask (AttnBias or tensor) and is_causal, with strided
// inputs; explain() shows the program and the block picture; programs are cached by
// structure, not captured values; from_expr over several traced roots.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "flash_check.h"
#include "flex_test_util.h"
#include "sdpa/attn_bias.h"
#include "sdpa/flex_mods.h"

namespace flex_test {
namespace {

using sdpa::AttnMask;
using sdpa::SDPAOptions;
using sdpa::SDPBackend;
using sdpa::flex::BlockMask;
using sdpa::flex::Expr;
using sdpa::flex::Program;
namespace mods = sdpa::flex::mods;

TEST(FlexComposition, DropoutSameSeedAgreesAcrossBackends) {
  const int64_t B = 2, H = 2, L = 70, S = 90, E = 16, Ev = 16;
  const Inputs in = inputs(B, H, H, L, S, E, Ev, 100);
  const Program sm = Program::from_score_mod(mods::soft_cap(3.0));
  const BlockMask bm = sdpa::flex::create_block_mask(mods::prefix_lm(10), B, H, L, S, 32);
  constexpr uint64_t kSeed = 20240607;
  auto run = [&](SDPBackend backend, DType dtype, double p) {
    sdpa::Generator gen(kSeed);
    SDPAOptions opts;
    opts.dropout_p = p;
    opts.generator = &gen;
    sdpa::sdpa_kernel guard(backend);
    const auto r = sdpa::flex_attention(in.q.to(dtype), in.k.to(dtype), in.v.to(dtype), sm, &bm, opts);
    opts.dropout_state = r.philox;
    const auto g = sdpa::flex_attention_backward(in.dout.to(dtype), in.q.to(dtype), in.k.to(dtype),
                                                 in.v.to(dtype), r.out, r.lse, sm, &bm, opts);
    return std::make_pair(r, g);
  };
  const auto [m64, gm64] = run(SDPBackend::MATH, DType::kFloat64, 0.3);
  const auto [m32, gm32] = run(SDPBackend::MATH, DType::kFloat32, 0.3);
  const auto [f32, gf32] = run(SDPBackend::FLASH_ATTENTION, DType::kFloat32, 0.3);
  const auto [nodrop, gnodrop] = run(SDPBackend::MATH, DType::kFloat64, 0.0);
  EXPECT_EQ(m64.philox.seed, f32.philox.seed);
  EXPECT_EQ(m64.philox.offset, f32.philox.offset);
  // Dropout did act: the output moved by far more than any tolerance.
  EXPECT_GT(max_abs_diff(m64.out, nodrop.out), 0.05);
  EXPECT_TRUE(all_close(f32.out, m64.out, tolerance(DType::kFloat32, max_abs_diff(m32.out, m64.out), kFudgeOut), "FLASH out"));
  EXPECT_TRUE(all_close(f32.lse, m64.lse, tolerance(DType::kFloat32, max_abs_diff(m32.lse, m64.lse), kFudgeLse), "FLASH lse"));
  EXPECT_TRUE(all_close(gf32.grad_q, gm64.grad_q, tolerance(DType::kFloat32, max_abs_diff(gm32.grad_q, gm64.grad_q), kFudgeGradQ), "FLASH grad_q"));
  EXPECT_TRUE(all_close(gf32.grad_k, gm64.grad_k, tolerance(DType::kFloat32, max_abs_diff(gm32.grad_k, gm64.grad_k), kFudgeGradK), "FLASH grad_k"));
  EXPECT_TRUE(all_close(gf32.grad_v, gm64.grad_v, tolerance(DType::kFloat32, max_abs_diff(gm32.grad_v, gm64.grad_v), kFudgeGradV), "FLASH grad_v"));
}

// A padding AttnBias, a float tensor and a bool tensor as attn_mask, and is_causal, each
// composed with a score_mod and a BlockMask; the reference applies the additive terms
// before the score_mod and the masks after (flex_attention.h).
TEST(FlexComposition, AttnMaskComposesWithScoreModAndBlockMask) {
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 65, S = 77, E = 16, Ev = 8;
  const Inputs in = inputs(B, Hq, Hkv, L, S, E, Ev, 200);
  const double scale = 1.0 / std::sqrt(static_cast<double>(E));
  const double cap = 2.0;
  const Program sm = Program::from_score_mod(mods::soft_cap(cap));
  const BlockMask bm = sdpa::flex::create_block_mask(mods::sliding_window(30), B, Hq, L, S, 16);
  RefMods base;
  base.score = [cap](double s, int64_t, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); };
  base.dscore = [cap](double s, int64_t, int64_t, int64_t, int64_t) {
    const double t = std::tanh(s / cap);
    return 1 - t * t;
  };
  auto window = [](int64_t i, int64_t j) { return j <= i && i - j <= 30; };
  SDPAOptions opts;
  opts.enable_gqa = true;

  {
    SCOPED_TRACE("PaddedKeysBias");
    const std::vector<int64_t> lengths = {50, 77};
    SDPAOptions o = opts;
    o.attn_mask = std::make_shared<sdpa::PaddedKeysBias>(lengths);
    RefMods m = base;
    m.keep = [&](int64_t b, int64_t, int64_t i, int64_t j) { return window(i, j) && j < lengths[b]; };
    check_flash_against(in, sm, &bm, o, reference_forward(in.q, in.k, in.v, scale, m),
                        reference_backward(in.dout, in.q, in.k, in.v, scale, m));
  }
  {
    SCOPED_TRACE("bool tensor");
    Tensor keep = Tensor::empty({B, 1, L, S}, DType::kBool);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j) keep.data<bool>()[(b * L + i) * S + j] = (i * 7 + j * 3 + b) % 5 != 0;
    SDPAOptions o = opts;
    o.attn_mask = keep;
    RefMods m = base;
    m.keep = [&](int64_t b, int64_t, int64_t i, int64_t j) {
      return window(i, j) && keep.data<bool>()[(b * L + i) * S + j];
    };
    check_flash_against(in, sm, &bm, o, reference_forward(in.q, in.k, in.v, scale, m),
                        reference_backward(in.dout, in.q, in.k, in.v, scale, m));
  }
  {
    SCOPED_TRACE("float tensor (added before the score_mod)");
    const Tensor bias = randn({1, Hq, L, S}, DType::kFloat32, 300);
    const std::vector<double> bv = values(bias);
    SDPAOptions o = opts;
    o.attn_mask = bias;
    RefMods m = base;
    m.additive = [&](int64_t, int64_t h, int64_t i, int64_t j) { return bv[(h * L + i) * S + j]; };
    m.keep = [&](int64_t, int64_t, int64_t i, int64_t j) { return window(i, j); };
    check_flash_against(in, sm, &bm, o, reference_forward(in.q, in.k, in.v, scale, m),
                        reference_backward(in.dout, in.q, in.k, in.v, scale, m));
  }
  {
    SCOPED_TRACE("is_causal with a prefix-LM BlockMask");
    const BlockMask prefix = sdpa::flex::create_block_mask(mods::prefix_lm(40), B, Hq, L, S, 16);
    SDPAOptions o = opts;
    o.is_causal = true;
    RefMods m = base;
    m.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i && (j < 40 || j <= i); };
    check_flash_against(in, sm, &prefix, o, reference_forward(in.q, in.k, in.v, scale, m),
                        reference_backward(in.dout, in.q, in.k, in.v, scale, m));
  }
}

// The reference of a bottom-right ALiBi term with `slopes` over L queries and S keys,
// then soft_cap(cap): the order every backend applies an ALiBi bias and a score_mod.
RefMods capped_after_alibi(const std::vector<float>& slopes, double cap, int64_t L, int64_t S) {
  RefMods m;
  m.additive = [slopes, L, S](int64_t, int64_t h, int64_t i, int64_t j) {
    return -slopes[static_cast<size_t>(h)] * std::abs(static_cast<double>(i + S - L - j));
  };
  m.score = [cap](double s, int64_t, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); };
  m.dscore = [cap](double s, int64_t, int64_t, int64_t, int64_t) {
    const double t = std::tanh(s / cap);
    return 1 - t * t;
  };
  return m;
}

// A native AlibiBias (bottom-right) with a score_mod and no BlockMask: whole key tiles
// (S past FLASH's 64-key tile) that the fused kernel could take for a register score_mod
// must still get the bias first. FLASH once dropped the score_mod there (fuzzer finding).
TEST(FlexComposition, AlibiBiasBeforeScoreModOnWholeKeyTiles) {
  const int64_t B = 1, Hq = 3, Hkv = 3, L = 17, S = 130, E = 67, Ev = 19;
  const Inputs in = inputs(B, Hq, Hkv, L, S, E, Ev, 250);
  const double scale = 1.0 / std::sqrt(static_cast<double>(E));
  const std::vector<float> slopes = {0.25f, 0.0625f, 0.00390625f};
  const double cap = 2.0;
  SDPAOptions opts;
  opts.attn_mask = std::make_shared<sdpa::AlibiBias>(slopes);
  const RefMods m = capped_after_alibi(slopes, cap, L, S);
  check_flash_against(in, Program::from_score_mod(mods::soft_cap(cap)), nullptr, opts,
                      reference_forward(in.q, in.k, in.v, scale, m),
                      reference_backward(in.dout, in.q, in.k, in.v, scale, m));
}

// compose(ALiBi, causal) with a score_mod: the ALiBi term goes into the score_mod, the
// causal mask acts after it, on every backend. MATH once materialized the composition as
// one additive tensor, so masked keys became soft_cap(-inf) = -cap and took part.
TEST(FlexComposition, ComposedAlibiAndCausalKeepTheirOrderAroundAScoreMod) {
  const int64_t B = 2, Hq = 4, Hkv = 2, E = 16, Ev = 8;
  const double cap = 2.0;
  for (const auto& lengths : {std::pair<int64_t, int64_t>{17, 70}, {40, 29}}) {
    const int64_t L = lengths.first, S = lengths.second;  // lambdas below capture them
    SCOPED_TRACE("L " + std::to_string(L) + ", S " + std::to_string(S));
    const Inputs in = inputs(B, Hq, Hkv, L, S, E, Ev, 260);
    const double scale = 1.0 / std::sqrt(static_cast<double>(E));
    const auto alibi = std::make_shared<sdpa::AlibiBias>(Hq);
    const std::vector<float> slopes = alibi->slopes();
    SDPAOptions opts;
    opts.enable_gqa = true;
    opts.attn_mask = sdpa::compose({alibi, sdpa::causal_lower_right(L, S)});
    RefMods m = capped_after_alibi(slopes, cap, L, S);
    m.keep = [L, S](int64_t, int64_t, int64_t i, int64_t j) { return j <= i + S - L; };
    check_flash_against(in, Program::from_score_mod(mods::soft_cap(cap)), nullptr, opts,
                        reference_forward(in.q, in.k, in.v, scale, m),
                        reference_backward(in.dout, in.q, in.k, in.v, scale, m));
  }
}

// The smallest form of the AttnBias case above: MATH runs a natively lowerable AttnBias
// by materializing it, and must keep the call's score_mod and BlockMask while doing so.
TEST(FlexComposition, MathKeepsFlexPartsWhenMaterializingAnAttnBias) {
  const Inputs in = inputs(1, 1, 1, 4, 4, 4, 4, 800);
  const Program sm = Program::from_score_mod(mods::soft_cap(0.5));
  const BlockMask bm = sdpa::flex::create_block_mask(
      [](const Expr&, const Expr&, const Expr&, const Expr& kv) { return kv != Expr(1); }, 1, 1, 4, 4, 2);
  SDPAOptions opts;
  opts.attn_mask = std::make_shared<sdpa::PaddedKeysBias>(std::vector<int64_t>{3});
  for (const bool use_score_mod : {true, false}) {
    SCOPED_TRACE(use_score_mod ? "score_mod soft_cap(0.5)" : "BlockMask kv != 1");
    const std::optional<Program> score_mod = use_score_mod ? std::optional<Program>(sm) : std::nullopt;
    const BlockMask* block_mask = use_score_mod ? nullptr : &bm;
    Tensor flash_out, math_out;
    {
      sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
      flash_out = sdpa::flex_attention(in.q, in.k, in.v, score_mod, block_mask, opts).out;
    }
    {
      sdpa::sdpa_kernel guard(SDPBackend::MATH);
      math_out = sdpa::flex_attention(in.q, in.k, in.v, score_mod, block_mask, opts).out;
    }
    EXPECT_TRUE(all_close(math_out, flash_out, tolerance(DType::kFloat32, 0, kFudgeOut), "MATH vs FLASH out"));
  }
}

// q / k / v given as transposed [B, L, H, E] views (non-contiguous) give the same result as
// contiguous copies.
TEST(FlexComposition, StridedInputs) {
  const int64_t B = 2, H = 2, L = 33, S = 47, E = 16;
  const Tensor q_bshd = randn({B, L, H, E}, DType::kFloat32, 400);
  const Tensor k_bshd = randn({B, S, H, E}, DType::kFloat32, 401);
  const Tensor v_bshd = randn({B, S, H, E}, DType::kFloat32, 402);
  const Tensor q = q_bshd.transpose(1, 2), k = k_bshd.transpose(1, 2), v = v_bshd.transpose(1, 2);
  ASSERT_FALSE(q.is_contiguous());
  const Program sm = Program::from_score_mod(mods::alibi(float_tensor({0.3f, 0.1f})));
  const BlockMask bm = sdpa::flex::create_block_mask(mods::causal(), B, H, L, S, 16);
  for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
    sdpa::sdpa_kernel guard(backend);
    const auto strided = sdpa::flex_attention(q, k, v, sm, &bm);
    const auto contiguous = sdpa::flex_attention(q.contiguous(), k.contiguous(), v.contiguous(), sm, &bm);
    EXPECT_EQ(values(strided.out), values(contiguous.out));
    EXPECT_EQ(values(strided.lse), values(contiguous.lse));
  }
}

TEST(FlexComposition, ExplainShowsProgramAndBlockPicture) {
  const int64_t B = 1, H = 2, L = 300, S = 300, E = 16;
  const Inputs in = inputs(B, H, H, L, S, E, E, 500);
  const Program sm = Program::from_score_mod(mods::soft_cap(20.0));
  const BlockMask bm = sdpa::flex::create_block_mask(mods::causal(), B, H, L, S, 128);
  sdpa::AttentionParams params = sdpa::make_params(in.q, in.k, in.v);
  params.mask.score_mod = std::make_shared<const Program>(sm);
  params.mask.block_mask = std::make_shared<const BlockMask>(bm);
  const sdpa::Explanation e = sdpa::explain(params);
  const std::string text = e.to_string();
  EXPECT_FALSE(e.flex.empty());
  for (const std::string& needle :
       {std::string("score_mod:"), sm.to_string(), std::string("tanh"), std::string("mask_mod:"),
        bm.mask_mod->to_string(), std::string("ge "), bm.to_string(), std::string("BlockMask"),
        std::string("density"), std::string("+..\n#+.\n##+\n")}) {
    EXPECT_NE(text.find(needle), std::string::npos) << "explain() lacks:\n" << needle << "\nin:\n" << text;
  }
  EXPECT_EQ(e.chosen, SDPBackend::FLASH_ATTENTION) << text;
  // How each backend uses the blocks: 3 x 3 causal blocks per head, 3 of them partial.
  for (const sdpa::BackendVerdict& v : e.verdicts) {
    if (v.backend == SDPBackend::FLASH_ATTENTION) {
      EXPECT_NE(v.lowering.find("key tiles in empty blocks are skipped"), std::string::npos) << text;
      EXPECT_NE(v.lowering.find("6 of 9 blocks computed, 3 partial"), std::string::npos) << text;
    } else if (v.backend == SDPBackend::MATH) {
      EXPECT_NE(v.lowering.find("no block is skipped"), std::string::npos) << text;
    }
  }
}

// Compiled forms are shared by structure (captured shapes / dtypes), never by values:
// two ALiBi programs with different slopes hash alike and each computes with its own.
TEST(FlexComposition, ProgramsAreCachedByStructureNotValues) {
  const Tensor slopes_a = float_tensor({0.5f, 0.25f}), slopes_b = float_tensor({0.125f, 1.0f});
  const Program a = Program::from_score_mod(mods::alibi(slopes_a));
  const Program b = Program::from_score_mod(mods::alibi(slopes_b));
  const Program c = Program::from_score_mod(mods::alibi(float_tensor({0.5f, 0.25f, 0.1f})));
  const Program d = Program::from_score_mod(mods::alibi(slopes_a.to(DType::kFloat64)));
  EXPECT_EQ(a.structural_hash(), b.structural_hash());
  EXPECT_NE(a.structural_hash(), c.structural_hash());
  EXPECT_NE(a.structural_hash(), d.structural_hash());
  EXPECT_NE(a.structural_hash(), Program::from_score_mod(mods::soft_cap(2.0)).structural_hash());
  EXPECT_NE(Program::from_score_mod(mods::soft_cap(2.0)).structural_hash(),
            Program::from_score_mod(mods::soft_cap(3.0)).structural_hash());
  EXPECT_EQ(a.to_string(), b.to_string());
  const Inputs in = inputs(1, 2, 2, 20, 20, 8, 8, 600);
  for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
    sdpa::sdpa_kernel guard(backend);
    for (const auto& [program, slopes] : {std::pair{a, std::vector<float>{0.5f, 0.25f}},
                                          std::pair{b, std::vector<float>{0.125f, 1.0f}}}) {
      SDPAOptions o;
      o.attn_mask = std::make_shared<sdpa::AlibiBias>(slopes, sdpa::DiagonalAlignment::kTopLeft);
      const auto expect = sdpa::scaled_dot_product_attention_with_lse(in.q, in.k, in.v, o);
      const auto got = sdpa::flex_attention(in.q, in.k, in.v, program);
      EXPECT_TRUE(all_close(got.out, expect.out, tolerance(DType::kFloat32, 0, kFudgeOut), "out"));
    }
    // A captured tensor's values are read at call time: changing them changes the result.
    Tensor live = float_tensor({0.5f, 0.25f});
    const Program p = Program::from_score_mod(mods::alibi(live));
    const auto before = sdpa::flex_attention(in.q, in.k, in.v, p);
    live.data<float>()[0] = 2.0f;
    const auto after = sdpa::flex_attention(in.q, in.k, in.v, p);
    EXPECT_GT(max_abs_diff(before.out, after.out), 1e-3);
    // The ScoreMod overload traces the same program.
    const auto traced = sdpa::flex_attention(in.q, in.k, in.v, mods::alibi(live));
    EXPECT_EQ(values(traced.out), values(after.out));
  }
}

// Program::from_expr over an expression that combines the roots of two separately traced
// score_mods (soft_cap(s) + alibi(s)) holds two score placeholders; the forward evaluates
// both, and the backward must differentiate through both.
TEST(FlexComposition, FromExprOverSeveralTracedRootsDifferentiatesEveryScore) {
  const Tensor slopes = float_tensor({0.5f, 0.25f});
  const Program soft = Program::from_score_mod(mods::soft_cap(2.0));
  const Program alibi = Program::from_score_mod(mods::alibi(slopes));
  const Program sum = Program::from_expr(soft.root() + alibi.root(), false);
  const Inputs in = inputs(1, 2, 2, 5, 6, 4, 3, 700, DType::kFloat64);
  const double scale = 0.5;
  RefMods m;
  m.score = [](double s, int64_t, int64_t h, int64_t i, int64_t j) {
    return 2 * std::tanh(s / 2) + s - (h == 0 ? 0.5 : 0.25) * std::abs(static_cast<double>(i - j));
  };
  m.dscore = [](double s, int64_t, int64_t, int64_t, int64_t) {
    const double t = std::tanh(s / 2);
    return (1 - t * t) + 1;
  };
  const RefForward gold = reference_forward(in.q, in.k, in.v, scale, m);
  const RefGrads ggold = reference_backward(in.dout, in.q, in.k, in.v, scale, m);
  sdpa::sdpa_kernel guard(SDPBackend::MATH);
  const auto r = sdpa::flex_attention(in.q, in.k, in.v, sum);
  EXPECT_TRUE(all_close(r.out, gold.out, float64_tolerance(), "out"));
  const auto g = sdpa::flex_attention_backward(in.dout, in.q, in.k, in.v, r.out, r.lse, sum);
  EXPECT_TRUE(all_close(g.grad_q, ggold.dq, float64_tolerance(), "grad_q"));
  EXPECT_TRUE(all_close(g.grad_k, ggold.dk, float64_tolerance(), "grad_k"));
}

}  // namespace
}  // namespace flex_test
