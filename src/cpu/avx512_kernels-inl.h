// Per-ISA: the AVX-512 level's forward kernels that no other target has, gathered in
// Avx512Kernels for target_kernels-inl.h: vdpbf16ps products (bf16_dot.h, bf16_decode.h;
// uses_bf16_dot() holds only at this level), the softmax that writes bf16 P
// (softmax_bf16-inl.h), and key tiles whose q.k^T and softmax are fused in registers
// (qk_softmax_bf16-inl.h, qk_softmax_f32-inl.h: a 6-row tile's 64 scores need AVX-512's
// 32 registers; float32 tiles computed in memory take the same register softmax), whose
// row sums wait in lanes until FoldLaneSums (lazy_softmax-inl.h).
// Include after foreach_target.h; other targets see nothing here.

#if defined(SDPA_CPU_AVX512_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_CPU_AVX512_KERNELS_INL_H_
#undef SDPA_CPU_AVX512_KERNELS_INL_H_
#else
#define SDPA_CPU_AVX512_KERNELS_INL_H_
#endif

#include "core/kernel_inline.h"
#include "cpu/lazy_softmax-inl.h"
#include "cpu/qk_softmax_bf16-inl.h"
#include "cpu/qk_softmax_f32-inl.h"
#include "cpu/softmax_bf16-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::cpu {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX3
/// Target traits of the AVX-512 level (the members PortableKernels lacks are named only
/// in `if constexpr` branches that other targets discard).
struct Avx512Kernels {
  static constexpr bool kBf16Dot = true;
  static constexpr bool kFusedTiles = true;
  static constexpr auto& SoftmaxToBf16 = SoftmaxTileToBf16;
  static constexpr auto& QkSoftmaxBf16 = QkSoftmaxTileBf16;
  static SDPA_INLINE void QkSoftmaxF32(const QueryRows<float>& q, const KeyTile<float>& k,
                                       const SoftmaxRows& state, float* HWY_RESTRICT p) {
    QkSoftmaxTileF32(q, k, state, p);
  }
  /// QkSoftmaxF32 with a flex score_mod that runs on registers applied to the scores.
  static SDPA_INLINE void QkScoreModSoftmaxF32(const QueryRows<float>& q, const KeyTile<float>& k,
                                               const FlexScoreModRows& mod,
                                               const SoftmaxRows& state, float* HWY_RESTRICT p) {
    QkSoftmaxTileF32(q, k, state, p, mod);
  }
  /// QkSoftmaxF32 with the ALiBi bias added to the scores in registers.
  static SDPA_INLINE void QkAlibiSoftmaxF32(const QueryRows<float>& q, const KeyTile<float>& k,
                                            const AlibiRows& alibi, const SoftmaxRows& state,
                                            float* HWY_RESTRICT p) {
    QkSoftmaxTileF32(q, k, state, p, alibi);
  }
  /// QkSoftmaxF32 of a tile whose rows keep intervals of its keys (QkBandSoftmaxTileF32).
  static constexpr auto& QkBandSoftmaxF32 = QkBandSoftmaxTileF32;
  static constexpr auto& SoftmaxLazyF32 = SoftmaxTileLazyF32;
  static constexpr auto& FoldLaneSums = FoldSumLanes;
};
#endif

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::cpu
HWY_AFTER_NAMESPACE();

#endif  // SDPA_CPU_AVX512_KERNELS_INL_H_
