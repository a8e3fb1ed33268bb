// Gradients of captured tensors (requires_grad): MATH float64 against central finite
// differences of the float64 loss, FLASH against MATH, the one-entry-per-capture
// contract of AttentionGradients::grad_captured, and bit-identical results for any
// number of OpenMP threads.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "flex_test_util.h"
#include "sdpa/flex_mods.h"

namespace flex_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;
using sdpa::flex::BlockMask;
using sdpa::flex::Captured;
using sdpa::flex::Expr;
using sdpa::flex::Program;
namespace mods = sdpa::flex::mods;

double loss(const Tensor& out, const Tensor& dout) {
  const std::vector<double> o = values(out), d = values(dout);
  double s = 0.0;
  for (size_t i = 0; i < o.size(); ++i) s += o[i] * d[i];
  return s;
}

// Central differences (step 1e-6 in float64: truncation ~1e-12, rounding ~1e-10) of
// sum(out * dout) with respect to every element of `table`, through MATH float64.
Tensor finite_differences(Tensor table, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& dout, const Program& score_mod, const BlockMask* bm,
                          const SDPAOptions& opts) {
  EXPECT_EQ(table.dtype(), DType::kFloat64);
  Tensor fd = Tensor::zeros(table.sizes(), DType::kFloat64);
  sdpa::sdpa_kernel guard(SDPBackend::MATH);
  OmpThreadsGuard one_thread(1);
  for (int64_t e = 0; e < table.numel(); ++e) {
    double* x = table.data<double>() + e;  // shares storage with the capture
    const double x0 = *x, step = 1e-6;
    *x = x0 + step;
    const double up = loss(sdpa::flex_attention(q, k, v, score_mod, bm, opts).out, dout);
    *x = x0 - step;
    const double down = loss(sdpa::flex_attention(q, k, v, score_mod, bm, opts).out, dout);
    *x = x0;
    fd.data<double>()[e] = (up - down) / (2 * step);
  }
  return fd;
}

const Tolerance kFdTol{1e-7, 1e-7};

TEST(FlexCapturedGrads, RelativePositionTableMatchesFiniteDifferencesOnMath) {
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 9, S = 7, E = 5, Ev = 3, max_distance = 9;
  const Tensor q = randn({B, Hq, L, E}, DType::kFloat64, 1);
  const Tensor k = randn({B, Hkv, S, E}, DType::kFloat64, 2);
  const Tensor v = randn({B, Hkv, S, Ev}, DType::kFloat64, 3);
  const Tensor dout = randn({B, Hq, L, Ev}, DType::kFloat64, 4);
  const Tensor table = randn({Hq, 2 * max_distance + 1}, DType::kFloat64, 5);
  const Program sm = Program::from_score_mod(mods::relative_position(table, max_distance, true));
  const BlockMask bm = sdpa::flex::create_block_mask(mods::prefix_lm(3), B, Hq, L, S, 4);
  SDPAOptions opts;
  opts.enable_gqa = true;
  sdpa::AttentionGradients g;
  {
    sdpa::sdpa_kernel guard(SDPBackend::MATH);
    const auto r = sdpa::flex_attention(q, k, v, sm, &bm, opts);
    g = sdpa::flex_attention_backward(dout, q, k, v, r.out, r.lse, sm, &bm, opts);
  }
  ASSERT_EQ(g.grad_captured.size(), 1u);
  ASSERT_TRUE(g.grad_captured[0].defined());
  EXPECT_EQ(g.grad_captured[0].sizes(), table.sizes());
  EXPECT_EQ(g.grad_captured[0].dtype(), DType::kFloat64);
  const Tensor fd = finite_differences(table, q, k, v, dout, sm, &bm, opts);
  EXPECT_TRUE(all_close(g.grad_captured[0], fd, kFdTol, "grad table vs finite differences"));
  // Offsets q - kv lie in [-(S-1), L-1] = [-6, 8]: columns 0..2 and 18 are never read.
  for (int64_t h = 0; h < Hq; ++h) {
    for (int64_t col : {0, 1, 2, 18}) {
      EXPECT_EQ(g.grad_captured[0].item({h, col}), 0.0) << "h=" << h << " col=" << col;
    }
  }
}

