#pragma once
// The flex tests' check on CUDA: one flex_attention call run on a GPU backend against the
// float64 CPU MATH golden, with the tolerance the naive CPU MATH run in the tested dtype
// sets.
//
// Built with SDPA_FLEX_TESTS_ON_CPU (tests/CMakeLists.txt's sdpa_flex_gpu_tests_on_cpu),
// the same tests run with CPU tensors in place of device ones, on the CPU backends of the
// same names: every CI run then checks their goldens and CPU halves (a test whose golden
// cannot be computed fails there, not first on a GPU). Tests of GPU-only behaviour skip
// in that build (SDPA_GPU_BEHAVIOUR_ONLY).

#include <optional>
#include <string>

#include "sdpa/cuda.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"
#include "training/attention_test_util.h"

namespace sdpa_test {

#ifdef SDPA_FLEX_TESTS_ON_CPU
inline constexpr bool kFlexTestsOnCpu = true;
#else
inline constexpr bool kFlexTestsOnCpu = false;
#endif

/// Skips a test of what only the GPU does (refusals, device error records) in the CPU
/// build of the GPU flex tests.
#define SDPA_GPU_BEHAVIOUR_ONLY()                                                  \
  do {                                                                             \
    if (kFlexTestsOnCpu) GTEST_SKIP() << "GPU behaviour (SDPA_FLEX_TESTS_ON_CPU)"; \
  } while (false)

inline const sdpa::Device kFlexCuda{sdpa::DeviceType::kCUDA, 0};

inline Tensor to_gpu(const Tensor& t) {
  return kFlexTestsOnCpu ? t : sdpa::cuda::to_device(t, kFlexCuda);
}
inline Tensor to_cpu(const Tensor& t) {
  return kFlexTestsOnCpu ? t : sdpa::cuda::to_device(t, sdpa::Device{});
}

/// Shapes of one call: q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, E + extra_value_dim].
struct FlexCase {
  int64_t batch, heads_q, heads_kv, q_len, kv_len, head_dim;
  DType dtype;
  int64_t extra_value_dim = 0;
};

/// Runs `mod` and `block_mask` (either may be absent; captured tensors as given) and an
/// optional attn_mask (a host tensor, copied for the GPU call) forward on `backend` on the
/// GPU, and checks that the backend ran and out and lse match the golden.
inline void expect_flex_matches_golden(sdpa::SDPBackend backend, const std::string& name,
                                       const std::optional<sdpa::flex::Program>& mod,
                                       const FlexCase& c,
                                       const sdpa::flex::BlockMask* block_mask = nullptr,
                                       const Tensor& attn_mask = {}) {
  SCOPED_TRACE(name + " L" + std::to_string(c.q_len) + " S" + std::to_string(c.kv_len) + " E" +
               std::to_string(c.head_dim) + " Hq/Hkv " + std::to_string(c.heads_q) + "/" +
               std::to_string(c.heads_kv) + " " + std::string(sdpa::dtype_name(c.dtype)));
  const Tensor q = randn({c.batch, c.heads_q, c.q_len, c.head_dim}, c.dtype, 31);
  const Tensor k = randn({c.batch, c.heads_kv, c.kv_len, c.head_dim}, c.dtype, 32);
  const Tensor v =
      randn({c.batch, c.heads_kv, c.kv_len, c.head_dim + c.extra_value_dim}, c.dtype, 33);
  sdpa::SDPAOptions o;
  o.enable_gqa = c.heads_q != c.heads_kv;
  // An additive mask comes in the query's dtype.
  const bool additive = attn_mask.defined() && attn_mask.dtype() != DType::kBool;
  const auto mask_in = [&](DType dtype) { return additive ? attn_mask.to(dtype) : attn_mask; };
  sdpa::AttentionResult golden, naive, tested;
  {
    sdpa::sdpa_kernel only(sdpa::SDPBackend::MATH);
    if (attn_mask.defined()) o.attn_mask = mask_in(DType::kFloat64);
    golden = sdpa::flex_attention(f64(q), f64(k), f64(v), mod, block_mask, o);
    if (attn_mask.defined()) o.attn_mask = mask_in(c.dtype);
    naive = sdpa::flex_attention(q, k, v, mod, block_mask, o);
  }
  if (attn_mask.defined()) o.attn_mask = to_gpu(mask_in(c.dtype));
  {
    sdpa::sdpa_kernel only(backend);
    tested = sdpa::flex_attention(to_gpu(q), to_gpu(k), to_gpu(v), mod, block_mask, o);
  }
  EXPECT_EQ(tested.backend, backend);
  EXPECT_TRUE(close_to_golden("out", to_cpu(tested.out), golden.out, naive.out, c.dtype));
  EXPECT_TRUE(close_to_golden("lse", to_cpu(tested.lse), golden.lse, naive.lse, DType::kFloat32,
                              kFudge, c.dtype));
}

/// The score_mods both GPU flex paths are checked with, for 4 heads: a soft-cap, ALiBi
/// (captured float32 slopes), a relative-position gather from a `table_dtype` table that
/// covers every |q_idx - kv_idx| up to `max_distance`, and integer floor division and
/// modulo (which cuDNN's score_mod cannot express) under a causal select that leaves the
/// first rows' only keys and masks whole rows of padding blocks.
struct StandardScoreMods {
  StandardScoreMods(int64_t max_distance, DType table_dtype)
      : soft_cap(sdpa::flex::Program::from_score_mod(sdpa::flex::mods::soft_cap(2.0))),
        alibi(sdpa::flex::Program::from_score_mod(sdpa::flex::mods::alibi(slopes()))),
        relative(sdpa::flex::Program::from_score_mod(sdpa::flex::mods::relative_position(
            randn({4, 2 * max_distance + 1}, table_dtype, 41), max_distance))),
        stripes(sdpa::flex::Program::from_score_mod(
            [](const sdpa::flex::Expr& s, const sdpa::flex::Expr&, const sdpa::flex::Expr&,
               const sdpa::flex::Expr& q, const sdpa::flex::Expr& kv) {
              using sdpa::flex::Expr;
              return sdpa::flex::where(
                  (q >= kv) && (sdpa::flex::floor_div(q - kv, Expr(5)) % Expr(3) != Expr(1)), s,
                  Expr(-INFINITY));
            })) {}

  /// Each of them on `backend` for case `c`, against the golden.
  void expect_match_golden(sdpa::SDPBackend backend, const FlexCase& c) const {
    expect_flex_matches_golden(backend, "soft_cap", soft_cap, c);
    expect_flex_matches_golden(backend, "alibi", alibi, c);
    expect_flex_matches_golden(backend, "relative position", relative, c);
    expect_flex_matches_golden(backend, "stripes", stripes, c);
  }

  static Tensor slopes() {
    Tensor t = Tensor::empty({4}, DType::kFloat32);
    for (int64_t h = 0; h < 4; ++h) t.data<float>()[h] = 0.05f + 0.03f * static_cast<float>(h);
    return t;
  }

  sdpa::flex::Program soft_cap, alibi, relative, stripes;
};

}  // namespace sdpa_test
