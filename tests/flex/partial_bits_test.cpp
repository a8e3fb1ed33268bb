// The shared bits of a BlockMask's partial blocks (src/flex/partial_bits.h): FLASH reads a
// partial block's mask_mod from bits evaluated once per call. Checked against a float64
// reference written here, forward and backward: masks broadcast over batch and heads
// (one slot serves every head), masks that read h (a slot per head), kept sets that are
// not intervals, block sizes that are not multiples of the 64-key tile, GQA and odd
// lengths; bit-identical results for 1 and 2 threads; a failed captured read in a
// partial block still reported; and when the bits stay off.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "flash_check.h"
#include "flex/partial_bits.h"
#include "sdpa/flex_mods.h"
#include "sdpa/threading.h"

namespace flex_test {
namespace {

using sdpa::flex::BlockMask;
using sdpa::flex::Captured;
using sdpa::flex::Expr;
using sdpa::flex::MaskMod;
using sdpa::flex::PartialBlockBits;
namespace mods = sdpa::flex::mods;

// Documents of uneven lengths (70, 100, 40, ...) over n positions.
std::vector<int64_t> document_ids(int64_t n) {
  const int64_t lengths[] = {70, 100, 40, 130, 25};
  std::vector<int64_t> ids(static_cast<size_t>(n));
  int64_t doc = 0, left = lengths[0];
  for (int64_t i = 0; i < n; ++i) {
    if (left == 0) left = lengths[++doc % 5];
    ids[static_cast<size_t>(i)] = doc;
    --left;
  }
  return ids;
}

void check(const Inputs& in, const BlockMask& bm, const RefMods& ref, int64_t E) {
  SDPAOptions opts;
  opts.enable_gqa = true;
  const double scale = 1.0 / std::sqrt(static_cast<double>(E));
  check_flash_against(in, std::nullopt, &bm, opts, reference_forward(in.q, in.k, in.v, scale, ref),
                      reference_backward(in.dout, in.q, in.k, in.v, scale, ref));
}

struct BlockSizes {
  int64_t q, kv;
};

TEST(FlexPartialBits, DocumentsAndCausalBroadcastOverBatchAndHeads) {
  const int64_t L = 257, S = 257, E = 24;
  const std::vector<int64_t> ids = document_ids(L);
  const MaskMod mask = sdpa::flex::and_masks({mods::document(int_tensor(ids)), mods::causal()});
  RefMods ref;
  ref.keep = [&](int64_t, int64_t, int64_t i, int64_t j) {
    return j <= i && ids[static_cast<size_t>(i)] == ids[static_cast<size_t>(j)];
  };
  const Inputs in = inputs(2, 4, 2, L, S, E, 9, 900);
  for (const BlockSizes bs : {BlockSizes{128, 128}, BlockSizes{64, 32}, BlockSizes{48, 100}}) {
    SCOPED_TRACE("blocks " + std::to_string(bs.q) + " x " + std::to_string(bs.kv));
    const BlockMask bm = sdpa::flex::create_block_mask(
        sdpa::flex::Program::from_mask_mod(mask), 1, 1, L, S, bs.q, bs.kv);
    EXPECT_TRUE(PartialBlockBits(&bm).active());
    check(in, bm, ref, E);
  }
}

TEST(FlexPartialBits, KeptKeysThatAreNotIntervals) {
  // Every third key inside a sliding window, plus the diagonal: partial blocks whose rows
  // keep scattered keys, so the kernel masks element by element from the bits.
  const int64_t L = 200, S = 331, E = 16;
  const MaskMod mask = [](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    return ((kv % 3 != 1) & (q - kv < 90) & (kv - q < 150)) | (q == kv);
  };
  RefMods ref;
  ref.keep = [](int64_t, int64_t, int64_t i, int64_t j) {
    return (j % 3 != 1 && i - j < 90 && j - i < 150) || i == j;
  };
  const Inputs in = inputs(1, 3, 3, L, S, E, E, 910);
  for (const BlockSizes bs : {BlockSizes{128, 128}, BlockSizes{16, 80}}) {
    SCOPED_TRACE("blocks " + std::to_string(bs.q) + " x " + std::to_string(bs.kv));
    const BlockMask bm = sdpa::flex::create_block_mask(sdpa::flex::Program::from_mask_mod(mask), 1,
                                                       1, L, S, bs.q, bs.kv);
    EXPECT_TRUE(PartialBlockBits(&bm).active());
    check(in, bm, ref, E);
  }
}

TEST(FlexPartialBits, MaskReadingTheHeadGetsASlotPerHead) {
  // A causal window whose width grows with h: a BlockMask of H = 3 heads lists each head's
  // blocks, and each head's partial blocks get slots of their own.
  const int64_t L = 190, S = 190, H = 3, E = 8;
  const MaskMod mask = [](const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
    return (kv <= q) & (q - kv < h * 37 + 20);
  };
  RefMods ref;
  ref.keep = [](int64_t, int64_t h, int64_t i, int64_t j) { return j <= i && i - j < h * 37 + 20; };
  const BlockMask bm =
      sdpa::flex::create_block_mask(sdpa::flex::Program::from_mask_mod(mask), 1, H, L, S, 64);
  EXPECT_TRUE(PartialBlockBits(&bm).active());
  check(inputs(2, H, H, L, S, E, E, 920), bm, ref, E);
}

TEST(FlexPartialBits, SameBitsForAnyThreadCount) {
  const int64_t L = 300, S = 300;
  const std::vector<int64_t> ids = document_ids(L);
  const BlockMask bm = sdpa::flex::create_block_mask(
      sdpa::flex::and_masks({mods::document(int_tensor(ids)), mods::causal()}), 1, 1, L, S, 128);
  const Inputs in = inputs(1, 6, 6, L, S, 32, 32, 930);
  sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  const int threads = sdpa::get_num_threads();
  sdpa::set_num_threads(1);
  const auto one = sdpa::flex_attention(in.q, in.k, in.v, std::nullopt, &bm);
  sdpa::set_num_threads(2);
  const auto two = sdpa::flex_attention(in.q, in.k, in.v, std::nullopt, &bm);
  sdpa::set_num_threads(threads);
  EXPECT_EQ(max_abs_diff(one.out, two.out), 0.0);
  EXPECT_EQ(max_abs_diff(one.lse, two.lse), 0.0);
}

TEST(FlexPartialBits, FailedReadInAPartialBlockIsReported) {
  // Every block listed as partial, with a mask_mod reading a table one entry short of the
  // keys: filling the last key block's bits fails, and the kernel's own evaluation then
  // reports the read, as without the bits.
  const int64_t L = 100, S = 150, nq = 2, nkv = 3;
  const Captured table("key_table", randn({S - 1}, DType::kFloat32, 941));
  const sdpa::flex::Program mask = sdpa::flex::Program::from_mask_mod(
      [&](const Expr&, const Expr&, const Expr&, const Expr& kv) { return table[kv] < 10.0; });
  Tensor counts = Tensor::empty({1, 1, nq}, DType::kInt32);
  Tensor indices = Tensor::empty({1, 1, nq, nkv}, DType::kInt32);
  for (int64_t qb = 0; qb < nq; ++qb) {
    counts.set_item(Shape{0, 0, qb}, static_cast<double>(nkv));
    for (int64_t kb = 0; kb < nkv; ++kb) {
      indices.set_item(Shape{0, 0, qb, kb}, static_cast<double>(kb));
    }
  }
  const BlockMask bm =
      sdpa::flex::block_mask_from_kv_blocks({counts, indices, {}, {}}, L, S, 64, 64, mask);
  EXPECT_TRUE(PartialBlockBits(&bm).active());
  const Inputs in = inputs(1, 2, 2, L, S, 8, 8, 942);
  sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(in.q, in.k, in.v, std::nullopt, &bm); },
                                      {"key_table", "index 149", "size 149"}));
}

