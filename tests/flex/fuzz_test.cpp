// Random program fuzz (program_gen.h): random score_mods (with random BlockMasks from random
// mask_mods) run on FLASH (float32, every attainable SIMD target) and MATH (float64) against
// a float64 reference attention whose scores go through Program::evaluate, the scalar
// oracle; so FLASH's row-vector evaluation is checked element by element through the
// output, lse and gradients. Random mask_mods also check create_block_mask's
// full / partial / empty classification and the interval analysis against dense
// evaluation.
//
// Rows excluded from the float32 comparison ("unstable"): rows with an element where the
// program has a discontinuity within float32 rounding of the score (a comparison on score
// at a tie), or where evaluating the program in float32 (FLASH's documented precision)
// differs from float64 by more than 1e-3 relative. These differences are the documented
// float32-vs-float64 semantics, not errors; each program may exclude at most 5% of rows
// (else the test fails: the generator would have lost its power), and MATH float64 is still
// compared on every row.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flex/interval.h"
#include "flex_test_util.h"
#include "program_gen.h"

namespace flex_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;
using sdpa::flex::BlockMask;
using sdpa::flex::Program;

constexpr double kUnstableRel = 1e-3;
constexpr double kMaxUnstableFraction = 0.05;

struct FuzzCall {
  GenDims dims;
  int64_t Hkv = 1, E = 16, Ev = 8, block = 128;
  uint64_t seed = 0;
  Program score_mod;
  std::optional<Program> mask_mod;
  std::optional<BlockMask> block_mask;
  Tensor q, k, v, dout;
  double scale = 1.0;
};

// Scaled scores in float64 from the (float32) inputs, [B, H, L, S].
std::vector<double> scores64(const FuzzCall& c) {
  const std::vector<double> q = values(c.q), k = values(c.k);
  const GenDims& d = c.dims;
  const int64_t group = d.H / c.Hkv;
  std::vector<double> s(static_cast<size_t>(d.B * d.H * d.L * d.S));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.L; ++i)
        for (int64_t j = 0; j < d.S; ++j) {
          double dot = 0.0;
          const double* qi = q.data() + ((b * d.H + h) * d.L + i) * c.E;
          const double* kj = k.data() + ((b * c.Hkv + h / group) * d.S + j) * c.E;
          for (int64_t e = 0; e < c.E; ++e) dot += qi[e] * kj[e];
          s[((b * d.H + h) * d.L + i) * d.S + j] = dot * c.scale;
        }
  return s;
}

bool kept(const FuzzCall& c, int64_t b, int64_t h, int64_t i, int64_t j) {
  return !c.mask_mod || c.mask_mod->evaluate(0.0, b, h, i, j) != 0.0;
}

bool differs(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return true;
  return std::fabs(a - b) > kUnstableRel * (1.0 + std::fabs(b));
}

// Rows [B * H * L] with an element where float32 evaluation may legitimately differ.
std::vector<bool> unstable_rows(const FuzzCall& c, const std::vector<double>& s) {
  const GenDims& d = c.dims;
  std::vector<bool> rows(static_cast<size_t>(d.B * d.H * d.L), false);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t i = 0; i < d.L; ++i) {
        const int64_t row = (b * d.H + h) * d.L + i;
        for (int64_t j = 0; j < d.S && !rows[row]; ++j) {
          if (c.mask_mod && c.mask_mod->evaluate(0.0, b, h, i, j) !=
                                evaluate_float32(*c.mask_mod, 0.0f, b, h, i, j)) {
            rows[row] = true;
            break;
          }
          if (!kept(c, b, h, i, j)) continue;
          const double x = s[row * d.S + j];
          const double f = c.score_mod.evaluate(x, b, h, i, j);
          const double eps = 1e-5 * (1.0 + std::fabs(x));
          if (differs(evaluate_float32(c.score_mod, static_cast<float>(x), b, h, i, j), f) ||
              differs(c.score_mod.evaluate(x + eps, b, h, i, j), f) ||
              differs(c.score_mod.evaluate(x - eps, b, h, i, j), f)) {
            rows[row] = true;
          }
        }
      }
  return rows;
}

