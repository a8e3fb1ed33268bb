// Flex score_mods and BlockMasks on CUDA FLASH (the kernel compiled by NVRTC with the
// programs, cuda/flash/flex_unit.h) against the float64 CPU flex golden, with the
// tolerance the naive CPU MATH run in the tested dtype sets. Every test needs a GPU of sm_80 or
// newer and skips, with the reason, without one.

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/flash_device.h"
#include "cuda/flex_golden.h"
#include "cuda/nvrtc.h"
#include "sdpa/cuda.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::SDPBackend;
using sdpa::flex::Expr;
using sdpa::flex::Program;

class CudaFlashFlex : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kFlexTestsOnCpu) {
      if (const std::string why = cuda_flash_skip_reason(); !why.empty()) GTEST_SKIP() << why;
      if (!sdpa::cuda::nvrtc_load_error().empty()) {
        GTEST_SKIP() << sdpa::cuda::nvrtc_load_error();
      }
    }
  }

  static void expect_matches_golden(const std::string& name, const std::optional<Program>& mod,
                                    const FlexCase& c,
                                    const sdpa::flex::BlockMask* block_mask = nullptr) {
    expect_flex_matches_golden(SDPBackend::FLASH_ATTENTION, name, mod, c, block_mask);
  }
};

TEST_F(CudaFlashFlex, StandardModsMatchTheGoldenOnOddSizes) {
  const StandardScoreMods mods(/*max_distance=*/1000, DType::kFloat32);
  const FlexCase cases[] = {{1, 4, 4, 65, 257, 64, DType::kBFloat16},
                            {2, 4, 2, 7, 129, 128, DType::kFloat16},
                            {1, 4, 1, 257, 63, 32, DType::kBFloat16},
                            {1, 4, 4, 63, 65, 256, DType::kFloat16},
                            {1, 4, 2, 1, 1000, 72, DType::kBFloat16}};
  for (const FlexCase& c : cases) mods.expect_match_golden(SDPBackend::FLASH_ATTENTION, c);
}

// BlockMasks: tile skipping by the block lists, the mask_mod on partial blocks only, with
// and without a score_mod, several block sizes, rows without any key.
TEST_F(CudaFlashFlex, BlockMasksMatchTheGoldenOnOddSizes) {
  using sdpa::flex::BlockMask;
  using sdpa::flex::create_block_mask;
  namespace mods = sdpa::flex::mods;
  const Program soft_cap = Program::from_score_mod(mods::soft_cap(2.0));
  Tensor ids = Tensor::empty({1000}, DType::kInt64);
  for (int64_t i = 0; i < 1000; ++i) ids.data<int64_t>()[i] = i / 77 + (i > 500 ? 3 : 0);
  const Program documents = Program::from_mask_mod(mods::document(ids));
  const Program window = Program::from_mask_mod(mods::sliding_window(70));
  const Program prefix = Program::from_mask_mod(mods::prefix_lm(100));
  // Causal with whole rows of every seventh query masked (out 0, lse -inf).
  const Program holes =
      Program::from_mask_mod([](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return (q % Expr(7) != Expr(3)) && (kv <= q);
      });
  struct MaskCase {
    const char* name;
    const Program* mask_mod;
    int64_t q_block, kv_block;
  };
  const MaskCase masks[] = {{"documents", &documents, 128, 128},
                            {"window", &window, 64, 64},
                            {"prefix-LM", &prefix, 128, 64},
                            {"holes", &holes, 64, 192}};
  const FlexCase cases[] = {{1, 4, 4, 257, 300, 64, DType::kBFloat16},
                            {2, 4, 2, 65, 1000, 128, DType::kFloat16},
                            {1, 4, 1, 129, 63, 32, DType::kBFloat16},
                            {1, 2, 2, 200, 257, 256, DType::kFloat16}};
  for (const FlexCase& c : cases) {
    for (const MaskCase& m : masks) {
      const BlockMask block_mask = create_block_mask(*m.mask_mod, c.batch, c.heads_q, c.q_len,
                                                     c.kv_len, m.q_block, m.kv_block);
      expect_matches_golden(m.name, std::nullopt, c, &block_mask);
      expect_matches_golden(std::string(m.name) + " + soft_cap", soft_cap, c, &block_mask);
    }
  }
}

