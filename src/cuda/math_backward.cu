// MATH backward on CUDA, deterministic (no atomics): P is recomputed from lse.
//   D_i = dO_i . O_i;  dS_ij = P_ij (Z_ij dO_i . v_j - D_i)  (Z: the dropout factor)
//   (with a flex score_mod, dS_ij times d(score_mod)/d(score) at the score it saw)
//   dQ_i = scale sum_j dS_ij k_j     one block per query row
//   dK_j = scale sum_i dS_ij q_i,  dV_j = sum_i Z_ij P_ij dO_i
//                                    one block per key row, over the query heads of its group

#include "cuda/math.h"
#include "cuda/math_device.cuh"
#include "cuda/math_flex.cuh"
#include "cuda/math_flex_launch.h"
#include "cuda/math_launch.h"
#include "cuda/status.h"

namespace sdpa::cuda {
namespace math {
namespace {

// The pieces of one (query row, key) pair the gradients need.
template <typename Acc>
struct Pair {
  Acc p;   // softmax probability (before dropout)
  Acc z;   // dropout factor (1 without dropout)
  Acc ds;  // gradient of the scaled, masked score
};

// P, Z and dS of scaled score `s` (q_i . k_j * scale) for query (b, h, i) and key j:
// masked (and with flex programs when kFlex), dS taken back through the score_mod;
// dp_of() gives dO_i . v_j, asked for only for kept keys. `values`: the interpreter's
// registers (kFlex).
template <typename T, typename Acc, bool kFlex, typename DpOf>
__device__ Pair<Acc> pair_of(Acc s, DpOf dp_of, Acc d_i, float lse_i, const DenseMask& mask,
                             const FlexMask& flex, const Geometry& g, int64_t b, int64_t h,
                             int64_t i, int64_t j, double* values) {
  Acc pre_mod = s;
  if constexpr (kFlex) {
    s = apply_flex_mask<T, Acc>(s, mask, g.bands, flex, b, h, i, j, values, &pre_mod);
  } else {
    s = apply_mask<T, Acc>(s, mask, g.bands, b, h, i, j);
  }
  Pair<Acc> r{0, 1, 0};
  // A masked key, or a fully masked row (lse = -inf), has no gradient.
  if (s == Acc(-INFINITY) || lse_i == -INFINITY) return r;
  r.p = exp(s - Acc(lse_i));
  if (g.dropout_p > 0) {
    r.z = dropout_factor<Acc>(
        g, static_cast<uint64_t>(((b * g.heads_q + h) * g.q_len + i) * g.kv_len + j));
  }
  r.ds = r.p * (r.z * dp_of() - d_i);
  if constexpr (kFlex) r.ds *= score_mod_slope(flex, pre_mod, b, h, i, j, values);
  return r;
}

// D_i = dO_i . O_i, one warp per row.
template <typename T>
__global__ void row_dots(View<T> grad_out, View<T> out, Geometry g,
                         typename Accumulator<T>::type* d) {
  using Acc = typename Accumulator<T>::type;
  const int64_t rows = g.batch * g.heads_q * g.q_len;
  const int lane = threadIdx.x % 32;
  for (int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; row < rows;
       row += int64_t{gridDim.x} * blockDim.x / 32) {
    const int64_t i = row % g.q_len, h = row / g.q_len % g.heads_q, b = row / g.q_len / g.heads_q;
    const T* go = grad_out.row(b, h, i);
    const T* o = out.row(b, h, i);
    Acc s = 0;
    for (int64_t e = lane; e < g.head_dim_v; e += 32) {
      s += to_acc(go[e * grad_out.s3]) * to_acc(o[e * out.s3]);
    }
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) d[row] = s;
  }
}

template <typename T, bool kFlex>
__global__ void __launch_bounds__(kThreads)
    grad_query(View<T> q, View<T> k, View<T> v, View<T> grad_out, const float* lse,
               const typename Accumulator<T>::type* d, DenseMask mask, FlexMask flex, Geometry g,
               T* grad_q, T* grad_mask) {
  using Acc = typename Accumulator<T>::type;
  double values[kFlex ? flex_interp::kMaxInstructions : 1];
  extern __shared__ unsigned char smem[];
  Acc* q_row = reinterpret_cast<Acc*>(smem);
  Acc* do_row = q_row + g.head_dim;
  Acc* ds = do_row + g.head_dim_v;
  const int t = threadIdx.x;
  const int64_t rows = g.batch * g.heads_q * g.q_len;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t i = row % g.q_len, h = row / g.q_len % g.heads_q, b = row / g.q_len / g.heads_q;
    const int64_t hk = h / g.group();
    for (int64_t e = t; e < g.head_dim; e += kThreads) q_row[e] = to_acc(q.row(b, h, i)[e * q.s3]);
    for (int64_t e = t; e < g.head_dim_v; e += kThreads) {
      do_row[e] = to_acc(grad_out.row(b, h, i)[e * grad_out.s3]);
    }
    __syncthreads();
    Acc acc[kMaxPerThread];
#pragma unroll
    for (int c = 0; c < kMaxPerThread; ++c) acc[c] = 0;
    for (int64_t j0 = 0; j0 < g.kv_len; j0 += kThreads) {
      const int64_t j = j0 + t;
      Acc dsj = 0;
      if (j < g.kv_len) {
        const Acc s = dot(q_row, k.row(b, hk, j), k.s3, g.head_dim) * Acc(g.scale);
        const auto dp_of = [&] { return dot(do_row, v.row(b, hk, j), v.s3, g.head_dim_v); };
        dsj = pair_of<T, Acc, kFlex>(s, dp_of, d[row], lse[row], mask, flex, g, b, h, i, j, values)
                  .ds;
        if (grad_mask != nullptr) grad_mask[row * g.kv_len + j] = from_acc<T>(dsj);
      }
      ds[t] = dsj;
      __syncthreads();
      const int n = chunk_size(j0, g.kv_len);
#pragma unroll
      for (int c = 0; c < kMaxPerThread; ++c) {
        const int64_t e = t + c * kThreads;
        if (e >= g.head_dim) break;
        for (int jj = 0; jj < n; ++jj) acc[c] += ds[jj] * to_acc(k.row(b, hk, j0 + jj)[e * k.s3]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int c = 0; c < kMaxPerThread; ++c) {
      const int64_t e = t + c * kThreads;
      if (e >= g.head_dim) break;
      grad_q[row * g.head_dim + e] = from_acc<T>(acc[c] * Acc(g.scale));
    }
    __syncthreads();
  }
}

template <typename T, bool kFlex>
__global__ void __launch_bounds__(kThreads)
    grad_key_value(View<T> q, View<T> k, View<T> v, View<T> grad_out, const float* lse,
                   const typename Accumulator<T>::type* d, DenseMask mask, FlexMask flex,
                   Geometry g, T* grad_k, T* grad_v) {
  using Acc = typename Accumulator<T>::type;
  double values[kFlex ? flex_interp::kMaxInstructions : 1];
  extern __shared__ unsigned char smem[];
  Acc* pz = reinterpret_cast<Acc*>(smem);  // Z * P per query row of the chunk
  Acc* ds = pz + kThreads;
  const int t = threadIdx.x;
  const int64_t keys = g.batch * g.heads_kv * g.kv_len;
  for (int64_t key = blockIdx.x; key < keys; key += gridDim.x) {
    const int64_t j = key % g.kv_len, hk = key / g.kv_len % g.heads_kv,
                  b = key / g.kv_len / g.heads_kv;
    Acc dk[kMaxPerThread], dv[kMaxPerThread];
#pragma unroll
    for (int c = 0; c < kMaxPerThread; ++c) dk[c] = dv[c] = 0;
    for (int64_t h = hk * g.group(); h < (hk + 1) * g.group(); ++h) {
      for (int64_t i0 = 0; i0 < g.q_len; i0 += kThreads) {
        const int64_t i = i0 + t;
        Pair<Acc> r{0, 1, 0};
        if (i < g.q_len) {
          // Each thread has its own query row: read through its strides, not cached.
          const int64_t row = (b * g.heads_q + h) * g.q_len + i;
          const T* qi = q.row(b, h, i);
          const T* goi = grad_out.row(b, h, i);
          const T* kj = k.row(b, hk, j);
          const T* vj = v.row(b, hk, j);
          Acc s = 0, dp = 0;
          for (int64_t e = 0; e < g.head_dim; ++e) s += to_acc(qi[e * q.s3]) * to_acc(kj[e * k.s3]);
          for (int64_t e = 0; e < g.head_dim_v; ++e) {
            dp += to_acc(goi[e * grad_out.s3]) * to_acc(vj[e * v.s3]);
          }
          r = pair_of<T, Acc, kFlex>(
              s * Acc(g.scale), [dp] { return dp; }, d[row], lse[row], mask, flex, g, b, h, i, j,
              values);
        }
        pz[t] = r.z * r.p;
        ds[t] = r.ds;
        __syncthreads();
        const int n = chunk_size(i0, g.q_len);
#pragma unroll
        for (int c = 0; c < kMaxPerThread; ++c) {
          const int64_t e = t + c * kThreads;
          if (e < g.head_dim_v) {
            for (int ii = 0; ii < n; ++ii) {
              dv[c] += pz[ii] * to_acc(grad_out.row(b, h, i0 + ii)[e * grad_out.s3]);
            }
          }
          if (e < g.head_dim) {
            for (int ii = 0; ii < n; ++ii) dk[c] += ds[ii] * to_acc(q.row(b, h, i0 + ii)[e * q.s3]);
          }
        }
        __syncthreads();
      }
    }
#pragma unroll
    for (int c = 0; c < kMaxPerThread; ++c) {
      const int64_t e = t + c * kThreads;
      if (e < g.head_dim) grad_k[key * g.head_dim + e] = from_acc<T>(dk[c] * Acc(g.scale));
      if (e < g.head_dim_v) grad_v[key * g.head_dim_v + e] = from_acc<T>(dv[c]);
    }
  }
}

template <typename T, bool kFlex>
void launch_backward(const AttentionParams& p, const Launch& launch, const FlexMask& flex,
                     sdpa::detail::BackwardOutputs& o) {
  using Acc = typename Accumulator<T>::type;
  const int64_t rows = p.batch * p.num_heads_q * p.q_len;
  const Tensor d = empty({rows}, p.dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32,
                         p.device.index, p.stream);
  const Geometry& g = launch.geometry;
  const int warps_per_block = 8;
  row_dots<T><<<static_cast<int>(
                    std::min<int64_t>((rows + warps_per_block - 1) / warps_per_block, 1 << 20)),
                32 * warps_per_block, 0, launch.stream>>>(view<T>(p.grad_out), view<T>(p.out), g,
                                                          d.data<Acc>());
  detail::check_launch("MATH backward row_dots kernel (cuda)");
  const size_t smem_q = (p.head_dim_qk + p.head_dim_vo + kThreads) * sizeof(Acc);
  grad_query<T, kFlex><<<launch.grid(rows), kThreads, smem_q, launch.stream>>>(
      view<T>(p.q), view<T>(p.k), view<T>(p.v), view<T>(p.grad_out), p.lse.data<float>(),
      d.data<Acc>(), launch.mask, flex, g, o.grad_q.data<T>(),
      o.grad_mask.defined() ? o.grad_mask.data<T>() : nullptr);
  detail::check_launch("MATH backward grad_query kernel (cuda)");
  const int64_t keys = p.batch * p.num_heads_kv * p.kv_len;
  if (keys == 0) return;  // no key: grad_k and grad_v are empty
  const size_t smem_kv = 2 * kThreads * sizeof(Acc);
  grad_key_value<T, kFlex><<<launch.grid(keys), kThreads, smem_kv, launch.stream>>>(
      view<T>(p.q), view<T>(p.k), view<T>(p.v), view<T>(p.grad_out), p.lse.data<float>(),
      d.data<Acc>(), launch.mask, flex, g, o.grad_k.data<T>(), o.grad_v.data<T>());
  detail::check_launch("MATH backward grad_key_value kernel (cuda)");
}

template <typename T>
void launch_backward(const AttentionParams& p, const Launch& launch,
                     sdpa::detail::BackwardOutputs& o) {
  if (!p.mask.score_mod && !p.mask.block_mask) return launch_backward<T, false>(p, launch, {}, o);
  const FlexParts flex(p, /*backward=*/true);
  launch_backward<T, true>(p, launch, flex.mask, o);
  flex.check(p);
}

}  // namespace
}  // namespace math

void math_backward(const AttentionParams& params, sdpa::detail::BackwardOutputs& outputs) {
  detail::DeviceGuard guard(params.device.index);
  const math::Launch launch(params);
  switch (params.dtype) {
    case DType::kFloat16:
      math::launch_backward<__half>(params, launch, outputs);
      break;
    case DType::kBFloat16:
      math::launch_backward<__nv_bfloat16>(params, launch, outputs);
      break;
    case DType::kFloat32:
      math::launch_backward<float>(params, launch, outputs);
      break;
    default:
      math::launch_backward<double>(params, launch, outputs);
      break;
  }
}

}  // namespace sdpa::cuda