// The reference with the score_mod evaluated as FLASH documents it (float32 arithmetic on
// the float32-rounded score), the rest in float64: its distance to the golden is the
// error float32 program evaluation alone brings, part of the tolerance scale.
RefMods ref_mods_float32_program(const FuzzCall& c, const RefMods& exact) {
  RefMods m = exact;
  const Program sm = c.score_mod;
  m.score = [sm](double s, int64_t b, int64_t h, int64_t i, int64_t j) {
    return evaluate_float32(sm, static_cast<float>(s), b, h, i, j);
  };
  return m;
}

RefMods ref_mods(const FuzzCall& c) {
  RefMods m;
  const Program sm = c.score_mod;
  m.score = [sm](double s, int64_t b, int64_t h, int64_t i, int64_t j) { return sm.evaluate(s, b, h, i, j); };
  m.dscore = [sm](double s, int64_t b, int64_t h, int64_t i, int64_t j) {
    const double step = 1e-6 * (1.0 + std::fabs(s));
    return (sm.evaluate(s + step, b, h, i, j) - sm.evaluate(s - step, b, h, i, j)) / (2 * step);
  };
  if (c.mask_mod) {
    const Program mm = *c.mask_mod;
    m.keep = [mm](int64_t b, int64_t h, int64_t i, int64_t j) { return mm.evaluate(0.0, b, h, i, j) != 0.0; };
  }
  return m;
}

FuzzCall make_call(uint64_t seed, bool with_mask, bool tables_require_grad) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::initializer_list<int64_t> xs) {
    return *(xs.begin() + std::uniform_int_distribution<size_t>(0, xs.size() - 1)(rng));
  };
  FuzzCall c;
  c.seed = seed;
  c.Hkv = pick({1, 2});
  c.dims.B = pick({1, 2});
  c.dims.H = c.Hkv * pick({1, 2});
  c.dims.L = pick({1, 7, 16, 33, 63, 65, 80});
  c.dims.S = pick({1, 7, 16, 33, 63, 65, 80});
  c.E = pick({8, 16, 17});
  c.Ev = pick({8, 12});
  c.block = pick({3, 16, 48, 64, 128, 200});
  const int depth = static_cast<int>(pick({2, 3, 4}));
  ProgramGen gen(seed * 7919 + 1, c.dims, /*allow_score=*/true, tables_require_grad);
  // One program in four stresses the integer ops (floor division and modulo of negative
  // values, reads indexed by them) through an additive bias.
  c.score_mod = seed % 4 == 3 ? gen.int_score_mod(depth + 1) : gen.score_mod(depth);
  if (with_mask) {
    ProgramGen mgen(seed * 7919 + 2, c.dims, /*allow_score=*/false);
    c.mask_mod = mgen.mask_mod(static_cast<int>(pick({2, 3})));
    c.block_mask = sdpa::flex::create_block_mask(*c.mask_mod, c.dims.B, c.dims.H, c.dims.L,
                                                 c.dims.S, c.block);
  }
  c.q = randn({c.dims.B, c.dims.H, c.dims.L, c.E}, DType::kFloat32, seed + 11);
  c.k = randn({c.dims.B, c.Hkv, c.dims.S, c.E}, DType::kFloat32, seed + 12);
  c.v = randn({c.dims.B, c.Hkv, c.dims.S, c.Ev}, DType::kFloat32, seed + 13);
  c.dout = randn({c.dims.B, c.dims.H, c.dims.L, c.Ev}, DType::kFloat32, seed + 14);
  c.scale = 1.0 / std::sqrt(static_cast<double>(c.E));
  return c;
}

std::string describe(const FuzzCall& c) {
  std::ostringstream os;
  os << "seed " << c.seed << ": B=" << c.dims.B << " H=" << c.dims.H << " Hkv=" << c.Hkv
     << " L=" << c.dims.L << " S=" << c.dims.S << " E=" << c.E << " Ev=" << c.Ev
     << " block=" << c.block << "\nscore_mod:\n" << c.score_mod.to_string();
  if (c.mask_mod) os << "mask_mod:\n" << c.mask_mod->to_string();
  return os.str();
}

