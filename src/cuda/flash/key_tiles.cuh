#pragma once
// The order in which a block of the CUDA FLASH forward visits key tiles, with or without a
// BlockMask's block lists. Plain C++ that also compiles for the host (no device intrinsics,
// no standard headers under NVRTC), so the walk is unit-tested on the CPU
// (tests/cuda/key_tiles_test.cpp).

#ifndef __CUDACC_RTC__
#include <cstdint>
#endif

#ifdef __CUDACC__
#define SDPA_KEY_TILES_FN __host__ __device__ inline
#else
#define SDPA_KEY_TILES_FN inline
#endif

namespace sdpa::cuda::flash {

/// The key tiles one block visits, in order. Without a BlockMask (kLists false, or made by
/// range()) the tiles of [first, end) in steps of kKeys; with one (listed_blocks()) the kv
/// blocks its q block lists, partial blocks then full ones (FlexAttention's order), each
/// clipped to [first, end). first is a multiple of kKeys and kv blocks are multiples of
/// kKeys long, so a tile never straddles two kv blocks. Every thread of a block walks the
/// same tiles.
template <int kKeys, bool kLists>
struct KeyTiles {
  int j0;   // this tile's first key; >= end when the walk is done
  int end;  // the end of [first, end), the keys the block's rows keep
  // With lists: the q block's partial and full kv blocks (null partial: no lists), how
  // many of each are read, this tile's position among them (partial ones first), the
  // first key of [first, end), the kv block length and the end of this tile's clipped
  // kv block.
  const int32_t* partial;
  const int32_t* full;
  int partial_count, listed, position, first, block_size, block_end;

  /// The tiles of [first, end).
  SDPA_KEY_TILES_FN static KeyTiles range(int first, int end) {
    return {first, end, nullptr, nullptr, 0, 0, 0, first, 0, end};
  }

  /// The tiles of the kv blocks `partial[0, partial_count)` then `full[0, full_count)` (of
  /// `block_size` keys each), clipped to [first, end). Counts outside [0, num_kv_blocks]
  /// (not produced by sdpa's BlockMasks) are clamped so that the lists are never read past
  /// their length, and listed blocks without keys in [first, end) are passed over.
  SDPA_KEY_TILES_FN static KeyTiles listed_blocks(int first, int end, const int32_t* partial,
                                                  int partial_count, const int32_t* full,
                                                  int full_count, int num_kv_blocks,
                                                  int block_size) {
    KeyTiles tiles{first, end, partial, full,       clamp(partial_count, num_kv_blocks),
                   0,     0,   first,   block_size, end};
    tiles.listed = tiles.partial_count + clamp(full_count, num_kv_blocks);
    tiles.enter(0);
    return tiles;
  }

  SDPA_KEY_TILES_FN bool done() const { return j0 >= end; }

  /// Whether this tile lies in a BlockMask's full block: every key kept, the mask_mod need
  /// not run.
  SDPA_KEY_TILES_FN bool in_full_block() const {
    return kLists && partial != nullptr && position >= partial_count;
  }

  SDPA_KEY_TILES_FN void next() {
    j0 += kKeys;
    if (kLists && partial != nullptr && j0 >= block_end) enter(position + 1);
  }

 private:
  SDPA_KEY_TILES_FN static int clamp(int n, int most) { return n < 0 ? 0 : n > most ? most : n; }

  // Moves to the first listed block from position `p` on with keys in [first, end).
  SDPA_KEY_TILES_FN void enter(int p) {
    for (position = p; position < listed; ++position) {
      const int64_t kb =
          position < partial_count ? partial[position] : full[position - partial_count];
      const int64_t block_first = kb * block_size, block_last = block_first + block_size;
      const int64_t lo = block_first > first ? block_first : first;
      const int64_t hi = block_last < end ? block_last : end;
      if (lo < hi) {
        j0 = static_cast<int>(lo);
        block_end = static_cast<int>(hi);
        return;
      }
    }
    j0 = end;
  }
};

}  // namespace sdpa::cuda::flash

#undef SDPA_KEY_TILES_FN
