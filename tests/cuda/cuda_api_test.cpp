// What needs no GPU: the CUDA functions answer in every build, and calls on CUDA tensors
// are explained (every backend's reasons) and refused with sdpa::Error, never a crash.

#include "sdpa/cuda.h"
#include "sdpa/flex_mods.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::Device;
using sdpa::DeviceType;
using sdpa::SDPBackend;

// A [1, 2, 8, 64] float16 CUDA tensor header that no call may dereference here: the
// pointer is never read by explain or by the checks that refuse the call.
Tensor fake_cuda_tensor() {
  alignas(16) static unsigned char storage[16];
  return Tensor::from_blob(storage, {1, 2, 8, 64}, sdpa::contiguous_strides({1, 2, 8, 64}),
                           DType::kFloat16, Device{DeviceType::kCUDA, 0});
}

TEST(CudaApi, ReportsWhetherItIsBuiltAndAvailable) {
#ifdef SDPA_HAVE_CUDA
  EXPECT_TRUE(sdpa::cuda::is_built());
#else
  EXPECT_FALSE(sdpa::cuda::is_built());
  EXPECT_FALSE(sdpa::cuda::cudnn_is_built());
#endif
  EXPECT_EQ(sdpa::cuda::is_available(), sdpa::cuda::device_count() > 0);
  EXPECT_EQ(sdpa::cuda::is_available(), sdpa::cuda::unavailable_reason().empty());
}

TEST(CudaApi, ExplainListsEveryBackendForCudaTensors) {
  const Tensor q = fake_cuda_tensor();
  if (sdpa::cuda::is_available())
    GTEST_SKIP() << "a GPU is present: the fake pointer would be read";
  const sdpa::Explanation e = sdpa::explain(sdpa::make_params(q, q, q, {}));
  for (const auto& v : e.verdicts) {
    if (v.backend == SDPBackend::MATH) continue;  // MATH's checks accept any CUDA call
    EXPECT_FALSE(v.supported) << sdpa::backend_name(v.backend);
    EXPECT_FALSE(v.reasons.empty()) << sdpa::backend_name(v.backend);
  }
  const std::string text = e.to_string();
  // FLASH runs on CUDA tensors of sm_80+ devices in a CUDA build: here it says why not.
  const size_t flash = text.find("FLASH_ATTENTION is not supported because:");
  ASSERT_NE(flash, std::string::npos) << text;
  EXPECT_NE(text.find(sdpa::cuda::is_built() ? "the compute capability of cuda:0 cannot be read"
                                             : "built without CUDA",
                      flash),
            std::string::npos)
      << text;
}

#ifdef SDPA_HAVE_CUDNN
TEST(CudaApi, ExplainShowsTheScoreModAsCudnnPointwiseNodes) {
  if (sdpa::cuda::is_available())
    GTEST_SKIP() << "a GPU is present: the fake pointer would be read";
  const Tensor q = fake_cuda_tensor();
  sdpa::AttentionParams p = sdpa::make_params(q, q, q, {});
  p.mask.score_mod = std::make_shared<const sdpa::flex::Program>(
      sdpa::flex::Program::from_score_mod(sdpa::flex::mods::soft_cap(20.0)));
  const std::string text = sdpa::explain(p).to_string();
  EXPECT_NE(text.find("score_mod as cuDNN pointwise nodes"), std::string::npos) << text;
  EXPECT_NE(text.find("TANH_FWD"), std::string::npos) << text;
  // Lowering takes it; only the missing device refuses the backend here.
  const size_t cudnn = text.find("CUDNN_ATTENTION is not supported");
  const std::string reasons = text.substr(cudnn, text.find("| score_mod", cudnn) - cudnn);
  EXPECT_EQ(reasons.find("flex:"), std::string::npos) << text;
}
#endif

TEST(CudaApi, CallsWithoutADeviceAreErrors) {
  if (sdpa::cuda::is_available()) GTEST_SKIP() << "a GPU is present";
  const Tensor q = fake_cuda_tensor();
  EXPECT_NE(error_message([&] { sdpa::scaled_dot_product_attention(q, q, q, {}); }), "");
  EXPECT_NE(error_message([&] { sdpa::cuda::empty({4}, DType::kFloat32); }), "");
  EXPECT_NE(error_message([&] {
              sdpa::cuda::to_device(randn({4}, DType::kFloat32, 1), Device{DeviceType::kCUDA, 0});
            }),
            "");
}

TEST(CudaApi, CpuTensorsNeverReachCudaBackends) {
  const Tensor q = randn({1, 2, 8, 64}, DType::kBFloat16, 1);
  sdpa::Reasons reasons;
  EXPECT_FALSE(
      sdpa::can_use(SDPBackend::CUDNN_ATTENTION, sdpa::make_params(q, q, q, {}), &reasons));
  ASSERT_FALSE(reasons.items.empty());
}

}  // namespace
}  // namespace sdpa_test
