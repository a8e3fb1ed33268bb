// The key-tile walk of the CUDA FLASH forward (cuda/flash/key_tiles.cuh), run on the host:
// the tiles a block visits with and without a BlockMask's lists, against the tiles the
// lists and the rows' key range define directly.

#include "cuda/flash/key_tiles.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace sdpa_test {
namespace {

using sdpa::cuda::flash::KeyTiles;

// (first key, whether the tile lies in a full block) of every tile of a walk.
template <int kKeys, bool kLists>
std::vector<std::pair<int, bool>> walk(KeyTiles<kKeys, kLists> tiles) {
  std::vector<std::pair<int, bool>> visited;
  for (; !tiles.done(); tiles.next()) {
    visited.emplace_back(tiles.j0, tiles.in_full_block());
    if (visited.size() > 100000) break;  // a walk that does not end fails below
  }
  return visited;
}

// The tiles of kv blocks `partial` then `full` (block_size keys each) in [first, end).
std::vector<std::pair<int, bool>> expected_tiles(const std::vector<int32_t>& partial,
                                                 const std::vector<int32_t>& full, int first,
                                                 int end, int block_size, int keys) {
  std::vector<std::pair<int, bool>> tiles;
  for (bool is_full : {false, true}) {
    for (int32_t kb : is_full ? full : partial) {
      const int lo = std::max(kb * block_size, first), hi = std::min((kb + 1) * block_size, end);
      for (int j = lo; j < hi; j += keys) tiles.emplace_back(j, is_full);
    }
  }
  return tiles;
}

TEST(KeyTiles, ARangeVisitsEveryTileOnce) {
  EXPECT_EQ((walk(KeyTiles<64, false>::range(0, 1000)).size()), 16u);
  const auto tiles = walk(KeyTiles<64, true>::range(128, 257));
  ASSERT_EQ(tiles.size(), 3u);
  EXPECT_EQ(tiles[0], std::make_pair(128, false));
  EXPECT_EQ(tiles[2], std::make_pair(256, false));
  EXPECT_TRUE(walk(KeyTiles<32, false>::range(64, 64)).empty());
}

TEST(KeyTiles, ListsVisitPartialThenFullBlocksClippedToTheRowsKeys) {
  const std::vector<int32_t> partial = {1, 4, 7}, full = {0, 5, 6};
  // kv blocks of 128 keys, tiles of 64; rows keep [64, 900): block 0 is cut to its second
  // tile, block 7 to [896, 900), and a block past the keys would be passed over.
  const auto tiles = walk(KeyTiles<64, true>::listed_blocks(
      64, 900, partial.data(), 3, full.data(), 3, /*num_kv_blocks=*/8, /*block_size=*/128));
  EXPECT_EQ(tiles, expected_tiles(partial, full, 64, 900, 128, 64));
  EXPECT_EQ(tiles.front(), std::make_pair(128, false));  // block 1
  EXPECT_EQ(tiles[4], std::make_pair(896, false));       // block 7, clipped
  EXPECT_EQ(tiles[5], std::make_pair(64, true));         // block 0, clipped
}

TEST(KeyTiles, BlocksOutsideTheKeysAndEmptyListsVisitNothing) {
  const std::vector<int32_t> partial = {9, 10}, full = {11};
  EXPECT_TRUE(
      walk(KeyTiles<64, true>::listed_blocks(0, 500, partial.data(), 2, full.data(), 1, 16, 64))
          .empty());
  EXPECT_TRUE(
      walk(KeyTiles<64, true>::listed_blocks(0, 500, partial.data(), 0, full.data(), 0, 16, 64))
          .empty());
}

TEST(KeyTiles, CountsOutsideTheListsAreClamped) {
  // A count above the number of kv blocks reads no further than the list; a negative one
  // reads nothing.
  const std::vector<int32_t> partial = {0, 1}, full = {2};
  const auto tiles =
      walk(KeyTiles<32, true>::listed_blocks(0, 192, partial.data(), 1000, full.data(), -5, 2, 64));
  EXPECT_EQ(tiles, expected_tiles(partial, {}, 0, 192, 64, 32));
}

TEST(KeyTiles, RandomListsMatchTheDirectTiles) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int keys = trial % 2 ? 64 : 32;
    const int block_size = keys * static_cast<int>(1 + rng() % 4);
    const int kv_len = 1 + static_cast<int>(rng() % 3000);
    const int num_kv_blocks = (kv_len + block_size - 1) / block_size;
    const int end = 1 + static_cast<int>(rng() % kv_len);
    const int first = static_cast<int>(rng() % end) / keys * keys;
    std::vector<int32_t> blocks(static_cast<size_t>(num_kv_blocks));
    for (int kb = 0; kb < num_kv_blocks; ++kb) blocks[static_cast<size_t>(kb)] = kb;
    std::shuffle(blocks.begin(), blocks.end(), rng);
    blocks.resize(rng() % (blocks.size() + 1));
    const size_t split = rng() % (blocks.size() + 1);
    std::vector<int32_t> partial(blocks.begin(), blocks.begin() + static_cast<long>(split));
    std::vector<int32_t> full(blocks.begin() + static_cast<long>(split), blocks.end());
    std::sort(partial.begin(), partial.end());
    std::sort(full.begin(), full.end());
    // Lists as long as the kv blocks, as the BlockMask's rows are.
    std::vector<int32_t> partial_row(partial), full_row(full);
    partial_row.resize(static_cast<size_t>(num_kv_blocks), -1);
    full_row.resize(static_cast<size_t>(num_kv_blocks), -1);
    const auto expected = expected_tiles(partial, full, first, end, block_size, keys);
    const auto visited =
        keys == 64
            ? walk(KeyTiles<64, true>::listed_blocks(
                  first, end, partial_row.data(), static_cast<int>(partial.size()), full_row.data(),
                  static_cast<int>(full.size()), num_kv_blocks, block_size))
            : walk(KeyTiles<32, true>::listed_blocks(
                  first, end, partial_row.data(), static_cast<int>(partial.size()), full_row.data(),
                  static_cast<int>(full.size()), num_kv_blocks, block_size));
    ASSERT_EQ(visited, expected) << "trial " << trial;
  }
}

}  // namespace
}  // namespace sdpa_test
