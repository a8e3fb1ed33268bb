// Flex score_mods and BlockMasks on MATH on CUDA (programs interpreted per element,
// cuda/flex_interpreter.cuh) against the float64 CPU flex golden, with the tolerance the
// naive CPU MATH run in the tested dtype sets. Every test needs a GPU and skips, with the
// reason, without one.

#include <cmath>
#include <optional>
#include <string>

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

const sdpa::Device kCuda{sdpa::DeviceType::kCUDA, 0};

Tensor gpu(const Tensor& t) { return sdpa::cuda::to_device(t, kCuda); }
Tensor cpu(const Tensor& t) { return sdpa::cuda::to_device(t, sdpa::Device{}); }

struct Case {
  int64_t batch, heads_q, heads_kv, q_len, kv_len, head_dim;
  DType dtype;
};

class CudaMathFlex : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!sdpa::cuda::is_available()) GTEST_SKIP() << sdpa::cuda::unavailable_reason();
  }

  static void expect_matches_golden(const std::string& name, const std::optional<Program>& mod,
                                    const Case& c, const BlockMask* block_mask = nullptr,
                                    const Tensor& attn_mask = {}) {
    SCOPED_TRACE(name + " L" + std::to_string(c.q_len) + " S" + std::to_string(c.kv_len) + " E" +
                 std::to_string(c.head_dim) + " " + std::string(sdpa::dtype_name(c.dtype)));
    const Tensor q = randn({c.batch, c.heads_q, c.q_len, c.head_dim}, c.dtype, 51);
    const Tensor k = randn({c.batch, c.heads_kv, c.kv_len, c.head_dim}, c.dtype, 52);
    const Tensor v = randn({c.batch, c.heads_kv, c.kv_len, c.head_dim + 3}, c.dtype, 53);
    sdpa::SDPAOptions o;
    o.enable_gqa = c.heads_q != c.heads_kv;
    sdpa::AttentionResult golden, naive, tested;
    sdpa::sdpa_kernel only(SDPBackend::MATH);
    if (attn_mask.defined()) o.attn_mask = attn_mask;
    golden = sdpa::flex_attention(f64(q), f64(k), f64(v), mod, block_mask, o);
    naive = sdpa::flex_attention(q, k, v, mod, block_mask, o);
    if (attn_mask.defined()) o.attn_mask = gpu(attn_mask);
    tested = sdpa::flex_attention(gpu(q), gpu(k), gpu(v), mod, block_mask, o);
    EXPECT_EQ(tested.backend, SDPBackend::MATH);
    EXPECT_TRUE(close_to_golden("out", cpu(tested.out), golden.out, naive.out, c.dtype));
    EXPECT_TRUE(close_to_golden("lse", cpu(tested.lse), golden.lse, naive.lse, DType::kFloat32,
                                kFudge, c.dtype));
  }
};

TEST_F(CudaMathFlex, ScoreModsAndBlockMasksMatchTheGoldenOnOddSizes) {
  namespace mods = sdpa::flex::mods;
  Tensor slopes = Tensor::empty({4}, DType::kFloat32);
  for (int64_t h = 0; h < 4; ++h) slopes.data<float>()[h] = 0.05f + 0.03f * static_cast<float>(h);
  const Program soft_cap = Program::from_score_mod(mods::soft_cap(2.0));
  const Program alibi = Program::from_score_mod(mods::alibi(slopes));
  const Program relative =
      Program::from_score_mod(mods::relative_position(randn({4, 33}, DType::kBFloat16, 54), 16));
  const Program stripes = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return sdpa::flex::where(
            (q >= kv) && (sdpa::flex::floor_div(q - kv, Expr(5)) % Expr(3) != Expr(1)), s,
            Expr(-INFINITY));
      });
  Tensor ids = Tensor::empty({300}, DType::kInt64);
  for (int64_t i = 0; i < 300; ++i) ids.data<int64_t>()[i] = i / 37;
  const Program documents = Program::from_mask_mod(mods::document(ids));
  const Program holes =
      Program::from_mask_mod([](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return (q % Expr(7) != Expr(3)) && (kv <= q);
      });
  const Case cases[] = {{1, 4, 4, 65, 257, 64, DType::kBFloat16},
                        {2, 4, 2, 7, 129, 40, DType::kFloat32},
                        {1, 4, 1, 257, 63, 32, DType::kFloat16},
                        {1, 4, 2, 1, 300, 72, DType::kFloat64}};
  for (const Case& c : cases) {
    expect_matches_golden("soft_cap", soft_cap, c);
    expect_matches_golden("alibi", alibi, c);
    expect_matches_golden("relative position", relative, c);
    expect_matches_golden("stripes", stripes, c);
    for (const auto& [name, mask_mod] : {std::pair{"documents", &documents}, {"holes", &holes}}) {
      const BlockMask block_mask =
          sdpa::flex::create_block_mask(*mask_mod, c.batch, c.heads_q, c.q_len, c.kv_len, 32, 48);
      expect_matches_golden(name, std::nullopt, c, &block_mask);
      expect_matches_golden(std::string(name) + " + soft_cap", soft_cap, c, &block_mask);
    }
  }
}

TEST_F(CudaMathFlex, AnAttnMaskComposesInTheCpusOrder) {
  // Additive terms before the score_mod, a bool mask after it.
  const Program soft_cap = Program::from_score_mod(sdpa::flex::mods::soft_cap(1.5));
  const Case c{1, 2, 2, 33, 70, 16, DType::kFloat32};
  expect_matches_golden("additive", soft_cap, c, nullptr,
                        randn({1, 2, c.q_len, c.kv_len}, DType::kFloat32, 55));
  Tensor keep = Tensor::empty({1, 1, c.q_len, c.kv_len}, DType::kBool);
  for (int64_t n = 0; n < keep.numel(); ++n) keep.data<bool>()[n] = n % 3 != 1;
  expect_matches_golden("bool", soft_cap, c, nullptr, keep);
}

TEST_F(CudaMathFlex, FailuresAreErrorsNamingTheProgramAndCapturedGradientsAreRefused) {
  const sdpa::flex::Captured small("bias_row", randn({10}, DType::kFloat32, 56));
  const Program score_mod =
      Program::from_score_mod([small](const Expr& s, const Expr&, const Expr&, const Expr&,
                                      const Expr& kv) { return s + Expr(small[kv]); });
  const Tensor q = gpu(randn({1, 2, 16, 32}, DType::kFloat32, 57));
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
