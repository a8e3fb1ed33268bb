// Flex score_mods and BlockMasks on MATH on CUDA (programs interpreted per element,
// cuda/flex_interpreter.cuh) against the float64 CPU flex golden, with the tolerance the
// naive CPU MATH run in the tested dtype sets. Every test needs a GPU and skips, with the
// reason, without one.

#include <cmath>
#include <optional>
#include <string>

#include "cuda/flex_golden.h"
#include "sdpa/cuda.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::SDPBackend;
using sdpa::flex::BlockMask;
using sdpa::flex::Expr;
using sdpa::flex::Program;

class CudaMathFlex : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kFlexTestsOnCpu && !sdpa::cuda::is_available()) {
      GTEST_SKIP() << sdpa::cuda::unavailable_reason();
    }
  }

  // The forward on MATH on CUDA (Ev = E + 3: MATH takes any value head dim).
  static void expect_matches_golden(const std::string& name, const std::optional<Program>& mod,
                                    FlexCase c, const BlockMask* block_mask = nullptr,
                                    const Tensor& attn_mask = {}) {
    c.extra_value_dim = 3;
    expect_flex_matches_golden(SDPBackend::MATH, name, mod, c, block_mask, attn_mask);
  }

  // The backward of the same call: grad_q / grad_k / grad_v against the CPU's float64 MATH.
  static void expect_backward_matches_golden(const std::string& name,
                                             const std::optional<Program>& mod, const FlexCase& c,
                                             const BlockMask* block_mask = nullptr) {
    SCOPED_TRACE(name + " backward L" + std::to_string(c.q_len) + " S" + std::to_string(c.kv_len) +
                 " " + std::string(sdpa::dtype_name(c.dtype)));
    const Tensor q = randn({c.batch, c.heads_q, c.q_len, c.head_dim}, c.dtype, 61);
    const Tensor k = randn({c.batch, c.heads_kv, c.kv_len, c.head_dim}, c.dtype, 62);
    const Tensor v = randn({c.batch, c.heads_kv, c.kv_len, c.head_dim}, c.dtype, 63);
    const Tensor dout = randn({c.batch, c.heads_q, c.q_len, c.head_dim}, c.dtype, 64);
    sdpa::SDPAOptions o;
    o.enable_gqa = c.heads_q != c.heads_kv;
    sdpa::sdpa_kernel only(SDPBackend::MATH);
    const auto backward = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv,
                              const Tensor& dd) {
      const sdpa::AttentionResult r = sdpa::flex_attention(qq, kk, vv, mod, block_mask, o);
      return sdpa::flex_attention_backward(dd, qq, kk, vv, r.out, r.lse, mod, block_mask, o);
    };
    const sdpa::AttentionGradients golden = backward(f64(q), f64(k), f64(v), f64(dout));
    const sdpa::AttentionGradients naive = backward(q, k, v, dout);
    const sdpa::AttentionGradients tested = backward(to_gpu(q), to_gpu(k), to_gpu(v), to_gpu(dout));
    EXPECT_TRUE(
        close_to_golden("grad_q", to_cpu(tested.grad_q), golden.grad_q, naive.grad_q, c.dtype));
    EXPECT_TRUE(
        close_to_golden("grad_k", to_cpu(tested.grad_k), golden.grad_k, naive.grad_k, c.dtype));
    EXPECT_TRUE(
        close_to_golden("grad_v", to_cpu(tested.grad_v), golden.grad_v, naive.grad_v, c.dtype));
  }
};

TEST_F(CudaMathFlex, ScoreModsAndBlockMasksMatchTheGoldenOnOddSizes) {
  namespace mods = sdpa::flex::mods;
  const StandardScoreMods standard(/*max_distance=*/300, DType::kBFloat16);
  const Program& soft_cap = standard.soft_cap;
  Tensor ids = Tensor::empty({300}, DType::kInt64);
  for (int64_t i = 0; i < 300; ++i) ids.data<int64_t>()[i] = i / 37;
  const Program documents = Program::from_mask_mod(mods::document(ids));
  const Program holes =
      Program::from_mask_mod([](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return (q % Expr(7) != Expr(3)) && (kv <= q);
      });
  const FlexCase cases[] = {{1, 4, 4, 65, 257, 64, DType::kBFloat16},
                            {2, 4, 2, 7, 129, 40, DType::kFloat32},
                            {1, 4, 1, 257, 63, 32, DType::kFloat16},
                            {1, 4, 2, 1, 300, 72, DType::kFloat64}};
  for (const FlexCase& c : cases) {
    FlexCase wider_values = c;  // MATH takes any value head dim
    wider_values.extra_value_dim = 3;
    standard.expect_match_golden(SDPBackend::MATH, wider_values);
    for (const auto& [name, mask_mod] :
         {std::pair{"documents", &documents}, std::pair{"holes", &holes}}) {
      const BlockMask block_mask =
          sdpa::flex::create_block_mask(*mask_mod, c.batch, c.heads_q, c.q_len, c.kv_len, 32, 48);
      expect_matches_golden(name, std::nullopt, c, &block_mask);
      expect_matches_golden(std::string(name) + " + soft_cap", soft_cap, c, &block_mask);
    }
  }
}