SDPAOptions options(const FuzzCall& c) {
  SDPAOptions o;
  o.enable_gqa = c.dims.H != c.Hkv;
  return o;
}

double loss(const Tensor& out, const Tensor& dout) {
  const std::vector<double> o = values(out), d = values(dout);
  double s = 0.0;
  for (size_t i = 0; i < o.size(); ++i) s += o[i] * d[i];
  return s;
}

// grad_captured[t], or undefined when the vector is shorter.
Tensor entry(const std::vector<Tensor>& grads, size_t t) { return t < grads.size() ? grads[t] : Tensor(); }

struct FuzzStats {
  int programs = 0, with_mask = 0, grads_checked = 0, not_differentiable = 0,
      skipped_grads_unstable = 0, captured_checked = 0;
  int64_t rows = 0, unstable = 0;
};

void check_forward_and_backward(const FuzzCall& c, FuzzStats& stats) {
  SCOPED_TRACE(describe(c));
  const BlockMask* bm = c.block_mask ? &*c.block_mask : nullptr;
  const SDPAOptions opts = options(c);
  const std::vector<double> s = scores64(c);
  const std::vector<bool> unstable = unstable_rows(c, s);
  int64_t n_unstable = 0;
  for (bool u : unstable) n_unstable += u;
  stats.rows += static_cast<int64_t>(unstable.size());
  stats.unstable += n_unstable;
  EXPECT_LE(static_cast<double>(n_unstable), kMaxUnstableFraction * static_cast<double>(unstable.size()) + 1)
      << "too many rows at float32/float64 ties: the program generator lost its power";

  const RefMods mods = ref_mods(c);
  const RefForward gold = reference_forward(c.q, c.k, c.v, c.scale, mods);
  const Tensor q64 = to64(c.q), k64 = to64(c.k), v64 = to64(c.v), dout64 = to64(c.dout);

  // MATH float64 evaluates the same program in float64: equal on every row.
  sdpa::AttentionResult m64, m32;
  {
    sdpa::sdpa_kernel guard(SDPBackend::MATH);
    m64 = sdpa::flex_attention(q64, k64, v64, c.score_mod, bm, opts);
    EXPECT_TRUE(all_close(m64.out, gold.out, float64_tolerance(), "MATH f64 out"));
    EXPECT_TRUE(all_close(m64.lse, gold.lse, {kFloat64Tol, 1.2e-7}, "MATH f64 lse"));
    m32 = sdpa::flex_attention(c.q, c.k, c.v, c.score_mod, bm, opts);
  }
  // Naive error: MATH in float32 (float32 scores and softmax, program in float64) and the
  // reference with the program in float32 (what FLASH documents), whichever is larger.
  const RefMods mods32 = ref_mods_float32_program(c, mods);
  const RefForward prog32 = reference_forward(c.q, c.k, c.v, c.scale, mods32);
  const double naive_out = std::max(max_abs_diff(m32.out, gold.out, c.Ev, &unstable),
                                    max_abs_diff(prog32.out, gold.out, c.Ev, &unstable));
  const double naive_lse = std::max(max_abs_diff(m32.lse, gold.lse, 1, &unstable),
                                    max_abs_diff(prog32.lse, gold.lse, 1, &unstable));
  std::vector<sdpa::AttentionResult> flash;
  for (const std::string& cap : supported_capabilities()) {
    SCOPED_TRACE("capability " + cap);
    ScopedCapability cg(cap);
    sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
    flash.push_back(sdpa::flex_attention(c.q, c.k, c.v, c.score_mod, bm, opts));
    EXPECT_TRUE(all_close(flash.back().out, gold.out,
                          tolerance(DType::kFloat32, naive_out, kFudgeOut), "FLASH out", c.Ev,
                          &unstable));
    EXPECT_TRUE(all_close(flash.back().lse, gold.lse,
                          tolerance(DType::kFloat32, naive_lse, kFudgeLse), "FLASH lse", 1,
                          &unstable));
  }

  // Backward. A program whose result does not depend differentiably on score must be
  // refused by both backends, and then its derivative must indeed vanish.
  std::optional<sdpa::AttentionGradients> g64;
  bool refused64 = false, refused_flash = false;
  std::string why;
  {
    sdpa::sdpa_kernel guard(SDPBackend::MATH);
    try {
      g64 = sdpa::flex_attention_backward(dout64, q64, k64, v64, m64.out, m64.lse, c.score_mod, bm, opts);
    } catch (const sdpa::Error& e) {
      refused64 = true;
      why = e.what();
    }
  }
  {
    sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
    try {
      sdpa::flex_attention_backward(c.dout, c.q, c.k, c.v, flash[0].out, flash[0].lse, c.score_mod, bm, opts);
    } catch (const sdpa::Error&) {
      refused_flash = true;
    }
  }
  EXPECT_EQ(refused64, refused_flash);
  if (refused64) {
    ++stats.not_differentiable;
    EXPECT_NE(why.find("score"), std::string::npos) << why;
    const GenDims& d = c.dims;
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h)
        for (int64_t i = 0; i < d.L; ++i) {
          const int64_t row = (b * d.H + h) * d.L + i;
          if (unstable[row]) continue;
          for (int64_t j = 0; j < d.S; ++j) {
            if (!kept(c, b, h, i, j)) continue;
            const double deriv = mods.dscore(s[row * d.S + j], b, h, i, j);
            ASSERT_LT(std::fabs(deriv), 1e-6)
                << "backward refused (" << why << ") but d(score_mod)/d(score) = " << deriv
                << " at b=" << b << " h=" << h << " q=" << i << " kv=" << j;
          }
        }
    return;
  }
  if (n_unstable > 0) {
    // Finite differences across a discontinuity would be meaningless; gradients of an
    // unstable row also reach every key's grad_k / grad_v.
    ++stats.skipped_grads_unstable;
    return;
  }
  ++stats.grads_checked;
  const RefGrads ggold = reference_backward(c.dout, c.q, c.k, c.v, c.scale, mods);
  // The golden's d(score_mod)/d(score) is a central difference (relative error ~1e-9 on
  // smooth programs), so MATH float64 is held to 1e-6 here instead of kFloat64Tol.
  const Tolerance fd_tol{1e-6, 1e-6};
  EXPECT_TRUE(all_close(g64->grad_q, ggold.dq, fd_tol, "MATH f64 grad_q"));
  EXPECT_TRUE(all_close(g64->grad_k, ggold.dk, fd_tol, "MATH f64 grad_k"));
  EXPECT_TRUE(all_close(g64->grad_v, ggold.dv, fd_tol, "MATH f64 grad_v"));
  sdpa::AttentionGradients g32;
  {
    sdpa::sdpa_kernel guard(SDPBackend::MATH);
    g32 = sdpa::flex_attention_backward(c.dout, c.q, c.k, c.v, m32.out, m32.lse, c.score_mod, bm, opts);
  }
  const RefGrads gprog32 = reference_backward(c.dout, c.q, c.k, c.v, c.scale, mods32);
  const double nq = std::max(max_abs_diff(g32.grad_q, ggold.dq), max_abs_diff(gprog32.dq, ggold.dq));
  const double nk = std::max(max_abs_diff(g32.grad_k, ggold.dk), max_abs_diff(gprog32.dk, ggold.dk));
  const double nv = std::max(max_abs_diff(g32.grad_v, ggold.dv), max_abs_diff(gprog32.dv, ggold.dv));
  const std::vector<std::string> caps = supported_capabilities();
  for (size_t ci = 0; ci < caps.size(); ++ci) {
    SCOPED_TRACE("capability " + caps[ci]);
    ScopedCapability cg(caps[ci]);
    sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
    const auto g = sdpa::flex_attention_backward(c.dout, c.q, c.k, c.v, flash[ci].out,
                                                 flash[ci].lse, c.score_mod, bm, opts);
    EXPECT_TRUE(all_close(g.grad_q, ggold.dq, tolerance(DType::kFloat32, nq, kFudgeGradQ), "FLASH grad_q"));
    EXPECT_TRUE(all_close(g.grad_k, ggold.dk, tolerance(DType::kFloat32, nk, kFudgeGradK), "FLASH grad_k"));
    EXPECT_TRUE(all_close(g.grad_v, ggold.dv, tolerance(DType::kFloat32, nv, kFudgeGradV), "FLASH grad_v"));
    // Captured float tables: FLASH against MATH float64 (itself checked by finite
    // differences below), scaled by MATH float32's error. (The one-entry-per-capture
    // contract of grad_captured is checked in captured_grads_test.cpp; here a missing
    // entry reads as undefined.)
    const auto& captured = c.score_mod.captured();
    for (size_t t = 0; t < captured.size(); ++t) {
      SCOPED_TRACE("captured " + captured[t].name());
      const Tensor flash_grad = entry(g.grad_captured, t), math_grad = entry(g64->grad_captured, t);
      EXPECT_EQ(flash_grad.defined(), math_grad.defined());
      if (!captured[t].requires_grad()) {
        EXPECT_FALSE(flash_grad.defined());
        continue;
      }
      if (!flash_grad.defined() || !math_grad.defined()) continue;
      const double naive_cap = max_abs_diff(entry(g32.grad_captured, t), math_grad);
      EXPECT_TRUE(all_close(flash_grad, math_grad,
                            tolerance(DType::kFloat32, naive_cap, kFudgeGradCaptured),
                            "FLASH grad_captured"));
    }
  }
  // MATH float64 captured gradients against central differences of the float64 loss.
  const auto& captured = c.score_mod.captured();
  for (size_t t = 0; t < captured.size(); ++t) {
    if (!captured[t].requires_grad()) continue;
    ++stats.captured_checked;
    SCOPED_TRACE("finite differences of " + captured[t].name());
    Tensor table = captured[t].tensor();  // shares storage with the program's capture
    ASSERT_EQ(table.dtype(), DType::kFloat64);
    ASSERT_TRUE(table.is_contiguous());
    const Tensor math_grad = entry(g64->grad_captured, t);
    const Tensor grad = math_grad.defined() ? math_grad : Tensor::zeros(table.sizes(), DType::kFloat64);
    // Entries checked: the 4 largest |gradient| and 3 others spread over the table (every
    // entry costs two forwards).
    const std::vector<double> gv = values(grad);
    std::vector<int64_t> order(gv.size());
    for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int64_t>(e);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return std::fabs(gv[a]) > std::fabs(gv[b]); });
    std::vector<int64_t> entries(order.begin(), order.begin() + std::min<size_t>(4, order.size()));
    for (int64_t e : {int64_t{0}, table.numel() / 2, table.numel() - 1}) entries.push_back(e);
    sdpa::sdpa_kernel guard(SDPBackend::MATH);
    OmpThreadsGuard one_thread(1);
    for (int64_t e : entries) {
      double* x = table.data<double>() + e;
      const double x0 = *x, step = 1e-6;
      *x = x0 + step;
      const double up = loss(sdpa::flex_attention(q64, k64, v64, c.score_mod, bm, opts).out, dout64);
      *x = x0 - step;
      const double down = loss(sdpa::flex_attention(q64, k64, v64, c.score_mod, bm, opts).out, dout64);
      *x = x0;
      const double fd = (up - down) / (2 * step);
      EXPECT_NEAR(gv[e], fd, fd_tol.atol + fd_tol.rtol * std::fabs(fd))
          << "MATH f64 grad_captured vs finite differences at flat index " << e;
    }
  }
}