// A BlockMask of block lists without a mask_mod: listed partial blocks count whole, the
// others are empty, rows of q blocks without any list have no key.
TEST_F(CudaFlashFlex, BlockListsWithoutAMaskModMatchTheGolden) {
  const int64_t q_len = 300, kv_len = 333, q_block = 128, kv_block = 64;
  const int64_t nq = 3, nkv = 6;
  sdpa::flex::KvBlocks lists;
  lists.num = Tensor::zeros({1, 2, nq}, DType::kInt32);
  lists.indices = Tensor::zeros({1, 2, nq, nkv}, DType::kInt32);
  lists.full_num = Tensor::zeros({1, 2, nq}, DType::kInt32);
  lists.full_indices = Tensor::zeros({1, 2, nq, nkv}, DType::kInt32);
  // Head 0: q block 0 has kv blocks 1 and 4 partial, 5 (the short last block) full; q block
  // 1 only full block 0; q block 2 none. Head 1: every kv block of every q block partial.
  const auto set = [](Tensor& t, std::vector<int64_t> at, int32_t value) {
    int64_t offset = 0;
    for (size_t d = 0; d < at.size(); ++d) offset += at[d] * t.stride(static_cast<int64_t>(d));
    t.data<int32_t>()[offset] = value;
  };
  set(lists.num, {0, 0, 0}, 2);
  set(lists.indices, {0, 0, 0, 0}, 1);
  set(lists.indices, {0, 0, 0, 1}, 4);
  set(lists.full_num, {0, 0, 0}, 1);
  set(lists.full_indices, {0, 0, 0, 0}, 5);
  set(lists.full_num, {0, 0, 1}, 1);
  for (int64_t qb = 0; qb < nq; ++qb) {
    set(lists.num, {0, 1, qb}, static_cast<int32_t>(nkv));
    for (int64_t kb = 0; kb < nkv; ++kb)
      set(lists.indices, {0, 1, qb, kb}, static_cast<int32_t>(kb));
  }
  const sdpa::flex::BlockMask block_mask =
      sdpa::flex::block_mask_from_kv_blocks(lists, q_len, kv_len, q_block, kv_block, std::nullopt);
  expect_matches_golden("block lists", std::nullopt, {1, 2, 2, q_len, kv_len, 64, DType::kBFloat16},
                        &block_mask);
}

TEST_F(CudaFlashFlex, BlockSizesOutsideTheTilesAreRefusedWithTheReason) {
  SDPA_GPU_BEHAVIOUR_ONLY();
  const Program causal = Program::from_mask_mod(sdpa::flex::mods::causal());
  const sdpa::flex::BlockMask block_mask = sdpa::flex::create_block_mask(causal, 1, 2, 96, 96, 48);
  const Tensor q = to_gpu(randn({1, 2, 96, 64}, DType::kBFloat16, 48));
  sdpa::sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
  const std::string message =
      error_message([&] { sdpa::flex_attention(q, q, q, std::nullopt, &block_mask); });
  EXPECT_NE(message.find("BLOCK_SIZE multiples of (64, 64) at this head dim, got (48, 48)"),
            std::string::npos)
      << message;
}

TEST_F(CudaFlashFlex, AnOutOfRangeReadOfTheMaskModIsAnErrorNamingIt) {
  SDPA_GPU_BEHAVIOUR_ONLY();
  const sdpa::flex::Captured small("allowed", Tensor::full({10}, 1.0, DType::kInt64));
  const Program mask_mod =
      Program::from_mask_mod([small](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return Expr(small[kv]) > Expr(0) || q < kv;
      });
  // Evaluated on the CPU only where interval analysis cannot keep its reads in bounds:
  // built from lists instead, so the GPU meets the bad read first.
  sdpa::flex::KvBlocks lists;
  lists.num = Tensor::full({1, 1, 1}, 1.0, DType::kInt32);
  lists.indices = Tensor::zeros({1, 1, 1, 1}, DType::kInt32);
  const sdpa::flex::BlockMask block_mask =
      sdpa::flex::block_mask_from_kv_blocks(lists, 16, 16, 64, 64, mask_mod);
  const Tensor q = to_gpu(randn({1, 2, 16, 64}, DType::kBFloat16, 49));
  sdpa::sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
  const std::string message =
      error_message([&] { sdpa::flex_attention(q, q, q, std::nullopt, &block_mask); });
  EXPECT_NE(message.find("flex mask_mod: index"), std::string::npos) << message;
  EXPECT_NE(message.find("'allowed'"), std::string::npos) << message;
}