TEST_F(CudaMathFlex, BackwardsThroughTheScoreModMatchTheGolden) {
  namespace mods = sdpa::flex::mods;
  const Program soft_cap = Program::from_score_mod(mods::soft_cap(2.0));
  const Program relative =
      Program::from_score_mod(mods::relative_position(randn({4, 81}, DType::kFloat32, 65), 40));
  const Program holes =
      Program::from_mask_mod([](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return (q % Expr(7) != Expr(3)) && (kv <= q + Expr(4));
      });
  const FlexCase cases[] = {{1, 4, 2, 19, 37, 24, DType::kFloat32},
                            {2, 2, 2, 33, 17, 16, DType::kFloat64},
                            {1, 4, 4, 40, 40, 32, DType::kBFloat16}};
  for (const FlexCase& c : cases) {
    const BlockMask block_mask =
        sdpa::flex::create_block_mask(holes, c.batch, c.heads_q, c.q_len, c.kv_len, 16, 8);
    expect_backward_matches_golden("soft_cap", soft_cap, c);
    expect_backward_matches_golden("relative position", relative, c);
    expect_backward_matches_golden("holes", std::nullopt, c, &block_mask);
    expect_backward_matches_golden("holes + soft_cap", soft_cap, c, &block_mask);
  }
}

TEST_F(CudaMathFlex, AnAttnMaskComposesInTheCpusOrder) {
  // Additive terms before the score_mod, a bool mask after it.
  const Program soft_cap = Program::from_score_mod(sdpa::flex::mods::soft_cap(1.5));
  const FlexCase c{1, 2, 2, 33, 70, 16, DType::kFloat32};
  expect_matches_golden("additive", soft_cap, c, nullptr,
                        randn({1, 2, c.q_len, c.kv_len}, DType::kFloat32, 55));
  Tensor keep = Tensor::empty({1, 1, c.q_len, c.kv_len}, DType::kBool);
  for (int64_t n = 0; n < keep.numel(); ++n) keep.data<bool>()[n] = n % 3 != 1;
  expect_matches_golden("bool", soft_cap, c, nullptr, keep);
}

TEST_F(CudaMathFlex, FailuresAreErrorsNamingTheProgramAndCapturedGradientsAreRefused) {
  SDPA_GPU_BEHAVIOUR_ONLY();
  const sdpa::flex::Captured small("bias_row", randn({10}, DType::kFloat32, 56));
  const Program score_mod =
      Program::from_score_mod([small](const Expr& s, const Expr&, const Expr&, const Expr&,
                                      const Expr& kv) { return s + Expr(small[kv]); });
  const Tensor q = to_gpu(randn({1, 2, 16, 32}, DType::kFloat32, 57));
  sdpa::sdpa_kernel only(SDPBackend::MATH);
  std::string message = error_message([&] { sdpa::flex_attention(q, q, q, score_mod); });
  EXPECT_NE(message.find("flex score_mod: index"), std::string::npos) << message;
  EXPECT_NE(message.find("'bias_row'"), std::string::npos) << message;

  const Program mask_mod =
      Program::from_mask_mod([small](const Expr&, const Expr&, const Expr& i, const Expr& kv) {
        return Expr(small[kv]) > Expr(0.0) || i < kv;
      });
  sdpa::flex::KvBlocks lists;
  lists.num = Tensor::full({1, 1, 1}, 1.0, DType::kInt32);
  lists.indices = Tensor::zeros({1, 1, 1, 1}, DType::kInt32);
  const BlockMask block_mask =
      sdpa::flex::block_mask_from_kv_blocks(lists, 16, 16, 64, 64, mask_mod);
  message = error_message([&] { sdpa::flex_attention(q, q, q, std::nullopt, &block_mask); });
  EXPECT_NE(message.find("flex mask_mod: index"), std::string::npos) << message;

  // A learnable table: its gradient is the CPU's to compute.
  const sdpa::flex::Captured table("table", randn({10}, DType::kFloat32, 58), true);
  const Program learnable =
      Program::from_score_mod([table](const Expr& s, const Expr&, const Expr&, const Expr&,
                                      const Expr& kv) { return s + Expr(table[kv % Expr(10)]); });
  const sdpa::AttentionResult r = sdpa::flex_attention(q, q, q, learnable);
  message =
      error_message([&] { sdpa::flex_attention_backward(q, q, q, q, r.out, r.lse, learnable); });
  EXPECT_NE(message.find("captured tensor 'table' requires grad"), std::string::npos) << message;
}

}  // namespace
}  // namespace sdpa_test