// FLASH runs float64 in float64: forward, input and table gradients equal MATH's to
// float64 rounding, under a score_mod reading a table and a BlockMask with a mask_mod.
TEST(FlexCapturedGrads, FlashFloat64MatchesMathFloat64) {
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 70, S = 131, E = 5, Ev = 3, max_distance = 140;
  const Tensor q = randn({B, Hq, L, E}, DType::kFloat64, 21);
  const Tensor k = randn({B, Hkv, S, E}, DType::kFloat64, 22);
  const Tensor v = randn({B, Hkv, S, Ev}, DType::kFloat64, 23);
  const Tensor dout = randn({B, Hq, L, Ev}, DType::kFloat64, 24);
  const Tensor table = randn({Hq, 2 * max_distance + 1}, DType::kFloat64, 25);
  const Program sm = Program::from_score_mod(mods::relative_position(table, max_distance, true));
  const BlockMask bm = sdpa::flex::create_block_mask(mods::sliding_window(50), B, Hq, L, S, 16);
  SDPAOptions opts;
  opts.enable_gqa = true;
  sdpa::AttentionResult fwd[2];
  sdpa::AttentionGradients g[2];
  const SDPBackend backends[2] = {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION};
  for (int r = 0; r < 2; ++r) {
    sdpa::sdpa_kernel guard(backends[r]);
    fwd[r] = sdpa::flex_attention(q, k, v, sm, &bm, opts);
    g[r] = sdpa::flex_attention_backward(dout, q, k, v, fwd[r].out, fwd[r].lse, sm, &bm, opts);
    EXPECT_EQ(fwd[r].backend, backends[r]);
    EXPECT_EQ(g[r].backend, backends[r]);
  }
  const Tolerance tight{1e-12, 1e-12};
  EXPECT_TRUE(all_close(fwd[1].out, fwd[0].out, tight, "out"));
  EXPECT_TRUE(all_close(fwd[1].lse, fwd[0].lse, {0.0, 1.2e-7}, "lse (float32)"));
  EXPECT_TRUE(all_close(g[1].grad_q, g[0].grad_q, tight, "grad_q"));
  EXPECT_TRUE(all_close(g[1].grad_k, g[0].grad_k, tight, "grad_k"));
  EXPECT_TRUE(all_close(g[1].grad_v, g[0].grad_v, tight, "grad_v"));
  ASSERT_EQ(g[1].grad_captured.size(), 1u);
  ASSERT_TRUE(g[1].grad_captured[0].defined());
  EXPECT_TRUE(all_close(g[1].grad_captured[0], g[0].grad_captured[0], tight, "grad table"));
}

// score * scale[h] + tanh(bias[(q - kv) % 5]) * gate[kv % 3] * gate[q % 3] - frozen[h]:
// several tensors, one read twice, one without requires_grad.
struct MultiCapture {
  Tensor scale_t, bias_t, gate_t, frozen_t;
  Program program;
};

MultiCapture multi_capture(int64_t H, DType dtype, uint64_t seed) {
  MultiCapture m;
  m.scale_t = (randn({H}, DType::kFloat64, seed, 0.3)).to(dtype);
  for (int64_t h = 0; h < H; ++h) {
    const std::vector<int64_t> index{h};
    m.scale_t.set_item(index, 1.0 + m.scale_t.item(index));
  }
  m.bias_t = randn({5}, dtype, seed + 1);
  m.gate_t = randn({3}, dtype, seed + 2);
  m.frozen_t = randn({H}, dtype, seed + 3);
  const Captured scale("scale", m.scale_t, true), bias("bias", m.bias_t, true),
      gate("gate", m.gate_t, true), frozen("frozen", m.frozen_t, false);
  m.program = Program::from_score_mod(
      [=](const Expr& score, const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
        return score * scale[h] +
               sdpa::flex::tanh(bias[(q - kv) % Expr(5)]) * gate[kv % Expr(3)] * gate[q % Expr(3)] -
               frozen[h];
      });
  return m;
}

