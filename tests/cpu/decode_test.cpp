// The split-KV decode path of FLASH_ATTENTION (src/cpu/flash_decode.h): calls with at most
// kDecodeMaxRows query rows per kv head. Checked against the float64 reference across
// chunk boundaries (S around multiples of 512), GQA groups, dtypes, layouts, masks,
// causal with L > 1, fully masked rows and every SIMD path; bit-identical for 1 and 2
// threads; the same dropout mask as MATH.

#include <gtest/gtest.h>

#include <cstring>

#include "common/capability.h"
#include "common/harness.h"
#include "common/threads.h"
#include "cpu/flash_decode.h"
#include "sdpa/attn_bias.h"

namespace sdpa::test {
namespace {

namespace bcpu = backends::cpu;

void expect_flash_ran(const Case& c, const CaseReport& r) {
  EXPECT_TRUE(r.ran_backend(SDPBackend::FLASH_ATTENTION)) << c.describe();
  EXPECT_TRUE(r.ran_backend(SDPBackend::MATH)) << c.describe();
}

// FLASH on bf16 inputs gives the same out and lse bits with 1 and 2 threads.
void expect_thread_count_invariant(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const SDPAOptions& options) {
  const sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
  const AttentionResult one = [&] {
    const ScopedThreads scoped(1);
    return scaled_dot_product_attention_with_lse(q, k, v, options);
  }();
  const AttentionResult two = [&] {
    const ScopedThreads scoped(2);
    return scaled_dot_product_attention_with_lse(q, k, v, options);
  }();
  EXPECT_EQ(std::memcmp(one.out.data_ptr(), two.out.data_ptr(), one.out.numel() * 2), 0);
  EXPECT_EQ(std::memcmp(one.lse.data_ptr(), two.lse.data_ptr(), one.lse.numel() * 4), 0);
}

// check_case on every SIMD path, the inputs and their float64 reference built once (the
// paths read the same inputs; building them took most of these tests' time). also(inputs)
// runs after each path's check.
template <class F>
void check_on_every_capability(const Case& c, const F& also) {
  const CaseInputs in = make_inputs(c);
  for (const std::string& capability : supported_capabilities()) {
    bcpu::set_cpu_capability(capability);
    SCOPED_TRACE(capability);
    expect_flash_ran(c, check_inputs(in, c.dtype, c.unbatched, c.describe()));
    also(in);
  }
}
void check_on_every_capability(const Case& c) {
  check_on_every_capability(c, [](const CaseInputs&) {});
}

TEST(Decode, ChunkBoundariesGroupsAndDtypesMatchReference) {
  const ScopedCapability reset;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t kv_len : {1, 63, 511, 512, 513, 1100, 2049}) {
      Case c;
      c.batch = 2;
      c.heads_q = 8;
      c.heads_kv = 2;  // 4 query heads per kv head
      c.enable_gqa = true;
      c.q_len = 1;
      c.kv_len = kv_len;
      c.head_dim = kv_len % 2 ? 80 : 128;
      c.head_dim_v = kv_len % 2 ? 48 : 128;
      // Key rows of another stride than head_dim (bf16 keys are read in place).
      c.kv_layout = kv_len % 2 ? Layout::kBSHD : Layout::kBHSD;
      c.dtype = dtype;
      c.seed = static_cast<uint32_t>(kv_len * 7 + static_cast<int>(dtype));
      check_on_every_capability(c);
    }
  }
}

// Key and value rows of unit stride are read in place (bf16 by vdpbf16ps where the CPU has
// it, else loaded or widened in registers): head dims with a partial last block
// (67, 33, 1, 17, 24), row counts that leave 1, 2 or 3 rows after blocks of four (1, 6, 7,
// 8 rows), misaligned rows (kSliceD) and a key stride that sends the keys through the
// float32 tile (kStridedD).
TEST(Decode, RowsInPlaceOddHeadDimsAndRowCounts) {
  const ScopedCapability reset;
  struct Shape {
    int64_t heads_q, heads_kv, q_len, head_dim, head_dim_v;
    Layout kv_layout;
  };
  const Shape shapes[] = {{3, 3, 1, 67, 33, Layout::kBHSD}, {6, 1, 1, 24, 200, Layout::kSliceD},
                          {7, 1, 1, 1, 17, Layout::kBSHD},  {8, 2, 2, 128, 128, Layout::kSliceD},
                          {5, 1, 1, 64, 96, Layout::kBSHD}, {4, 2, 3, 33, 67, Layout::kStridedD}};
  for (const Shape& s : shapes) {
    for (int64_t kv_len : {7, 700, 1029}) {
      for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
        Case c;
        c.batch = 2;
        c.heads_q = s.heads_q;
        c.heads_kv = s.heads_kv;
        c.enable_gqa = s.heads_q != s.heads_kv;
        c.q_len = s.q_len;
        c.kv_len = kv_len;
        c.causal = s.q_len > 1;
        c.head_dim = s.head_dim;
        c.head_dim_v = s.head_dim_v;
        c.kv_layout = s.kv_layout;
        c.dtype = dtype;
        c.seed = static_cast<uint32_t>(kv_len * 13 + s.head_dim);
        check_on_every_capability(c);
      }
    }
  }
}