TEST(FlexPartialBits, OffWhereSlotsWouldDifferOrTheMaskIsTooBig) {
  const MaskMod causal = mods::causal();
  const BlockMask small = sdpa::flex::create_block_mask(causal, 1, 1, 300, 300, 128);
  EXPECT_TRUE(PartialBlockBits(&small).active());
  EXPECT_FALSE(PartialBlockBits(nullptr).active());
  // No mask_mod: partial blocks are kept whole.
  BlockMask no_mod = small;
  no_mod.mask_mod.reset();
  EXPECT_FALSE(PartialBlockBits(&no_mod).active());
  // A mask read per head, listed once for every head: heads would share a slot.
  const MaskMod by_head = [](const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
    return q - kv < h + 5;
  };
  BlockMask shared = sdpa::flex::create_block_mask(by_head, 1, 2, 300, 300, 128);
  ASSERT_EQ(shared.num_heads, 2);
  EXPECT_TRUE(PartialBlockBits(&shared).active());
  shared.num_heads = 1;
  EXPECT_FALSE(PartialBlockBits(&shared).active());
  // Every block partial: 512 x 512 blocks of 16 x 16 need 512 * 512 * 16 rows * 2 words.
  const MaskMod odd_keys = [](const Expr&, const Expr&, const Expr&, const Expr& kv) {
    return kv % 2 == 0;
  };
  const BlockMask big = sdpa::flex::create_block_mask(odd_keys, 1, 1, 8192, 8192, 16);
  EXPECT_FALSE(PartialBlockBits(&big).active());
}

}  // namespace
}  // namespace flex_test