TEST(FlexCapturedGrads, SeveralTensorsMatchFiniteDifferencesOnMath) {
  const int64_t B = 2, H = 3, L = 8, S = 11, E = 4, Ev = 5;
  const Tensor q = randn({B, H, L, E}, DType::kFloat64, 11);
  const Tensor k = randn({B, H, S, E}, DType::kFloat64, 12);
  const Tensor v = randn({B, H, S, Ev}, DType::kFloat64, 13);
  const Tensor dout = randn({B, H, L, Ev}, DType::kFloat64, 14);
  MultiCapture m = multi_capture(H, DType::kFloat64, 15);
  ASSERT_EQ(m.program.captured().size(), 4u);
  sdpa::AttentionGradients g;
  {
    sdpa::sdpa_kernel guard(SDPBackend::MATH);
    const auto r = sdpa::flex_attention(q, k, v, m.program);
    g = sdpa::flex_attention_backward(dout, q, k, v, r.out, r.lse, m.program);
  }
  ASSERT_EQ(g.grad_captured.size(), 4u);
  for (size_t t = 0; t < 4; ++t) {
    const Captured& c = m.program.captured()[t];
    SCOPED_TRACE(c.name());
    if (!c.requires_grad()) {
      EXPECT_FALSE(g.grad_captured[t].defined());
      continue;
    }
    ASSERT_TRUE(g.grad_captured[t].defined());
    const Tensor fd = finite_differences(c.tensor(), q, k, v, dout, m.program, nullptr, {});
    EXPECT_TRUE(all_close(g.grad_captured[t], fd, kFdTol, c.name() + " vs finite differences"));
  }
}

// FLASH (float32, every attainable target) against MATH float64, on sizes spanning several
// q blocks and kv tiles, with GQA and a sliding-window BlockMask.
TEST(FlexCapturedGrads, FlashMatchesMath) {
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 150, S = 170, E = 24, Ev = 16, max_distance = 170;
  const Tensor q = randn({B, Hq, L, E}, DType::kFloat32, 21);
  const Tensor k = randn({B, Hkv, S, E}, DType::kFloat32, 22);
  const Tensor v = randn({B, Hkv, S, Ev}, DType::kFloat32, 23);
  const Tensor dout = randn({B, Hq, L, Ev}, DType::kFloat32, 24);
  const Tensor table = randn({Hq, 2 * max_distance + 1}, DType::kFloat32, 25, 0.5);
  const MultiCapture multi = multi_capture(Hq, DType::kFloat32, 26);
  const std::vector<std::pair<std::string, Program>> programs = {
      {"relative_position", Program::from_score_mod(mods::relative_position(table, max_distance, true))},
      {"several", multi.program}};
  const BlockMask bm = sdpa::flex::create_block_mask(mods::sliding_window(40), B, Hq, L, S, 32);
  SDPAOptions opts;
  opts.enable_gqa = true;
  for (const auto& [name, sm] : programs) {
    SCOPED_TRACE(name);
    sdpa::AttentionGradients g64, g32;
    {
      sdpa::sdpa_kernel guard(SDPBackend::MATH);
      const auto r64 = sdpa::flex_attention(to64(q), to64(k), to64(v), sm, &bm, opts);
      g64 = sdpa::flex_attention_backward(to64(dout), to64(q), to64(k), to64(v), r64.out, r64.lse, sm, &bm, opts);
      const auto r32 = sdpa::flex_attention(q, k, v, sm, &bm, opts);
      g32 = sdpa::flex_attention_backward(dout, q, k, v, r32.out, r32.lse, sm, &bm, opts);
    }
    for (const std::string& cap : supported_capabilities()) {
      SCOPED_TRACE("capability " + cap);
      ScopedCapability cg(cap);
      sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
      const auto r = sdpa::flex_attention(q, k, v, sm, &bm, opts);
      const auto g = sdpa::flex_attention_backward(dout, q, k, v, r.out, r.lse, sm, &bm, opts);
      ASSERT_EQ(g.grad_captured.size(), sm.captured().size());
      ASSERT_EQ(g64.grad_captured.size(), sm.captured().size());
      int compared = 0;
      for (size_t t = 0; t < sm.captured().size(); ++t) {
        SCOPED_TRACE(sm.captured()[t].name());
        ASSERT_EQ(g.grad_captured[t].defined(), sm.captured()[t].requires_grad());
        if (!g.grad_captured[t].defined()) continue;
        const double naive = max_abs_diff(g32.grad_captured[t], g64.grad_captured[t]);
        EXPECT_TRUE(all_close(g.grad_captured[t], g64.grad_captured[t],
                              tolerance(DType::kFloat32, naive, kFudgeGradCaptured),
                              "FLASH grad_captured"));
        ++compared;
      }
      EXPECT_GT(compared, 0);
    }
  }
}