TEST(Decode, SeveralQueryRowsCausalAndMasks) {
  for (int64_t q_len : {2, 3, 4}) {
    for (MaskKind mask : {MaskKind::kNone, MaskKind::kBool, MaskKind::kFloat}) {
      Case c;
      c.heads_q = 4;
      c.heads_kv = 1;
      c.enable_gqa = true;
      c.q_len = q_len;
      c.kv_len = 1000 + q_len;
      c.head_dim = 64;
      c.mask = mask;
      c.causal = mask == MaskKind::kNone;
      if (mask != MaskKind::kNone) {
        c.mask_shape = {1, 4, q_len, c.kv_len};
        c.masked_rows = {q_len - 1};  // a fully masked row: zeros and -inf
      }
      c.kv_layout = Layout::kBSHD;
      c.q_layout = Layout::kStridedD;
      c.seed = static_cast<uint32_t>(q_len * 31 + static_cast<int>(mask));
      expect_flash_ran(c, check_case(c));
    }
  }
}

// Items of several kv heads (kv_heads_per_item > 1: K/V of [B, S, Hkv, E] storage) copy
// each key tile of their heads before the heads read it. Checked against the float64
// reference on every SIMD path: a head count that leaves a shorter last block (5 kv heads
// in blocks of 3 and 2 at float32 and head dims 200 / 136), GQA with several query rows,
// causal and masks with a fully masked row, key tiles cut by chunk ends; and the blocking
// rule.
TEST(Decode, HeadBlocksStageKeyTilesAndMatchReference) {
  const auto heads_per_item = [](int64_t Hkv, int64_t E, DType dtype, Layout layout) {
    std::mt19937 rng(1);
    const Tensor q = random_tensor({1, Hkv, 1, E}, dtype, Layout::kBHSD, rng);
    const Tensor k = random_tensor({1, Hkv, 70, E}, dtype, layout, rng);
    return cpu::kv_heads_per_item(make_params(q, k, k, SDPAOptions{}));
  };
  // 256 KiB of a 64-key tile's K and V rows per item, in equal blocks.
  EXPECT_EQ(heads_per_item(8, 128, DType::kBFloat16, Layout::kBSHD), 8);
  EXPECT_EQ(heads_per_item(8, 128, DType::kFloat32, Layout::kBSHD), 4);
  EXPECT_EQ(heads_per_item(12, 256, DType::kFloat32, Layout::kBSHD), 2);
  EXPECT_EQ(heads_per_item(20, 64, DType::kBFloat16, Layout::kBSHD), 10);
  EXPECT_EQ(heads_per_item(3, 512, DType::kFloat32, Layout::kBSHD), 1);
  EXPECT_EQ(heads_per_item(1, 64, DType::kFloat32, Layout::kBSHD), 1);
  EXPECT_EQ(heads_per_item(8, 128, DType::kBFloat16, Layout::kBHSD), 1);

  const ScopedCapability reset;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Case c;
    c.batch = 2;
    c.heads_q = 15;
    c.heads_kv = 5;
    c.enable_gqa = true;
    c.q_len = 2;
    c.kv_len = 1100;
    c.head_dim = 200;
    c.head_dim_v = 136;
    c.causal = true;
    c.kv_layout = Layout::kBSHD;
    c.dtype = dtype;
    c.seed = 11 + static_cast<uint32_t>(dtype);
    check_on_every_capability(c);

    Case masked = c;
    masked.heads_q = 8;
    masked.heads_kv = 8;
    masked.head_dim = masked.head_dim_v = 40;
    masked.kv_len = 577;
    masked.causal = false;
    masked.mask = dtype == DType::kFloat32 ? MaskKind::kFloat : MaskKind::kBool;
    masked.mask_shape = {1, 8, 2, masked.kv_len};
    masked.masked_rows = {1};
    check_on_every_capability(masked);
  }
}

