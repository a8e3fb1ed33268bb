// Host side of the CUDA FLASH forward with a flex score_mod and / or BlockMask (flash.h):
// the programs' unit compiled by NVRTC, loaded with the runtime's library API, launched
// with the programs' captured tensors, the BlockMask's lists and failure records the host
// reads back.

#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/flash/flash.h"
#include "cuda/flash/flex_unit.h"
#include "cuda/flash/forward_kernel.cuh"
#include "cuda/flex_device_program.h"
#include "cuda/nvrtc.h"
#include "cuda/status.h"
#include "sdpa/cuda.h"
#include "sdpa/error.h"

namespace sdpa::cuda {
namespace {

// Host image of the prelude's SdpaCapturedTensor (cuda/flex_prelude.cpp): the same members
// in the same order, so the same layout on the device. Its SdpaFlexStatus has
// flex_interp::Status's layout.
using FlexStatus = flex_interp::Status;
struct CapturedTensor {
  const void* data;
  long long sizes[8];
  long long strides[8];
  int dim;
};

// `t` on the call's device: in place when it is there (and contiguous unless `any_strides`),
// else a contiguous copy ordered on the call's stream.
Tensor on_device(const Tensor& t, const AttentionParams& p, bool any_strides) {
  const bool here = t.device().type == DeviceType::kCUDA && t.device().index == p.device.index;
  return here && (any_strides || t.is_contiguous()) ? t : to_device(t, p.device, p.stream);
}

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

// A program's captured tensors on the call's device (host ones copied for this call; kept
// alive in `keep`), described as the generated code reads them.
std::vector<CapturedTensor> describe(const char* program,
                                     const std::vector<flex::Captured>& captured,
                                     const AttentionParams& p, std::vector<Tensor>& keep) {
  std::vector<CapturedTensor> described(captured.size());
  for (size_t i = 0; i < captured.size(); ++i) {
    const Tensor& t = captured[i].tensor();
    SDPA_CHECK(t.dim() <= 8, "flex ", program, ": captured tensor '", captured[i].name(), "' has ",
               t.dim(), " dimensions; at most 8 on CUDA");
    keep.push_back(on_device(t, p, /*any_strides=*/true));
    CapturedTensor& d = described[i];
    d = {};
    d.data = keep.back().data_ptr();
    d.dim = static_cast<int>(t.dim());
    for (int64_t k = 0; k < t.dim(); ++k) {
      d.sizes[k] = keep.back().size(k);
      d.strides[k] = keep.back().stride(k);
    }
  }
  return described;
}

// The BlockMask's lists on the call's device, into `a` (kept alive in `keep`).
void add_block_lists(const flex::BlockMask& m, flash::ForwardArgs& a, const AttentionParams& p,
                     std::vector<Tensor>& keep) {
  const int64_t nq = m.num_q_blocks(), nkv = m.num_kv_blocks();
  const auto list = [&](const Tensor& t, const char* name, bool indices) {
    const Shape expected =
        indices ? Shape{m.batch, m.num_heads, nq, nkv} : Shape{m.batch, m.num_heads, nq};
    SDPA_CHECK(t.defined() && t.dtype() == DType::kInt32 && t.sizes() == expected,
               "block_mask: ", name, " must be int32 of shape ", shape_str(expected), ", got ",
               t.defined() ? std::string(dtype_name(t.dtype())) + " " + shape_str(t.sizes())
                           : std::string("none"));
    keep.push_back(on_device(t, p, /*any_strides=*/false));
    return keep.back().data<int32_t>();
  };
  a.kv_num_blocks = list(m.kv_num_blocks, "kv_num_blocks", false);
  a.kv_indices = list(m.kv_indices, "kv_indices", true);
  a.full_kv_num_blocks = list(m.full_kv_num_blocks, "full_kv_num_blocks", false);
  a.full_kv_indices = list(m.full_kv_indices, "full_kv_indices", true);
  a.block_batches = static_cast<int>(m.batch);
  a.block_heads = static_cast<int>(m.num_heads);
  a.num_q_blocks = static_cast<int>(nq);
  a.num_kv_blocks = static_cast<int>(nkv);
  a.q_block_size = static_cast<int>(m.q_block_size);
  a.kv_block_size = static_cast<int>(m.kv_block_size);
}

}  // namespace

std::string flex_flash_unavailable() {
  if (!nvrtc_load_error().empty()) return nvrtc_load_error();
  if (cuda_include_dir().empty()) {
    return "the CUDA headers (cuda_bf16.h) NVRTC needs are not found (set SDPA_CUDA_INCLUDE_DIR)";
  }
  return "";
}

void flex_flash_forward(const AttentionParams& p, flash::ForwardArgs a, int tile) {
  const flex::Program* score_mod = p.mask.score_mod.get();
  const flex::BlockMask* block_mask = p.mask.block_mask.get();
  const flex::Program* mask_mod =
      block_mask != nullptr && block_mask->mask_mod ? &*block_mask->mask_mod : nullptr;
  static const std::vector<flex::Captured> kNone;
  const std::vector<flex::Captured>& score_captured = score_mod ? score_mod->captured() : kNone;
  const std::vector<flex::Captured>& mask_captured = mask_mod ? mask_mod->captured() : kNone;
  const CompiledModule& module = flash::flex_forward_module(score_mod, mask_mod, p.dtype, tile,
                                                            compute_capability(p.device.index));
  const LaunchShape shape = launch_shape(p.dtype, tile);
  // The runtime launches a library's kernel handle passed as the function.
  const auto kernel = reinterpret_cast<const void*>(kernel_for(module, p.device.index, shape.smem));

  // The programs' tensor descriptors and their two failure records in one device buffer.
  std::vector<Tensor> keep;
  const std::vector<CapturedTensor> score_described =
      describe("score_mod", score_captured, p, keep);
  const std::vector<CapturedTensor> mask_described = describe("mask_mod", mask_captured, p, keep);
  const size_t score_bytes = score_described.size() * sizeof(CapturedTensor);
  const size_t mask_bytes = mask_described.size() * sizeof(CapturedTensor);
  const size_t status_at = score_bytes + mask_bytes;
  const auto buffer_bytes = static_cast<int64_t>(status_at + 2 * sizeof(FlexStatus));
  Tensor device;
  if (status_at == 0) {
    // Records only: cleared on the stream, with no copy from the host (which would wait
    // for the work queued before the call).
    device = empty({buffer_bytes}, DType::kBool, p.device.index, p.stream);
    detail::check(cudaMemsetAsync(device.data_ptr(), 0, static_cast<size_t>(buffer_bytes),
                                  static_cast<cudaStream_t>(p.stream)),
                  "cudaMemsetAsync (FLASH flex status)");
  } else {
    Tensor host = Tensor::zeros({buffer_bytes}, DType::kBool);
    auto* bytes = static_cast<unsigned char*>(host.data_ptr());
    if (score_bytes > 0) std::memcpy(bytes, score_described.data(), score_bytes);
    if (mask_bytes > 0) std::memcpy(bytes + score_bytes, mask_described.data(), mask_bytes);
    device = to_device(host, p.device, p.stream);
  }
  auto* base = static_cast<unsigned char*>(device.data_ptr());
  a.score_mod_captured = score_bytes > 0 ? base : nullptr;
  a.mask_mod_captured = mask_bytes > 0 ? base + score_bytes : nullptr;
  a.score_mod_status = base + status_at;
  a.mask_mod_status = base + status_at + sizeof(FlexStatus);
  if (block_mask != nullptr) add_block_lists(*block_mask, a, p, keep);

  const auto stream = static_cast<cudaStream_t>(p.stream);
  const int64_t blocks = (a.q_len + shape.rows - 1) / shape.rows * p.batch * p.num_heads_q;
  void* args[] = {&a};
  detail::check(cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)),
                                 dim3(flash::ForwardTile<32>::kThreads), args, shape.smem, stream),
                "cudaLaunchKernel (FLASH flex unit)");
  // Programs that cannot fail leave the records untouched: the call returns without
  // waiting for its kernel.
  const auto may_fail = [&](const flex::Program* program) {
    return program != nullptr &&
           program_may_fail(*program, p.batch, p.num_heads_q, p.q_len, p.kv_len);
  };
  if (!may_fail(score_mod) && !may_fail(mask_mod)) return;
  FlexStatus status[2]{};
  detail::check(
      cudaMemcpyAsync(status, a.score_mod_status, sizeof(status), cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync (FLASH flex status)");
  detail::check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (FLASH flex status)");
  SDPA_CHECK(status[1].code == 0, flex_failure_message("mask_mod", status[1], mask_captured));
  SDPA_CHECK(status[0].code == 0, flex_failure_message("score_mod", status[0], score_captured));
}

}  // namespace sdpa::cuda
