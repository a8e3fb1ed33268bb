#pragma once
// The CUDA FLASH forward kernel: FlashAttention-2 (Dao 2023). A block of 4 warps owns 64
// query rows (16 per warp, kept in shared memory); key/value tiles stream through shared
// memory with cp.async (the next key tile loads while P.V runs), S = Q K^T and O += P V
// run on tensor cores (mma.m16n8k16, float32 accumulation), and the softmax is online, in
// registers, in the log2 domain.
//
// Masks come from the call's native descriptor: each query row keeps one interval of keys
// (bands by index arithmetic, or per-row bounds for documents / padding / other frames);
// tiles outside every row's interval are never loaded and tiles inside all of them skip
// the per-element test. ALiBi and a dense mask (bool or additive) apply per element. In a
// flex unit, a BlockMask's block lists narrow the tiles further (key_tiles.cuh) and the
// mask_mod runs only in its partial blocks.

#include "cuda/device_types.cuh"
#include "cuda/flash/key_tiles.cuh"
#include "cuda/flash/mma.cuh"

namespace sdpa::cuda::flash {

/// Everything one forward launch reads. Strides are in elements; the last dimension of
/// q / k / v is contiguous. out [B, Hq, L, Ev] and lse [B, Hq, L] are contiguous.
struct ForwardArgs {
  const void* q;
  const void* k;
  const void* v;
  int64_t q_stride[3], k_stride[3], v_stride[3];  // batch, head, row
  void* out;
  float* lse;
  int64_t heads_q, heads_kv;
  int q_len, kv_len, head_dim, head_dim_v;
  float scale;       // softmax scale (a flex score_mod sees q.k^T times it)
  float scale_log2;  // softmax scale * log2(e)
  /// Sequence-frame bands (used when row_lo is null).
  math::Bands bands;
  /// Per-row kept keys [interval_batches, L] (null: from `bands`).
  const int32_t* row_lo;
  const int32_t* row_hi;
  int interval_batches;
  /// ALiBi: adds -slopes[h] * |i + alibi_offset - j| (null: none).
  const float* alibi_slopes;
  int64_t alibi_offset;
  math::DenseMask dense;
  /// A flex call's captured tensors of the score_mod and of the mask_mod
  /// (SdpaCapturedTensor[], device memory) and the failure records of each
  /// (SdpaFlexStatus, cuda/flex_codegen.h); null without them.
  const void* score_mod_captured;
  const void* mask_mod_captured;
  void* score_mod_status;
  void* mask_mod_status;
  /// A flex call's BlockMask (flex units only; null kv_num_blocks: none): device copies of
  /// its int32 lists (kv_num_blocks [Bm, Hm, q blocks], kv_indices [Bm, Hm, q blocks, kv
  /// blocks], and the full_ pair), Bm and Hm 1 (broadcast) or B and Hq. q_block_size is a
  /// multiple of ForwardTile::kRows and kv_block_size of ForwardTile::kKeys, so a block's
  /// rows lie in one q block and a key tile in one kv block.
  const int32_t* kv_num_blocks;
  const int32_t* kv_indices;
  const int32_t* full_kv_num_blocks;
  const int32_t* full_kv_indices;
  int block_batches, block_heads, num_q_blocks, num_kv_blocks;
  int q_block_size, kv_block_size;
};

/// The flex hooks of forward_body for calls without a flex program: scores pass unchanged
/// and every key of a row's interval is kept. A flex unit (cuda/flash/flex_unit.h) passes
/// a type with the same members calling the generated score_mod / mask_mod.
struct NoFlex {
  static constexpr bool kActive = false;
  __device__ static float score(const ForwardArgs&, float score, int64_t, int64_t, int, int) {
    return score;
  }
  __device__ static bool keep(const ForwardArgs&, int64_t, int64_t, int, int) { return true; }
};

/// Tile sizes for head-dim tile kHeadDim (E and Ev are padded up to it with zeros). Each
/// warp owns kRowTiles 16-row mma tiles, so every key / value fragment it reads from
/// shared memory feeds kRowTiles mma. One tile per warp: FlashAttention-2's two (32 rows)
/// measured slower on an H200 (E = 64: 75 against 118 TFLOP/s; E = 128 about equal, with
/// 32-key tiles to stay in registers), as the extra accumulators cut the warps per SM.
template <int kHeadDim>
struct ForwardTile {
  static constexpr int kThreads = 128;
  static constexpr int kRowTiles = 1;
  static constexpr int kRows = 4 * 16 * kRowTiles;         // query rows per block
  static constexpr int kKeys = kHeadDim <= 128 ? 64 : 32;  // keys per tile
  /// Blocks per SM the registers of forward_kernel must allow (__launch_bounds__): at
  /// E = 128 the compiler would otherwise take 226 registers, two blocks, where 168 keep
  /// three. Flex units are not capped: captured reads spill under these caps.
  static constexpr int kMinBlocks = kHeadDim <= 64 ? 4 : kHeadDim == 128 ? 3 : 1;
};

template <typename T, int kHeadDim>
__host__ __device__ constexpr size_t forward_smem_bytes() {
  using Tile = ForwardTile<kHeadDim>;
  return static_cast<size_t>(Tile::kRows + 2 * Tile::kKeys) * kHeadDim * sizeof(T);
}

/// Queues the async load of rows [0, valid_rows) x columns [0, cols) of a tile of
/// kTileRows rows starting at `base`; everything else in the tile becomes zero. A thread
/// copies the same 16-byte column chunk of every kStep-th row, so the loop unrolls into
/// copies whose addresses differ by constants (the index arithmetic of a copy per thread
/// and row was a third of the kernel's instructions at E = 128).
template <typename T, int kHeadDim, int kTileRows>
__device__ inline void load_tile(T* tile, const T* base, int64_t row_stride, int valid_rows,
                                 int cols) {
  constexpr int kChunks = kHeadDim / 8, kThreads = ForwardTile<kHeadDim>::kThreads;
  static_assert(kThreads % kChunks == 0, "whole rows per pass of the block's threads");
  constexpr int kStep = kThreads / kChunks;  // rows one pass copies
  static_assert(kTileRows % kStep == 0, "whole passes per tile");
  const int r0 = static_cast<int>(threadIdx.x) / kChunks,
            c = static_cast<int>(threadIdx.x) % kChunks;
  const bool in_cols = c * 8 < cols;
  const T* const src = base + r0 * row_stride + c * 8;
  const int64_t step = kStep * row_stride;
  // Unrolled but at E = 256, whose accumulators leave no registers for the copies'
  // addresses (unrolled, it spills).
  constexpr int kUnroll = kHeadDim == 256 ? 1 : kTileRows / kStep;
#pragma unroll kUnroll
  for (int n = 0; n < kTileRows / kStep; ++n) {
    // An invalid copy reads 0 bytes (and zero-fills): its address is never dereferenced.
    copy_16_async(tile + swizzled<kHeadDim>(r0 + n * kStep, c), src + n * step,
                  in_cols && r0 + n * kStep < valid_rows);
  }
}

/// The keys [lo, hi) row `i` of batch `b` keeps (lo >= hi: none).
__device__ inline void row_keys(const ForwardArgs& a, int64_t b, int i, int& lo, int& hi) {
  if (a.row_lo != nullptr) {
    const int64_t at = (a.interval_batches > 1 ? b : 0) * a.q_len + i;
    lo = a.row_lo[at];
    hi = a.row_hi[at];
    return;
  }
  // Bounds beyond +-2^40 are unbounded for any size that fits int32.
  constexpr int64_t kFar = int64_t{1} << 40;
  int64_t l = 0, h = a.kv_len;
  for (int n = 0; n < a.bands.count; ++n) {
    const int64_t diag = i + a.bands.offset[n];
    if (a.bands.left[n] < kFar) l = max(l, diag - a.bands.left[n]);
    if (a.bands.right[n] < kFar) h = min(h, diag + a.bands.right[n] + 1);
  }
  l = min(max(l, int64_t{0}), int64_t{a.kv_len});
  lo = static_cast<int>(l);
  hi = static_cast<int>(max(min(h, int64_t{a.kv_len}), l));
}

/// The key tiles [first, end) (first a multiple of kKeys) of the block of rows from i0 of
/// (b, h), narrowed to the call's BlockMask where it has one.
template <int kKeys, bool kLists>
__device__ inline KeyTiles<kKeys, kLists> key_tiles(const ForwardArgs& a, int64_t b, int64_t h,
                                                    int i0, int first, int end) {
  if (!kLists || a.kv_num_blocks == nullptr || first >= end) {
    return KeyTiles<kKeys, kLists>::range(first, end);
  }
  const int64_t row =
      ((a.block_batches > 1 ? b : 0) * a.block_heads + (a.block_heads > 1 ? h : 0)) *
          a.num_q_blocks +
      i0 / a.q_block_size;
  const int64_t n = a.num_kv_blocks;
  return KeyTiles<kKeys, kLists>::listed_blocks(
      first, end, a.kv_indices + row * n, a.kv_num_blocks[row], a.full_kv_indices + row * n,
      a.full_kv_num_blocks[row], a.num_kv_blocks, a.kv_block_size);
}

/// The additive terms (ALiBi, dense) of score (b, h, i, j), in natural-log units; -inf
/// for a key a bool mask drops.
template <typename T>
__device__ inline float additive_terms(const ForwardArgs& a, int64_t b, int64_t h, int i, int j) {
  float add = 0.f;
  if (a.alibi_slopes != nullptr) {
    add -= a.alibi_slopes[h] * fabsf(static_cast<float>(i + a.alibi_offset - j));
  }
  const math::DenseMask& m = a.dense;
  if (m.kind != 0) {
    const int64_t at = b * m.s0 + h * m.s1 + i * m.s2 + j * m.s3;
    if (m.kind == 1) {
      if (!static_cast<const bool*>(m.data)[at]) return -INFINITY;
    } else if (m.kind == 3) {
      add += static_cast<const float*>(m.data)[at];
    } else {
      add += math::to_acc(static_cast<const T*>(m.data)[at]);
    }
  }
  return add;
}

/// The kernel's body for one block of kRows query rows; `Flex` adds a flex program's
/// score_mod and mask_mod per element (NoFlex: none).
template <typename T, int kHeadDim, class Flex>
__device__ __forceinline__ void forward_body(const ForwardArgs& a) {
  using Tile = ForwardTile<kHeadDim>;
  constexpr int kRows = Tile::kRows, kKeys = Tile::kKeys, kM = Tile::kRowTiles;
  constexpr int kKeyTiles = kKeys / 8, kDimTiles = kHeadDim / 8;
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  extern __shared__ __align__(16) unsigned char smem[];
  T* const sq = reinterpret_cast<T*>(smem);
  T* const sk = sq + kRows * kHeadDim;
  T* const sv = sk + kKeys * kHeadDim;
  __shared__ int block_lo, block_hi, block_max_lo, block_min_hi;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  // Consecutive blocks share a head, so the blocks resident at once read the same keys and
  // values from L2; within a head the last query rows come first (under a causal mask
  // they have the most keys).
  const int q_blocks = (a.q_len + kRows - 1) / kRows;
  const int64_t bh = blockIdx.x / q_blocks;
  const int i0 = (q_blocks - 1 - static_cast<int>(blockIdx.x % q_blocks)) * kRows;
  const int64_t b = bh / a.heads_q, h = bh % a.heads_q, hk = h / (a.heads_q / a.heads_kv);
  const T* const q =
      static_cast<const T*>(a.q) + b * a.q_stride[0] + h * a.q_stride[1] + i0 * a.q_stride[2];
  const T* const k = static_cast<const T*>(a.k) + b * a.k_stride[0] + hk * a.k_stride[1];
  const T* const v = static_cast<const T*>(a.v) + b * a.v_stride[0] + hk * a.v_stride[1];

  // This thread's rows: g and g + 8 of each of its warp's 16-row tiles (index 2 mt + r),
  // and the keys each keeps.
  int row[2 * kM], lo[2 * kM], hi[2 * kM];
  if (threadIdx.x == 0) {
    block_lo = INT_MAX;
    block_hi = 0;
    block_max_lo = 0;
    block_min_hi = INT_MAX;
  }
  __syncthreads();
#pragma unroll
  for (int n = 0; n < 2 * kM; ++n) {
    row[n] = i0 + (warp * kM + n / 2) * 16 + g + 8 * (n % 2);
    lo[n] = a.kv_len;
    hi[n] = 0;
    if (row[n] >= a.q_len) continue;
    row_keys(a, b, row[n], lo[n], hi[n]);
    if (t != 0) continue;
    if (lo[n] < hi[n]) {
      atomicMin(&block_lo, lo[n]);
      atomicMax(&block_hi, hi[n]);
    }
    atomicMax(&block_max_lo, lo[n]);
    atomicMin(&block_min_hi, hi[n]);
  }
  __syncthreads();
  KeyTiles<kKeys, Flex::kActive> tiles = key_tiles<kKeys, Flex::kActive>(
      a, b, h, i0, block_lo < block_hi ? block_lo / kKeys * kKeys : 0,
      block_lo < block_hi ? block_hi : 0);

  load_tile<T, kHeadDim, kRows>(sq, q, a.q_stride[2], min(kRows, a.q_len - i0), a.head_dim);
  commit_async_copies();
  if (!tiles.done()) {
    load_tile<T, kHeadDim, kKeys>(sk, k + tiles.j0 * a.k_stride[2], a.k_stride[2],
                                  min(kKeys, a.kv_len - tiles.j0), a.head_dim);
  }
  commit_async_copies();

  float o[kM][kDimTiles][4] = {};
  float m[2 * kM], l[2 * kM];
#pragma unroll
  for (int n = 0; n < 2 * kM; ++n) {
    m[n] = -INFINITY;
    l[n] = 0.f;
  }
  while (!tiles.done()) {
    const int j0 = tiles.j0;
    load_tile<T, kHeadDim, kKeys>(sv, v + j0 * a.v_stride[2], a.v_stride[2],
                                  min(kKeys, a.kv_len - j0), a.head_dim_v);
    commit_async_copies();
    wait_async_copies<1>();  // q and this key tile
    __syncthreads();

    float s[kM][kKeyTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t qa[kM][4];
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        load_matrix_x4(
            qa[mt], sq + swizzled<kHeadDim>((warp * kM + mt) * 16 + lane % 16, kk * 2 + lane / 16));
      }
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t kb[4];
        load_matrix_x4(
            kb, sk + swizzled<kHeadDim>(np * 16 + lane % 8 + lane / 16 * 8, kk * 2 + lane / 8 % 2));
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          mma_16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma_16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this key tile
    KeyTiles<kKeys, Flex::kActive> following = tiles;
    following.next();
    const bool more = !following.done();
    if (more) {
      load_tile<T, kHeadDim, kKeys>(sk, k + following.j0 * a.k_stride[2], a.k_stride[2],
                                    min(kKeys, a.kv_len - following.j0), a.head_dim);
      commit_async_copies();
    }

    // Scores in log2 units, masked; full tiles (inside every row's keys) skip the test,
    // and tiles of a BlockMask's full blocks the mask_mod.
    const bool full = block_max_lo <= j0 && j0 + kKeys <= block_min_hi;
    const bool keep_all = tiles.in_full_block();
    const bool per_element = a.alibi_slopes != nullptr || a.dense.kind != 0;
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int n = 2 * mt + e / 2, j = j0 + nt * 8 + 2 * t + e % 2;
          float x = s[mt][nt][e] * a.scale_log2;
          if (!full && (j < lo[n] || j >= hi[n])) {
            x = -INFINITY;
          } else if (Flex::kActive && row[n] < a.q_len) {
            // As on the CPU: mask_mod first, then score_mod on the scaled score.
            x = keep_all || Flex::keep(a, b, h, row[n], j)
                    ? Flex::score(a, s[mt][nt][e] * a.scale, b, h, row[n], j) * kLog2e
                    : -INFINITY;
          } else if (per_element && row[n] < a.q_len) {
            x += additive_terms<T>(a, b, h, row[n], j) * kLog2e;
          }
          s[mt][nt][e] = x;
        }
      }
    }
    // Online softmax: rescale what came before by exp2(m_old - m_new).
