#pragma once
// The operands of the CPU GEMM and packing primitives (gemm-inl.h, bf16_dot.h, pack.h,
// pack_bf16.h) as small aggregates: a pointer travels with its leading dimension, so a
// primitive takes its shape, its matrices and its mode (five parameters at most) instead
// of BLAS's (m, n, k, A, lda, B, ldb, C, ldc, ...), where a swapped stride compiles
// silently. The inlined float32 GEMM takes them by value and its micro-tile copies the
// fields to locals, so its loops keep them in registers as they did the separate
// arguments; bf16_dot.h says why its called kernels take them by reference.

#include <cstdint>

namespace sdpa::cpu {

/// The shape of C[m, n] (+)= A[m, depth] . B[depth, n].
struct GemmDims {
  int64_t m;
  int64_t n;
  int64_t depth;
};

/// What a GEMM does with C: overwrite it with A . B, or add A . B to it.
enum class GemmOutput : bool { kOverwrite, kAccumulate };

/// A row-major matrix: element (r, c) at data[r * ld + c] (T const for one only read).
template <class T>
struct Matrix {
  T* data;
  int64_t ld;

  /// The matrix whose element (0, 0) is this one's (r, c).
  Matrix from(int64_t r, int64_t c) const { return {data + r * ld + c, ld}; }
};

/// A matrix read through two strides: element (r, c) at data[r * ld + c * step]. step = 1
/// is row-major; ld = 1 with step = the stored rows' ld reads the transpose of a row-major
/// matrix in place (P^T and dS^T in the backward).
template <class T>
struct StridedMatrix {
  T* data;
  int64_t ld;
  int64_t step = 1;

  /// The matrix whose element (0, 0) is this one's (r, c).
  StridedMatrix from(int64_t r, int64_t c) const { return {data + r * ld + c * step, ld, step}; }
};

}  // namespace sdpa::cpu
