#pragma once
// FLASH flex (float32) against a float64 reference, forward and backward, with the
// tolerance scaled by MATH float32's own error (flex_test_util.h's rule); MATH float64
// must equal the reference tightly. Shared by the composition and operation tests.

#include <gtest/gtest.h>

#include <optional>

#include "flex_test_util.h"

namespace flex_test {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;
using sdpa::flex::BlockMask;
using sdpa::flex::Program;

struct Inputs {
  Tensor q, k, v, dout;
};
inline Inputs inputs(int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t E, int64_t Ev,
              uint64_t seed, DType dtype = DType::kFloat32) {
  return {randn({B, Hq, L, E}, dtype, seed, 1.5), randn({B, Hkv, S, E}, dtype, seed + 1, 1.5),
          randn({B, Hkv, S, Ev}, dtype, seed + 2), randn({B, Hq, L, Ev}, dtype, seed + 3)};
}

inline constexpr double kNaiveSanity = 1e-3;

struct Errors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};

// Checks FLASH (float32) flex against `gold` with the tolerance scaled by MATH float32.
inline void check_flash_against(const Inputs& in, const std::optional<Program>& sm, const BlockMask* bm,
                         const SDPAOptions& opts, const RefForward& gold, const RefGrads& ggold) {
  Errors naive;
  {
    sdpa::sdpa_kernel guard(SDPBackend::MATH);
    const auto r = sdpa::flex_attention(in.q, in.k, in.v, sm, bm, opts);
    const auto g = sdpa::flex_attention_backward(in.dout, in.q, in.k, in.v, r.out, r.lse, sm, bm, opts);
    naive = {max_abs_diff(r.out, gold.out), max_abs_diff(r.lse, gold.lse), max_abs_diff(g.grad_q, ggold.dq),
             max_abs_diff(g.grad_k, ggold.dk), max_abs_diff(g.grad_v, ggold.dv)};
    // A float32 MATH error beyond 1e-3 on these O(1) values means MATH itself is wrong
    // (its float64 run below fails then); FLASH is then held to the dtype default rather
    // than to a meaningless scale.
    for (double* e : {&naive.out, &naive.lse, &naive.dq, &naive.dk, &naive.dv}) {
      if (!(*e <= kNaiveSanity)) *e = 0.0;
    }
    // MATH float64 on the same inputs equals the reference (a float attn_mask tensor must
    // have the query dtype).
    SDPAOptions opts64 = opts;
    const Tensor mask_tensor = opts.attn_mask.tensor();
    if (mask_tensor.defined() && sdpa::is_floating(mask_tensor.dtype())) opts64.attn_mask = to64(mask_tensor);
    const auto r64 = sdpa::flex_attention(to64(in.q), to64(in.k), to64(in.v), sm, bm, opts64);
    EXPECT_TRUE(all_close(r64.out, gold.out, float64_tolerance(), "MATH f64 out"));
    EXPECT_TRUE(all_close(r64.lse, gold.lse, {kFloat64Tol, 1.2e-7}, "MATH f64 lse"));
    const auto g64 = sdpa::flex_attention_backward(to64(in.dout), to64(in.q), to64(in.k), to64(in.v),
                                                   r64.out, r64.lse, sm, bm, opts64);
    EXPECT_TRUE(all_close(g64.grad_q, ggold.dq, float64_tolerance(), "MATH f64 grad_q"));
    EXPECT_TRUE(all_close(g64.grad_k, ggold.dk, float64_tolerance(), "MATH f64 grad_k"));
    EXPECT_TRUE(all_close(g64.grad_v, ggold.dv, float64_tolerance(), "MATH f64 grad_v"));
  }
  sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  const auto r = sdpa::flex_attention(in.q, in.k, in.v, sm, bm, opts);
  EXPECT_EQ(r.backend, SDPBackend::FLASH_ATTENTION);
  EXPECT_TRUE(all_close(r.out, gold.out, tolerance(DType::kFloat32, naive.out, kFudgeOut), "FLASH out"));
  EXPECT_TRUE(all_close(r.lse, gold.lse, tolerance(DType::kFloat32, naive.lse, kFudgeLse), "FLASH lse"));
  const auto g = sdpa::flex_attention_backward(in.dout, in.q, in.k, in.v, r.out, r.lse, sm, bm, opts);
  EXPECT_TRUE(all_close(g.grad_q, ggold.dq, tolerance(DType::kFloat32, naive.dq, kFudgeGradQ), "FLASH grad_q"));
  EXPECT_TRUE(all_close(g.grad_k, ggold.dk, tolerance(DType::kFloat32, naive.dk, kFudgeGradK), "FLASH grad_k"));
  EXPECT_TRUE(all_close(g.grad_v, ggold.dv, tolerance(DType::kFloat32, naive.dv, kFudgeGradV), "FLASH grad_v"));
}

}  // namespace flex_test