#pragma unroll
    for (int n = 0; n < 2 * kM; ++n) {
      const int mt = n / 2, c = 2 * (n % 2);  // row n's elements: c and c + 1 of each tile
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][c], s[mt][nt][c + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[n], mx);
      // A row with no key yet keeps m = -inf; exponents are then taken against 0.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m[n] - m_use);
      m[n] = m_new;
      l[n] *= alpha;
#pragma unroll
      for (int nd = 0; nd < kDimTiles; ++nd) {
        o[mt][nd][c] *= alpha;
        o[mt][nd][c + 1] *= alpha;
      }
#pragma unroll
      for (int nt = 0; nt < kKeyTiles; ++nt) {
        s[mt][nt][c] = exp2f(s[mt][nt][c] - m_use);
        s[mt][nt][c + 1] = exp2f(s[mt][nt][c + 1] - m_use);
        l[n] += s[mt][nt][c] + s[mt][nt][c + 1];
      }
    }

    if (more) {
      wait_async_copies<1>();  // this value tile (the next key tile may still load)
    } else {
      wait_async_copies<0>();
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pa[kM][4];
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < kHeadDim / 16; ++np) {
        uint32_t vb[4];
        load_matrix_x4_trans(
            vb, sv + swizzled<kHeadDim>(kk * 16 + lane % 8 + lane / 8 % 2 * 8, np * 2 + lane / 16));
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          mma_16816<T>(o[mt][2 * np], pa[mt], vb[0], vb[1]);
          mma_16816<T>(o[mt][2 * np + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this value tile
    tiles = following;
  }
  wait_async_copies<0>();  // a block without keys still queued its query tile

  // out = O / l; rows without any key give out = 0 and lse = -inf (the CPU's rule); a NaN
  // score leaves l NaN and propagates.
#pragma unroll
  for (int n = 0; n < 2 * kM; ++n) {
    const int mt = n / 2, c = 2 * (n % 2);
    l[n] += __shfl_xor_sync(0xffffffffu, l[n], 1);
    l[n] += __shfl_xor_sync(0xffffffffu, l[n], 2);
    if (row[n] >= a.q_len) continue;
    const bool masked = l[n] == 0.f;
    const float inv = masked ? 0.f : 1.f / l[n];
    const int64_t out_row = bh * a.q_len + row[n];
    T* const dst = static_cast<T*>(a.out) + out_row * a.head_dim_v;
#pragma unroll
    for (int nd = 0; nd < kDimTiles; ++nd) {
      const int col = nd * 8 + 2 * t;
      if (col < a.head_dim_v) {
        *reinterpret_cast<uint32_t*>(dst + col) =
            pack2<T>(o[mt][nd][c] * inv, o[mt][nd][c + 1] * inv);
      }
    }
    if (t == 0) a.lse[out_row] = masked ? -INFINITY : m[n] * kLn2 + logf(l[n]);
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(ForwardTile<kHeadDim>::kThreads,
                                  ForwardTile<kHeadDim>::kMinBlocks)
    forward_kernel(const ForwardArgs a) {
  forward_body<T, kHeadDim, NoFlex>(a);
}

}  // namespace sdpa::cuda::flash