// grad_captured has one entry per captured tensor of the score_mod (flex_attention.h,
// sdpa.h), undefined for those without requires_grad -- also when none requires grad.
TEST(FlexCapturedGrads, OneEntryPerCapturedTensor) {
  const Tensor q = randn({1, 2, 5, 4}, DType::kFloat32, 31), k = randn({1, 2, 6, 4}, DType::kFloat32, 32);
  const Tensor v = randn({1, 2, 6, 3}, DType::kFloat32, 33), dout = randn({1, 2, 5, 3}, DType::kFloat32, 34);
  const Program alibi = Program::from_score_mod(mods::alibi(float_tensor({0.5f, 0.25f})));
  ASSERT_EQ(alibi.captured().size(), 1u);
  for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
    sdpa::sdpa_kernel guard(backend);
    const auto r = sdpa::flex_attention(q, k, v, alibi);
    const auto g = sdpa::flex_attention_backward(dout, q, k, v, r.out, r.lse, alibi);
    ASSERT_EQ(g.grad_captured.size(), 1u)
        << "one entry per captured tensor expected (undefined: alibi_slopes does not require grad)";
    EXPECT_FALSE(g.grad_captured[0].defined());
  }
}

// Bit-identical captured gradients (and out) for 1, 2 and 3 OpenMP threads, on FLASH and
// MATH (captured_grads.h: chunking depends only on the work, never on the thread count).
TEST(FlexCapturedGrads, DeterministicAcrossThreadCounts) {
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 200, S = 200, E = 16, Ev = 16, max_distance = 200;
  // Large logits (std ~ 9): probabilities span far more than float64's 53 bits, so
  // partial sums round and their order would show.
  const Tensor q = randn({B, Hq, L, E}, DType::kFloat32, 41, 3.0);
  const Tensor k = randn({B, Hkv, S, E}, DType::kFloat32, 42, 3.0);
  const Tensor v = randn({B, Hkv, S, Ev}, DType::kFloat32, 43);
  const Tensor dout = randn({B, Hq, L, Ev}, DType::kFloat32, 44);
  const BlockMask bm = sdpa::flex::create_block_mask(mods::causal(), B, Hq, L, S, 64);
  SDPAOptions opts;
  opts.enable_gqa = true;
  // A float64 table keeps the float64 partial sums' order visible (a float32 result would
  // round most order differences away).
  for (DType table_dtype : {DType::kFloat32, DType::kFloat64})
  for (SDPBackend backend : {SDPBackend::FLASH_ATTENTION, SDPBackend::MATH}) {
    SCOPED_TRACE(std::string(sdpa::backend_name(backend)) + " table " +
                 std::string(sdpa::dtype_name(table_dtype)));
    const Tensor table = randn({Hq, 2 * max_distance + 1}, table_dtype, 45, 0.5);
    const Program sm = Program::from_score_mod(mods::relative_position(table, max_distance, true));
    sdpa::sdpa_kernel guard(backend);
    std::vector<std::vector<uint8_t>> grads;
    for (int threads : {1, 2, 3, 2}) {
      const OmpThreadsGuard guard(threads);
      const auto r = sdpa::flex_attention(q, k, v, sm, &bm, opts);
      const auto g = sdpa::flex_attention_backward(dout, q, k, v, r.out, r.lse, sm, &bm, opts);
      ASSERT_EQ(g.grad_captured.size(), 1u);
      ASSERT_TRUE(g.grad_captured[0].defined());
      const Tensor t = g.grad_captured[0].contiguous();
      const auto* bytes = static_cast<const uint8_t*>(t.data_ptr());
      grads.emplace_back(bytes, bytes + t.numel() * sdpa::element_size(t.dtype()));
    }
    for (size_t n = 1; n < grads.size(); ++n) {
      EXPECT_TRUE(grads[n] == grads[0]) << "grad_captured differs between thread-count runs 0 and " << n;
    }
  }
}

}  // namespace
}  // namespace flex_test