TEST(FlexFuzz, RandomScoreModsMatchScalarOracle) {
  FuzzStats stats;
  constexpr int kPrograms = 150;
  for (int p = 0; p < kPrograms; ++p) {
    const bool with_mask = p % 2 == 1;
    const FuzzCall c = make_call(0xF1E0 + static_cast<uint64_t>(p), with_mask, p % 3 == 0);
    ++stats.programs;
    stats.with_mask += with_mask;
    check_forward_and_backward(c, stats);
    if (HasFatalFailure()) return;
  }
  std::printf("[ fuzz     ] %d programs (%d with a BlockMask): %d backward-checked, %d refused as "
              "non-differentiable, %d skipped for unstable rows; %d captured tables checked by "
              "finite differences; %lld of %lld rows unstable\n",
              stats.programs, stats.with_mask, stats.grads_checked, stats.not_differentiable,
              stats.skipped_grads_unstable, stats.captured_checked,
              static_cast<long long>(stats.unstable), static_cast<long long>(stats.rows));
  // The generator must exercise the backward and the captured gradients.
  EXPECT_GE(stats.grads_checked, kPrograms / 3);
  EXPECT_GE(stats.captured_checked, 3);
}

// Block classification of random mask_mods against dense evaluation by the scalar oracle:
// 'full' blocks hold only true elements, 'empty' blocks only false, 'partial' blocks are
// never contradicted (create_block_mask documents them as "mask_mod must be evaluated";
// the count of all-true / all-false partial blocks is reported).
TEST(FlexFuzz, RandomMaskBlockClassificationMatchesDense) {
  constexpr int kPrograms = 150;
  int64_t blocks = 0, full = 0, empty = 0, partial = 0, partial_uniform = 0;
  for (int p = 0; p < kPrograms; ++p) {
    std::mt19937_64 rng(0xB10C + p);
    auto pick = [&](std::initializer_list<int64_t> xs) {
      return *(xs.begin() + std::uniform_int_distribution<size_t>(0, xs.size() - 1)(rng));
    };
    GenDims d{pick({1, 2}), pick({1, 3}), pick({1, 5, 16, 33, 47}), pick({1, 6, 16, 31, 50})};
    const int64_t block = pick({1, 3, 8, 16, 64});
    ProgramGen gen(0xB10C00 + p, d, false);
    const Program mask = gen.mask_mod(static_cast<int>(pick({1, 2, 3, 4})));
    SCOPED_TRACE("program " + std::to_string(p) + " B=" + std::to_string(d.B) + " H=" +
                 std::to_string(d.H) + " L=" + std::to_string(d.L) + " S=" +
                 std::to_string(d.S) + " block=" + std::to_string(block) + "\n" + mask.to_string());
    const BlockMask bm = sdpa::flex::create_block_mask(mask, d.B, d.H, d.L, d.S, block);
    ASSERT_EQ(bm.q_len, d.L);
    ASSERT_EQ(bm.kv_len, d.S);
    ASSERT_TRUE(bm.batch == 1 || bm.batch == d.B);
    ASSERT_TRUE(bm.num_heads == 1 || bm.num_heads == d.H);
    const int64_t nq = bm.num_q_blocks(), nkv = bm.num_kv_blocks();
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t bb = bm.batch == 1 ? 0 : b, hh = bm.num_heads == 1 ? 0 : h;
        const int64_t key = (bb * bm.num_heads + hh) * nq;
        for (int64_t qb = 0; qb < nq; ++qb) {
          std::vector<char> state(nkv, '.');
          const int32_t* part = bm.kv_indices.data<int32_t>() + (key + qb) * nkv;
          const int32_t* fullv = bm.full_kv_indices.data<int32_t>() + (key + qb) * nkv;
          for (int32_t n = 0; n < bm.kv_num_blocks.data<int32_t>()[key + qb]; ++n) state.at(part[n]) = '+';
          for (int32_t n = 0; n < bm.full_kv_num_blocks.data<int32_t>()[key + qb]; ++n) {
            ASSERT_EQ(state.at(fullv[n]), '.') << "block both full and partial";
            state.at(fullv[n]) = '#';
          }
          for (int64_t kb = 0; kb < nkv; ++kb) {
            bool any_true = false, any_false = false;
            for (int64_t i = qb * block; i < std::min(d.L, (qb + 1) * block); ++i) {
              for (int64_t j = kb * block; j < std::min(d.S, (kb + 1) * block); ++j) {
                (mask.evaluate(0.0, b, h, i, j) != 0.0 ? any_true : any_false) = true;
              }
            }
            ++blocks;
            if (state[kb] == '#') {
              ++full;
              ASSERT_FALSE(any_false) << "'full' block (" << qb << ", " << kb << ") of b=" << b
                                      << " h=" << h << " has a false element";
            } else if (state[kb] == '.') {
              ++empty;
              ASSERT_FALSE(any_true) << "'empty' block (" << qb << ", " << kb << ") of b=" << b
                                     << " h=" << h << " has a true element";
            } else {
              ++partial;
              partial_uniform += !(any_true && any_false);
            }
          }
        }
      }
    }
  }
  std::printf("[ fuzz     ] %lld blocks: %lld full, %lld empty, %lld partial (%lld of them "
              "uniform)\n",
              static_cast<long long>(blocks), static_cast<long long>(full),
              static_cast<long long>(empty), static_cast<long long>(partial),
              static_cast<long long>(partial_uniform));
  EXPECT_GT(full, 0);
  EXPECT_GT(empty, 0);
  EXPECT_GT(partial, 0);
}

