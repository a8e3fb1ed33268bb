// FLASH_ATTENTION on CUDA tensors (sdpa's own tensor-core forward) against the float64 CPU
// MATH golden, with the tolerance the naive CPU MATH run in the tested dtype sets
// (tests/training/attention_test_util.h). Every test needs a GPU of sm_80 or newer and
// skips, with the reason, without one.

#include <cuda_runtime_api.h>

#include <sstream>
#include <string>
#include <vector>

#include "cuda/flash_device.h"
#include "cuda/native_mask_cases.h"
#include "sdpa/attn_bias.h"
#include "sdpa/cuda.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::DiagonalAlignment;
using sdpa::SDPAOptions;
using sdpa::SDPBackend;

const sdpa::Device kCuda{sdpa::DeviceType::kCUDA, 0};

Tensor gpu(const Tensor& host, sdpa::cuda::Stream stream = nullptr) {
  if (!host.defined()) return host;
  // A [B, N, H, D] storage viewed as [B, H, N, D] keeps its layout on the device.
  if (!host.is_contiguous() && host.dim() == 4 && host.transpose(1, 2).is_contiguous()) {
    return sdpa::cuda::to_device(host.transpose(1, 2), kCuda, stream).transpose(1, 2);
  }
  return sdpa::cuda::to_device(host, kCuda, stream);
}

Tensor cpu(const Tensor& t) { return sdpa::cuda::to_device(t, sdpa::Device{}); }

struct FlashCase {
  int64_t batch, heads_q, heads_kv, q_len, kv_len, head_dim, head_dim_v;
  DType dtype;
  Layout layout = Layout::kBHSD;
};

std::string describe(const FlashCase& c) {
  std::ostringstream os;
  os << "B" << c.batch << " Hq" << c.heads_q << " Hkv" << c.heads_kv << " L" << c.q_len << " S"
     << c.kv_len << " E" << c.head_dim << " Ev" << c.head_dim_v << ' '
     << sdpa::dtype_name(c.dtype) << (c.layout == Layout::kBSHD ? " BSHD" : "");
  return os.str();
}

struct Inputs {
  Tensor q, k, v;
};

Inputs inputs(const FlashCase& c) {
  return {randn_layout({c.batch, c.heads_q, c.q_len, c.head_dim}, c.dtype, 1, c.layout),
          randn_layout({c.batch, c.heads_kv, c.kv_len, c.head_dim}, c.dtype, 2, c.layout),
          randn_layout({c.batch, c.heads_kv, c.kv_len, c.head_dim_v}, c.dtype, 3, c.layout)};
}

// The CPU options with any tensor mask moved to the device.
SDPAOptions on_device(SDPAOptions o) {
  if (o.attn_mask.tensor().defined()) o.attn_mask = gpu(o.attn_mask.tensor());
  return o;
}

// Runs the forward of `c` on CUDA FLASH and checks out and lse against the golden (whose
// additive mask is the same values in float64).
void expect_flash_matches_golden(const FlashCase& c, const SDPAOptions& host_options) {
  SCOPED_TRACE(describe(c));
  const Inputs in = inputs(c);
  SDPAOptions g_options = host_options;
  const Tensor mask = host_options.attn_mask.tensor();
  if (mask.defined() && mask.dtype() != DType::kBool) g_options.attn_mask = f64(mask);
  sdpa::AttentionResult golden, naive, tested;
  {
    sdpa::sdpa_kernel only(SDPBackend::MATH);
    golden =
        sdpa::scaled_dot_product_attention_with_lse(f64(in.q), f64(in.k), f64(in.v), g_options);
    naive = sdpa::scaled_dot_product_attention_with_lse(in.q, in.k, in.v, host_options);
  }
  const SDPAOptions o = on_device(host_options);
  const Tensor q = gpu(in.q), k = gpu(in.k), v = gpu(in.v);
  sdpa::Reasons reasons;
  ASSERT_TRUE(sdpa::can_use(SDPBackend::FLASH_ATTENTION, sdpa::make_params(q, k, v, o), &reasons))
      << (reasons.items.empty() ? "" : reasons.items.front());
  {
    sdpa::sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
    tested = sdpa::scaled_dot_product_attention_with_lse(q, k, v, o);
  }
  EXPECT_EQ(tested.backend, SDPBackend::FLASH_ATTENTION);
  EXPECT_EQ(tested.out.dtype(), c.dtype);
  EXPECT_TRUE(close_to_golden("out", cpu(tested.out), golden.out, naive.out, c.dtype));
  EXPECT_TRUE(close_to_golden("lse", cpu(tested.lse), golden.lse, naive.lse, DType::kFloat32,
                              kFudge, c.dtype));
}

enum class Mask { kNone, kCausal, kCausalLowerRight, kWindow, kFloat, kBool };

