#pragma once
// Tensor-core building blocks of the CUDA FLASH kernels (sm_80+): asynchronous global ->
// shared copies, ldmatrix fragment loads and the m16n8k16 mma with float32 accumulation.
// Fragment layouts follow the PTX ISA ("Matrix fragments for mma.m16n8k16"): with
// g = lane / 4 and t = lane % 4,
//   A (16 x 16, row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16 x 8, k x n):      b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g)
//   C (16 x 8, float32):    c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)

#include "cuda/device_types.cuh"

namespace sdpa::cuda::flash {

/// The shared-memory address of `p` as the 32-bit operand PTX wants.
__device__ inline uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Copies 16 bytes from global `src` to shared `dst` asynchronously; with `valid` false it
/// writes 16 zero bytes instead and reads nothing.
__device__ inline void copy_16_async(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ inline void commit_async_copies() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most `N` committed groups of async copies are still in flight.
template <int N>
__device__ inline void wait_async_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Four 8 x 8 matrices of 16-bit elements; lanes 8m..8m+7 give the row addresses of
/// matrix m, and register m of lane l holds row l / 4, columns 2(l % 4) and 2(l % 4) + 1.
__device__ inline void load_matrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

/// As load_matrix_x4, transposed: register m of lane l holds rows 2(l % 4) and
/// 2(l % 4) + 1 of column l / 4.
__device__ inline void load_matrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

/// c += a * b for one m16n8k16 tile in element type T (__half or __nv_bfloat16). Not
/// volatile: a pure register operation the compiler may schedule around the (volatile,
/// ordered) shared-memory loads.
template <typename T>
__device__ inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ inline void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ inline void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats rounded to T and packed as one 32-bit register (x in the low half).
template <typename T>
__device__ inline uint32_t pack2(float x, float y);

template <>
__device__ inline uint32_t pack2<__half>(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <>
__device__ inline uint32_t pack2<__nv_bfloat16>(float x, float y) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

/// Element offset of 8-element chunk `chunk` of row `row` in a shared tile of rows of
/// `kHeadDim` elements, XOR-swizzled so that the 8 rows one ldmatrix reads at the same
/// logical column fall in distinct banks (rows of 128 bytes or more: chunk ^ row % 8;
/// rows of 64 bytes: two rows share a 128-byte line, so chunk ^ (row / 2) % 4).
template <int kHeadDim>
__device__ inline int swizzled(int row, int chunk) {
  static_assert(kHeadDim == 32 || kHeadDim % 64 == 0, "head-dim tiles of 32 or 64k elements");
  const int phys = kHeadDim == 32 ? chunk ^ ((row >> 1) & 3) : chunk ^ (row & 7);
  return row * kHeadDim + phys * 8;
}

}  // namespace sdpa::cuda::flash