// The interval analysis on arbitrary boxes (not aligned to blocks, any b and h) never
// claims full or empty wrongly.
TEST(FlexFuzz, IntervalAnalysisIsSound) {
  constexpr int kPrograms = 300;
  int64_t decided = 0, boxes = 0;
  for (int p = 0; p < kPrograms; ++p) {
    std::mt19937_64 rng(0x1A7E + p);
    GenDims d{2, 3, 40, 45};
    ProgramGen gen(0x1A7E00 + p, d, false);
    const Program mask = gen.mask_mod(1 + p % 4);
    SCOPED_TRACE("program " + std::to_string(p) + "\n" + mask.to_string());
    for (int t = 0; t < 12; ++t) {
      auto range = [&](int64_t n, int64_t& lo, int64_t& hi) {
        lo = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
        hi = std::min(n - 1, lo + std::uniform_int_distribution<int64_t>(0, 12)(rng));
      };
      int64_t q_lo, q_hi, kv_lo, kv_hi;
      range(d.L, q_lo, q_hi);
      range(d.S, kv_lo, kv_hi);
      const int64_t b = std::uniform_int_distribution<int64_t>(0, d.B - 1)(rng);
      const int64_t h = std::uniform_int_distribution<int64_t>(0, d.H - 1)(rng);
      const auto verdict = sdpa::flex::classify_block(*mask.compiled(), mask.captured(),
                                                      {b, h, q_lo, q_hi, kv_lo, kv_hi});
      ++boxes;
      if (verdict == sdpa::flex::BlockVerdict::kUnknown) continue;
      ++decided;
      const double want = verdict == sdpa::flex::BlockVerdict::kFull ? 1.0 : 0.0;
      for (int64_t i = q_lo; i <= q_hi; ++i) {
        for (int64_t j = kv_lo; j <= kv_hi; ++j) {
          ASSERT_EQ(mask.evaluate(0.0, b, h, i, j), want)
              << "interval analysis claimed " << (want ? "full" : "empty") << " for b=" << b
              << " h=" << h << " q[" << q_lo << ", " << q_hi << "] kv[" << kv_lo << ", " << kv_hi
              << "] but (q=" << i << ", kv=" << j << ") disagrees";
        }
      }
    }
  }
  std::printf("[ fuzz     ] interval analysis decided %lld of %lld boxes\n",
              static_cast<long long>(decided), static_cast<long long>(boxes));
  EXPECT_GT(decided, boxes / 10);
}

}  // namespace
}  // namespace flex_test