SDPAOptions mask_options(const FlashCase& c, Mask mask) {
  SDPAOptions o;
  o.enable_gqa = c.heads_q != c.heads_kv;
  switch (mask) {
    case Mask::kNone:
      break;
    case Mask::kCausal:
      o.is_causal = true;
      break;
    case Mask::kCausalLowerRight:
      o.attn_mask = sdpa::causal_lower_right(c.q_len, c.kv_len);
      break;
    case Mask::kWindow:
      o.attn_mask = std::make_shared<sdpa::LocalAttentionBias>(17, 3, DiagonalAlignment::kTopLeft);
      break;
    case Mask::kFloat:
      o.attn_mask = randn({1, c.heads_q, c.q_len, c.kv_len}, c.dtype, 5);
      break;
    case Mask::kBool:
      o.attn_mask = random_bool({c.batch, 1, c.q_len, c.kv_len}, 0.7, 5);
      break;
  }
  return o;
}

class CudaFlash : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = cuda_flash_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(CudaFlash, MatchesGoldenOnOddSizesAndEveryMask) {
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1},   {7, 129},   {63, 65},
                                               {65, 63}, {127, 257}, {257, 100}};
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t e : {64, 128}) {
      for (auto [l, s] : sizes) {
        for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kCausalLowerRight, Mask::kWindow,
                       Mask::kFloat, Mask::kBool}) {
          const FlashCase c{2, 8, 2, l, s, e, e, dtype};
          SCOPED_TRACE("mask " + std::to_string(static_cast<int>(m)));
          expect_flash_matches_golden(c, mask_options(c, m));
        }
      }
    }
  }
}

TEST_F(CudaFlash, TakesEveryHeadDimTileAndGqaRatio) {
  // Head dims inside each tile (32, 64, 128, 256) and padded up to it; GQA 1, 3, 8.
  for (int64_t e : {8, 24, 40, 72, 96, 136, 200, 256}) {
    for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{3, 3}, {6, 2}, {8, 1}}) {
      const FlashCase c{1, hq, hkv, 65, 130, e, e, DType::kBFloat16};
      expect_flash_matches_golden(c, mask_options(c, Mask::kCausal));
    }
  }
}

TEST_F(CudaFlash, ValueHeadDimDiffersFromQueryHeadDim) {
  for (auto [e, ev] : {std::pair<int64_t, int64_t>{64, 128}, {128, 40}, {32, 256}}) {
    const FlashCase c{2, 4, 2, 70, 90, e, ev, DType::kFloat16};
    expect_flash_matches_golden(c, mask_options(c, Mask::kNone));
    expect_flash_matches_golden(c, mask_options(c, Mask::kCausal));
  }
}

TEST_F(CudaFlash, TakesStridedInputs) {
  for (Mask m : {Mask::kNone, Mask::kCausal}) {
    const FlashCase c{2, 8, 8, 129, 257, 64, 64, DType::kBFloat16, Layout::kBSHD};
    expect_flash_matches_golden(c, mask_options(c, m));
  }
}

TEST_F(CudaFlash, LongRows) {
  const FlashCase c{1, 2, 1, 4097, 4097, 128, 128, DType::kBFloat16};
  expect_flash_matches_golden(c, mask_options(c, Mask::kCausal));
  const FlashCase w{1, 2, 2, 1000, 3000, 64, 64, DType::kFloat16};
  expect_flash_matches_golden(w, mask_options(w, Mask::kNone));
}

TEST_F(CudaFlash, RowsWithoutKeysGiveZerosAndMinusInfinity) {
  // Bottom-right causal with L > S leaves the first L - S rows without keys; a bool mask
  // with whole rows false does the same inside a tile.
  const FlashCase c{1, 2, 2, 100, 30, 64, 64, DType::kBFloat16};
  expect_flash_matches_golden(c, mask_options(c, Mask::kCausalLowerRight));
  Tensor keep = random_bool({1, 1, 100, 30}, 0.5, 7);
  for (int64_t i : {0, 5, 64, 99}) {
    for (int64_t j = 0; j < 30; ++j) keep.set_item(Shape{0, 0, i, j}, 0.0);
  }
  SDPAOptions o;
  o.attn_mask = keep;
  expect_flash_matches_golden(c, o);
  const Inputs in = inputs(c);
  sdpa::sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
  const sdpa::AttentionResult r =
      sdpa::scaled_dot_product_attention_with_lse(gpu(in.q), gpu(in.k), gpu(in.v), on_device(o));
  const Tensor out = cpu(r.out), lse = cpu(r.lse);
  for (int64_t e = 0; e < 64; ++e) EXPECT_EQ(out.item({0, 1, 64, e}), 0.0);
  EXPECT_EQ(lse.item({0, 1, 64}), -INFINITY);
}

