// What the forward kernels may use on the SIMD target being compiled, as one traits type,
// TargetKernels, so that kernel bodies branch with `if constexpr` instead of
// `#if HWY_TARGET`: bodies are templates on it, and a branch a target lacks is discarded
// there without being compiled. Include after foreach_target.h.

#if defined(SDPA_CPU_TARGET_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_TARGET_KERNELS_INL_H_
#undef SDPA_CPU_TARGET_KERNELS_INL_H_
#else
#define SDPA_CPU_TARGET_KERNELS_INL_H_
#endif

#include "cpu/avx512_kernels-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {

/// Target traits of AVX2 and the portable baseline: float32 products by Gemm and the
/// unfused softmax (SoftmaxTile) only. kBf16Dot: vdpbf16ps kernels may run (then only
/// where uses_bf16_dot() holds); kFusedTiles: tiles without masks or biases may fuse q.k^T
/// and the softmax (Avx512Kernels lists the kernels these name).
struct PortableKernels {
  static constexpr bool kBf16Dot = false;
  static constexpr bool kFusedTiles = false;
};

#if HWY_TARGET == HWY_AVX3
using TargetKernels = Avx512Kernels;
#else
using TargetKernels = PortableKernels;
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_TARGET_KERNELS_INL_H_