TEST_F(CudaFlashFlex, CapturedTensorsOnTheDeviceAreReadInPlace) {
  const Tensor table = randn({4, 2 * 128 + 1}, DType::kBFloat16, 42);
  const Program host = Program::from_score_mod(sdpa::flex::mods::relative_position(table, 128));
  const Program device =
      Program::from_score_mod(sdpa::flex::mods::relative_position(to_gpu(table), 128));
  const Tensor q = randn({1, 4, 65, 64}, DType::kBFloat16, 43);
  const Tensor kv = randn({1, 4, 129, 64}, DType::kBFloat16, 44);
  sdpa::sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
  const Tensor a = to_cpu(sdpa::flex_attention(to_gpu(q), to_gpu(kv), to_gpu(kv), host).out);
  const Tensor b = to_cpu(sdpa::flex_attention(to_gpu(q), to_gpu(kv), to_gpu(kv), device).out);
  EXPECT_TRUE(bit_identical(a, b));
}

TEST_F(CudaFlashFlex, AnOutOfRangeCapturedReadIsAnErrorNamingTheTensor) {
  const sdpa::flex::Captured small("bias_row", randn({10}, DType::kFloat32, 45));
  const Program mod =
      Program::from_score_mod([small](const Expr& s, const Expr&, const Expr&, const Expr&,
                                      const Expr& kv) { return s + Expr(small[kv]); });
  const Tensor q = randn({1, 2, 16, 64}, DType::kBFloat16, 46);
  sdpa::sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
  const std::string message =
      error_message([&] { sdpa::flex_attention(to_gpu(q), to_gpu(q), to_gpu(q), mod); });
  EXPECT_NE(message.find("out of range"), std::string::npos) << message;
  EXPECT_NE(message.find("bias_row"), std::string::npos) << message;
}

TEST_F(CudaFlashFlex, BlockMasksReachFlashByDefaultAndAttnMasksBesideAProgramAreRefused) {
  SDPA_GPU_BEHAVIOUR_ONLY();
  const Tensor q = to_gpu(randn({1, 2, 128, 64}, DType::kBFloat16, 47));
  // cuDNN takes a BlockMask of a band only (its native band): a document mask's default
  // order reaches FLASH, not MATH.
  Tensor ids = Tensor::empty({128}, DType::kInt64);
  for (int64_t i = 0; i < 128; ++i) ids.data<int64_t>()[i] = i / 40;
  sdpa::AttentionParams p = sdpa::make_params(q, q, q, {});
  p.mask.block_mask = std::make_shared<const sdpa::flex::BlockMask>(
      sdpa::flex::create_block_mask(sdpa::flex::mods::document(ids), 1, 1, 128, 128));
  const sdpa::Explanation e = sdpa::explain(p);
  EXPECT_EQ(e.chosen, SDPBackend::FLASH_ATTENTION) << e.to_string();
  p.mask.block_mask = std::make_shared<const sdpa::flex::BlockMask>(
      sdpa::flex::create_block_mask(sdpa::flex::mods::causal(), 1, 1, 128, 128));
  EXPECT_EQ(sdpa::explain(p).chosen, SDPBackend::CUDNN_ATTENTION) << sdpa::explain(p).to_string();
  sdpa::SDPAOptions o;
  o.attn_mask = to_gpu(randn({128, 128}, DType::kBFloat16, 48));
  const Program mod = Program::from_score_mod(sdpa::flex::mods::soft_cap(2.0));
  sdpa::sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
  const std::string message =
      error_message([&] { sdpa::flex_attention(q, q, q, mod, nullptr, o); });
  EXPECT_NE(message.find("beside ALiBi or an attn_mask"), std::string::npos) << message;
}

}  // namespace
}  // namespace sdpa_test