TEST(Decode, NativeBiasesMatchTheirMaterialization) {
  const int64_t B = 2, Hq = 8, Hkv = 4, L = 2, S = 1300, E = 64;
  std::mt19937 rng(5);
  const Tensor q = random_tensor({B, Hq, L, E}, DType::kFloat32, Layout::kBHSD, rng);
  const Tensor k = random_tensor({B, Hkv, S, E}, DType::kFloat32, Layout::kBHSD, rng);
  const Tensor v = random_tensor({B, Hkv, S, E}, DType::kFloat32, Layout::kBHSD, rng);
  const std::vector<AttnBiasPtr> biases = {
      causal_lower_right(L, S), std::make_shared<LocalAttentionBias>(300, 0),
      std::make_shared<AlibiBias>(Hq),
      std::make_shared<PaddedKeysBias>(std::vector<int64_t>{700, 0}),
      compose({std::make_shared<PaddedKeysBias>(std::vector<int64_t>{1290, 513}, true),
               std::make_shared<AlibiBias>(Hq)})};
  for (const AttnBiasPtr& bias : biases) {
    SDPAOptions native;
    native.enable_gqa = true;
    native.attn_mask = bias;
    SDPAOptions dense = native;
    dense.attn_mask = bias->materialize({B, Hq, L, S}, DType::kFloat32);
    AttentionResult flash, math;
    {
      const sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
      flash = scaled_dot_product_attention_with_lse(q, k, v, native);
    }
    {
      const sdpa_kernel only(SDPBackend::MATH);
      math = scaled_dot_product_attention_with_lse(q, k, v, dense);
    }
    for (int64_t i = 0; i < flash.out.numel(); ++i) {
      ASSERT_NEAR(flash.out.data<float>()[i], math.out.data<float>()[i], 2e-5) << bias->describe();
    }
    for (int64_t i = 0; i < flash.lse.numel(); ++i) {
      const float a = flash.lse.data<float>()[i], b = math.lse.data<float>()[i];
      if (std::isinf(b)) {
        ASSERT_EQ(a, b) << bias->describe();
      } else {
        ASSERT_NEAR(a, b, 1e-4) << bias->describe();
      }
    }
  }
}

// Long calls with many (batch, kv head) groups take 1024- and 2048-key chunks: checked
// against the float64 reference on every SIMD path, odd lengths (a short last chunk), and
// bit-identical for 1 and 2 threads. The chunking does not depend on the dtype.
TEST(Decode, LongerChunksMatchReferenceAndAreThreadCountInvariant) {
  const ScopedCapability reset;
  for (const auto& [kv_len, chunk_len] : {std::pair<int64_t, int64_t>{9001, 1024}, {16500, 2048}}) {
    Case c;
    c.batch = 2;
    c.heads_q = 16;
    c.heads_kv = 8;
    c.enable_gqa = true;
    c.kv_len = kv_len;
    c.head_dim = 72;
    c.head_dim_v = 40;
    c.dtype = DType::kBFloat16;
    c.seed = static_cast<uint32_t>(kv_len);
    // The chunk length depends on the shapes only.
    SDPAOptions options;
    options.enable_gqa = true;
    const Tensor q = Tensor::empty({2, 16, 1, 72}, DType::kBFloat16);
    const Tensor k = Tensor::empty({2, 8, kv_len, 72}, DType::kBFloat16);
    const Tensor v = Tensor::empty({2, 8, kv_len, 40}, DType::kBFloat16);
    EXPECT_EQ(cpu::decode_chunk_len(make_params(q, k, v, options)), chunk_len);
    check_on_every_capability(c, [](const CaseInputs& in) {
      expect_thread_count_invariant(in.q, in.k, in.v, in.options);
    });
  }
}

TEST(Decode, BitIdenticalForOneAndTwoThreadsAndDropoutMatchesMath) {
  const int64_t B = 1, Hq = 8, Hkv = 2, L = 1, S = 3000, E = 64;
  std::mt19937 rng(9);
  const Tensor q = random_tensor({B, Hq, L, E}, DType::kBFloat16, Layout::kBHSD, rng);
  const Tensor k = random_tensor({B, Hkv, S, E}, DType::kBFloat16, Layout::kBHSD, rng);
  const Tensor v = random_tensor({B, Hkv, S, E}, DType::kBFloat16, Layout::kBHSD, rng);
  SDPAOptions options;
  options.enable_gqa = true;
  expect_thread_count_invariant(q, k, v, options);

  Case c;
  c.heads_q = Hq;
  c.heads_kv = Hkv;
  c.enable_gqa = true;
  c.q_len = 1;
  c.kv_len = 1500;
  c.dropout_p = 0.3;
  expect_flash_ran(c, check_case(c));
}

}  // namespace
}  // namespace sdpa::test
