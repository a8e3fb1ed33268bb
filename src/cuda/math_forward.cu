// MATH forward on CUDA: one block per query row; keys in chunks of kThreads with an
// online softmax (Milakov & Gimelshein 2018) so no L x S buffer is needed. Flex calls
// (score_mod, BlockMask) run an instantiation that interprets the programs per element.

#include "cuda/math.h"
#include "cuda/math_device.cuh"
#include "cuda/math_flex.cuh"
#include "cuda/math_flex_launch.h"
#include "cuda/math_launch.h"
#include "cuda/status.h"

namespace sdpa::cuda {
namespace math {
namespace {

template <typename T, bool kFlex>
__global__ void __launch_bounds__(kThreads)
    forward_rows(View<T> q, View<T> k, View<T> v, DenseMask mask, FlexMask flex, Geometry g, T* out,
                 float* lse) {
  using Acc = typename Accumulator<T>::type;
  extern __shared__ unsigned char smem[];
  Acc* q_row = reinterpret_cast<Acc*>(smem);  // head_dim
  Acc* p = q_row + g.head_dim;                // kThreads
  Acc* scratch = p + kThreads;                // kThreads / 32
  const int t = threadIdx.x;
  // The interpreter's registers (flex calls only: a frame this size costs local memory).
  double values[kFlex ? flex_interp::kMaxInstructions : 1];
  const int64_t rows = g.batch * g.heads_q * g.q_len;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % g.q_len, h = row / g.q_len % g.heads_q, b = row / g.q_len / g.heads_q;
    const int64_t hk = h / g.group();
    const T* qi = q.row(b, h, i);
    for (int64_t e = t; e < g.head_dim; e += kThreads) q_row[e] = to_acc(qi[e * q.s3]);
    __syncthreads();
    Acc acc[kMaxPerThread];
#pragma unroll
    for (int c = 0; c < kMaxPerThread; ++c) acc[c] = 0;
    Acc m = -INFINITY, l = 0;
    for (int64_t j0 = 0; j0 < g.kv_len; j0 += kThreads) {
      const int64_t j = j0 + t;
      Acc s = -INFINITY;
      if (j < g.kv_len) {
        s = dot(q_row, k.row(b, hk, j), k.s3, g.head_dim) * Acc(g.scale);
        if constexpr (kFlex) {
          s = apply_flex_mask<T, Acc>(s, mask, g.bands, flex, b, h, i, j, values);
        } else {
          s = apply_mask<T, Acc>(s, mask, g.bands, b, h, i, j);
        }
      }
      const Acc m_new = nan_max(m, block_max(s, scratch));
      if (m_new == Acc(-INFINITY)) continue;  // every key so far is masked out
      const Acc alpha = m == Acc(-INFINITY) ? Acc(0) : exp(m - m_new);
      Acc pj = s == Acc(-INFINITY) ? Acc(0) : exp(s - m_new);
      l = l * alpha + block_sum(pj, scratch);
      if (g.dropout_p > 0 && j < g.kv_len) {
        pj *= dropout_factor<Acc>(g, static_cast<uint64_t>(row * g.kv_len + j));
      }
      p[t] = pj;
      __syncthreads();
      const int n = chunk_size(j0, g.kv_len);
#pragma unroll
      for (int c = 0; c < kMaxPerThread; ++c) {
        const int64_t e = t + c * kThreads;
        if (e >= g.head_dim_v) break;
        Acc sum = 0;
        for (int jj = 0; jj < n; ++jj) sum += p[jj] * to_acc(v.row(b, hk, j0 + jj)[e * v.s3]);
        acc[c] = acc[c] * alpha + sum;
      }
      m = m_new;
      __syncthreads();
    }
    // Fully masked rows (l == 0) give out = 0 and lse = -inf, as on the CPU; NaN scores
    // leave l NaN and propagate.
    const bool masked_row = l == Acc(0);
#pragma unroll
    for (int c = 0; c < kMaxPerThread; ++c) {
      const int64_t e = t + c * kThreads;
      if (e >= g.head_dim_v) break;
      out[row * g.head_dim_v + e] = from_acc<T>(masked_row ? Acc(0) : acc[c] / l);
    }
    if (t == 0) lse[row] = masked_row ? -INFINITY : static_cast<float>(m + log(l));
    __syncthreads();
  }
}

template <typename T>
void launch_forward(const AttentionParams& p, const Launch& launch, const Tensor& out,
                    const Tensor& lse) {
  using Acc = typename Accumulator<T>::type;
  const size_t smem = (p.head_dim_qk + kThreads + kThreads / 32) * sizeof(Acc);
  const int grid = launch.grid(p.batch * p.num_heads_q * p.q_len);
  if (!p.mask.score_mod && !p.mask.block_mask) {
    forward_rows<T, false><<<grid, kThreads, smem, launch.stream>>>(
        view<T>(p.q), view<T>(p.k), view<T>(p.v), launch.mask, FlexMask{}, launch.geometry,
        out.data<T>(), lse.data<float>());
    detail::check_launch("MATH forward kernel (cuda)");
    return;
  }
  const FlexParts flex(p, /*backward=*/false);
  forward_rows<T, true><<<grid, kThreads, smem, launch.stream>>>(
      view<T>(p.q), view<T>(p.k), view<T>(p.v), launch.mask, flex.mask, launch.geometry,
      out.data<T>(), lse.data<float>());
  detail::check_launch("MATH forward kernel with flex programs (cuda)");
  flex.check(p);
}

}  // namespace
}  // namespace math

void math_forward(const AttentionParams& params, const Tensor& out, const Tensor& lse) {
  detail::DeviceGuard guard(params.device.index);
  const math::Launch launch(params);
  switch (params.dtype) {
    case DType::kFloat16:
      math::launch_forward<__half>(params, launch, out, lse);
      break;
    case DType::kBFloat16:
      math::launch_forward<__nv_bfloat16>(params, launch, out, lse);
      break;
    case DType::kFloat32:
      math::launch_forward<float>(params, launch, out, lse);
      break;
    default:
      math::launch_forward<double>(params, launch, out, lse);
      break;
  }
}

}  // namespace sdpa::cuda
