// Host side of the CUDA FLASH forward with a flex score_mod (flash.h): the program's unit
// compiled by NVRTC, loaded with the runtime's library API, launched with the program's
// captured tensors and a failure record the host reads back.

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/flash/flash.h"
#include "cuda/flash/flex_unit.h"
#include "cuda/flash/forward_kernel.cuh"
#include "cuda/nvrtc.h"
#include "cuda/status.h"
#include "sdpa/cuda.h"
#include "sdpa/error.h"

namespace sdpa::cuda {
namespace {

// Host images of the prelude's SdpaCapturedTensor and SdpaFlexStatus (cuda/flex_prelude.cpp):
// the same members in the same order, so the same layout on the device.
struct CapturedTensor {
  const void* data;
  long long sizes[8];
  long long strides[8];
  int dim;
};
struct FlexStatus {
  int code;
  int slot;
  int dim;
  long long index;
  long long b, h, q_idx, kv_idx;
};

// The entry point of a unit's CUBIN, loaded once per (CUBIN, device) and allowed `smem`
// bytes of dynamic shared memory there; libraries stay loaded for the process.
cudaKernel_t kernel_for(const CompiledModule& module, int device, size_t smem) {
  static std::mutex mu;
  static auto* loaded = new std::map<std::pair<uint64_t, int>, cudaKernel_t>;
  std::lock_guard lock(mu);
  cudaKernel_t& kernel = (*loaded)[{module.key, device}];
  if (kernel == nullptr) {
    cudaLibrary_t library = nullptr;
    cudaKernel_t found = nullptr;
    detail::check(cudaLibraryLoadData(&library, module.cubin.data(), nullptr, nullptr, 0, nullptr,
                                      nullptr, 0),
                  "cudaLibraryLoadData (FLASH flex unit)");
    detail::check(cudaLibraryGetKernel(&found, library, flash::kFlexForwardEntry),
                  "cudaLibraryGetKernel (FLASH flex unit)");
    detail::check(
        cudaKernelSetAttributeForDevice(found, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem), device),
        "cudaKernelSetAttributeForDevice (FLASH flex unit, shared memory)");
    kernel = found;
  }
  return kernel;
}

// The launch shape of head-dim tile kHeadDim: dynamic shared memory per block and query
// rows per block, as forward_kernel's.
struct LaunchShape {
  size_t smem;
  int rows;
};

template <int kHeadDim>
LaunchShape launch_shape(DType dtype) {
  return {dtype == DType::kFloat16 ? flash::forward_smem_bytes<__half, kHeadDim>()
                                   : flash::forward_smem_bytes<__nv_bfloat16, kHeadDim>(),
          flash::ForwardTile<kHeadDim>::kRows};
}

LaunchShape launch_shape(DType dtype, int tile) {
  switch (tile) {
    case 32:
      return launch_shape<32>(dtype);
    case 64:
      return launch_shape<64>(dtype);
    case 128:
      return launch_shape<128>(dtype);
    default:
      return launch_shape<256>(dtype);
  }
}

std::string failure_message(const FlexStatus& s, const std::vector<flex::Captured>& captured) {
  const std::string where = " (b=" + std::to_string(s.b) + ", h=" + std::to_string(s.h) +
                            ", q_idx=" + std::to_string(s.q_idx) +
                            ", kv_idx=" + std::to_string(s.kv_idx) + ")";
  if (s.code == 2) return "flex score_mod: integer division by zero" + where;
  const bool known = s.slot >= 0 && static_cast<size_t>(s.slot) < captured.size();
  const std::string name = known ? captured[static_cast<size_t>(s.slot)].name() : "?";
  const std::string size =
      known && s.dim >= 0 && s.dim < captured[static_cast<size_t>(s.slot)].tensor().dim()
          ? std::to_string(captured[static_cast<size_t>(s.slot)].tensor().size(s.dim))
          : "?";
  return "flex score_mod: index " + std::to_string(s.index) + " is out of range for dimension " +
         std::to_string(s.dim) + " of captured tensor '" + name + "' (size " + size + ")" + where;
}

}  // namespace

bool flex_flash_enabled() {
  const char* flag = std::getenv("SDPA_CUDA_FLASH_FLEX");
  return flag != nullptr && std::strcmp(flag, "1") == 0;
}

std::string flex_flash_unavailable() {
  if (!nvrtc_load_error().empty()) return nvrtc_load_error();
  if (cuda_include_dir().empty()) {
    return "the CUDA headers (cuda_bf16.h) NVRTC needs are not found (set SDPA_CUDA_INCLUDE_DIR)";
  }
  return "";
}

void flex_flash_forward(const AttentionParams& p, flash::ForwardArgs a, int tile) {
  const flex::Program& program = *p.mask.score_mod;
  const std::vector<flex::Captured>& captured = program.captured();
  const CompiledModule& module = flash::flex_forward_module(&program, nullptr, p.dtype, tile,
                                                            compute_capability(p.device.index));
  const LaunchShape shape = launch_shape(p.dtype, tile);
  // The runtime launches a library's kernel handle passed as the function.
  const auto kernel = reinterpret_cast<const void*>(kernel_for(module, p.device.index, shape.smem));

  // Captured tensors on the call's device (host ones copied for this call), described as
  // the generated code reads them; the descriptors and the failure record go in one
  // device buffer.
  std::vector<Tensor> keep;
  std::vector<CapturedTensor> described(captured.size());
  for (size_t i = 0; i < captured.size(); ++i) {
    const Tensor& t = captured[i].tensor();
    SDPA_CHECK(t.dim() <= 8, "flex score_mod: captured tensor '", captured[i].name(), "' has ",
               t.dim(), " dimensions; at most 8 on CUDA");
    const bool here = t.device().type == DeviceType::kCUDA && t.device().index == p.device.index;
    keep.push_back(here ? t : to_device(t, p.device, p.stream));
    CapturedTensor& d = described[i];
    d = {};
    d.data = keep.back().data_ptr();
    d.dim = static_cast<int>(t.dim());
    for (int64_t k = 0; k < t.dim(); ++k) {
      d.sizes[k] = keep.back().size(k);
      d.strides[k] = keep.back().stride(k);
    }
  }
  const size_t described_bytes = described.size() * sizeof(CapturedTensor);
  Tensor host =
      Tensor::zeros({static_cast<int64_t>(described_bytes + sizeof(FlexStatus))}, DType::kBool);
  if (described_bytes > 0) std::memcpy(host.data_ptr(), described.data(), described_bytes);
  const Tensor device = to_device(host, p.device, p.stream);
  auto* base = static_cast<unsigned char*>(device.data_ptr());
  a.score_mod_captured = described.empty() ? nullptr : base;
  a.flex_status = base + described_bytes;

  const auto stream = static_cast<cudaStream_t>(p.stream);
  const int64_t blocks = (a.q_len + shape.rows - 1) / shape.rows * p.batch * p.num_heads_q;
  void* args[] = {&a};
  detail::check(cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)),
                                 dim3(flash::ForwardTile<32>::kThreads), args, shape.smem, stream),
                "cudaLaunchKernel (FLASH flex unit)");
  FlexStatus status{};
  detail::check(
      cudaMemcpyAsync(&status, a.flex_status, sizeof(status), cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync (FLASH flex status)");
  detail::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (FLASH flex status)");
  SDPA_CHECK(status.code == 0, failure_message(status, captured));
}

}  // namespace sdpa::cuda