// ALiBi, packed documents, key padding and band compositions run natively (no dense mask).
TEST_F(CudaFlash, NativeBiases) {
  std::vector<NativeMaskCase> cases = native_mask_cases(8);
  cases.push_back({"window + causal lower right", 90, 300,
                   sdpa::compose({std::make_shared<sdpa::LocalAttentionBias>(
                                      40, 0, DiagonalAlignment::kBottomRight),
                                  sdpa::causal_lower_right(90, 300)})});
  for (const NativeMaskCase& k : cases) {
    SCOPED_TRACE(k.name);
    const FlashCase c{2, 8, 2, k.q_len, k.kv_len, 64, 64, DType::kBFloat16};
    SDPAOptions o;
    o.enable_gqa = true;
    o.attn_mask = k.bias;
    expect_flash_matches_golden(c, o);
  }
}

TEST_F(CudaFlash, RunsOnTheCallersStreamAndRepeatsBitForBit) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    const FlashCase c{2, 4, 4, 300, 300, 128, 128, DType::kBFloat16};
    const Inputs in = inputs(c);
    SDPAOptions o;
    o.is_causal = true;
    o.stream = stream;
    const Tensor q = gpu(in.q, stream), k = gpu(in.k, stream), v = gpu(in.v, stream);
    sdpa::sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
    const sdpa::AttentionResult a = sdpa::scaled_dot_product_attention_with_lse(q, k, v, o);
    const sdpa::AttentionResult b = sdpa::scaled_dot_product_attention_with_lse(q, k, v, o);
    sdpa::cuda::synchronize(stream);
    EXPECT_TRUE(bit_identical(cpu(a.out), cpu(b.out)));
    SDPAOptions host;
    host.is_causal = true;
    sdpa::sdpa_kernel math(SDPBackend::MATH);
    const Tensor golden = sdpa::scaled_dot_product_attention(f64(in.q), f64(in.k), f64(in.v), host);
    const Tensor naive = sdpa::scaled_dot_product_attention(in.q, in.k, in.v, host);
    EXPECT_TRUE(close_to_golden("out", cpu(a.out), golden, naive, c.dtype));
  }
  sdpa::cuda::synchronize(stream);
  cudaStreamDestroy(stream);
}

// What FLASH on CUDA refuses, each with its reason, and where selection goes instead.
TEST_F(CudaFlash, RefusalsNameTheirReason) {
  const Tensor q = gpu(randn({1, 2, 16, 64}, DType::kBFloat16, 1));
  const auto reason_for = [](const sdpa::AttentionParams& p) {
    sdpa::Reasons reasons;
    EXPECT_FALSE(sdpa::can_use(SDPBackend::FLASH_ATTENTION, p, &reasons));
    std::string all;
    for (const std::string& r : reasons.items) all += r + "\n";
    return all;
  };
  const Tensor q32 = gpu(randn({1, 2, 16, 64}, DType::kFloat32, 1));
  EXPECT_NE(reason_for(sdpa::make_params(q32, q32, q32, {})).find("dtype"), std::string::npos);
  const Tensor e100 = gpu(randn({1, 2, 16, 100}, DType::kBFloat16, 1));
  EXPECT_NE(reason_for(sdpa::make_params(e100, e100, e100, {})).find("head_dim"),
            std::string::npos);
  const Tensor misaligned = gpu(randn({1, 2, 16, 65}, DType::kBFloat16, 1)).slice(3, 1, 65);
  EXPECT_NE(reason_for(sdpa::make_params(misaligned, misaligned, misaligned, {})).find("layout"),
            std::string::npos);
  SDPAOptions dropout;
  dropout.dropout_p = 0.1;
  EXPECT_NE(reason_for(sdpa::make_params(q, q, q, dropout)).find("dropout"), std::string::npos);
  const sdpa::AttentionResult fwd = [&] {
    sdpa::sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
    return sdpa::scaled_dot_product_attention_with_lse(q, q, q, {});
  }();
  EXPECT_NE(
      reason_for(sdpa::make_backward_params(q, q, q, q, fwd.out, fwd.lse, {})).find("backward"),
      std::string::npos);
  // A backward after a FLASH forward runs on another backend from the same out and lse.
  const sdpa::AttentionGradients grads =
      sdpa::scaled_dot_product_attention_backward(q, q, q, q, fwd.out, fwd.lse, {});
  EXPECT_NE(grads.backend, SDPBackend::FLASH_ATTENTION);
  // explain names FLASH's verdict on CUDA tensors.
  const std::string text = sdpa::explain(sdpa::make_params(q32, q32, q32, {})).to_string();
  EXPECT_NE(text.find("FLASH_ATTENTION is not supported because"), std::string::npos) << text;
}

}  // namespace
}  // namespace sdpa_test
