// Reading a BlockMask's partial blocks from the call's shared bits (partial_bits.h): the
// first visit of a block evaluates its mask_mod into bit rows, later visits (other heads,
// other q-blocks, the second pass over a row) read words. Per-target code: include after
// foreach_target.h.

#if defined(SDPA_FLEX_PARTIAL_BITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_FLEX_PARTIAL_BITS_INL_H_
#undef SDPA_FLEX_PARTIAL_BITS_INL_H_
#else
#define SDPA_FLEX_PARTIAL_BITS_INL_H_
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <limits>

#include "core/kernel_inline.h"
#include "flex/eval_row-inl.h"
#include "flex/partial_bits.h"
#include "flex/row_state.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::flex {
namespace HWY_NAMESPACE {

// Evaluates kv block kb of q block qb (for batch b, head h) into slot `slot`. False where
// an element of the block failed: the kernel's own evaluation then reports the failure
// where the element is consumed, as without shared bits.
SDPA_INLINE bool FillPartialBlock(RowBuffers& buf, const PartialBlockBits& bits, int64_t slot,
                                  int64_t b, int64_t h, int64_t qb, int64_t kb) {
  constexpr int64_t kWord = PartialBlockBits::kWordKeys;
  const BlockMask& m = bits.mask();
  const int64_t i0 = qb * m.q_block_size, i1 = std::min(m.q_len, i0 + m.q_block_size);
  const int64_t k0 = kb * m.kv_block_size, k1 = std::min(m.kv_len, k0 + m.kv_block_size);
  const int64_t w0 = bits.first_word(kb);
  for (int64_t w = w0; w * kWord < k1; ++w) {
    const int64_t kv0 = w * kWord;
    const int64_t lo = std::max(k0, kv0) - kv0, hi = std::min(k1, kv0 + kWord) - kv0;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t row = PrepareChunk(buf, b, h, i, kv0);
      if (RowHasBad(buf, row, lo, hi)) return false;
      bits.row(slot, i - i0)[w - w0] = KeptLaneBits(buf, row, lo, hi) << lo;
    }
  }
  return true;
}

// The word of the shared bits holding lanes [0, hi) of the key tile at site.kv0 in the
// site's query row, over partial kv block kb, filling the block first if no thread has;
// null where there is none to read (no shared bits, a tile that is not one word, another
// thread still filling the block, a failed element). Call right after
// st.blocks.state(site.b, site.h, site.q_first, kb) returned kPartial.
SDPA_INLINE const uint64_t* SharedPartialWord(RowState& st, const EvalSite& site, int64_t kb,
                                              int64_t hi) {
  constexpr int64_t kWord = PartialBlockBits::kWordKeys;
  PartialBlockBits* bits = st.partial_bits;
  if (bits == nullptr || !bits->active() || st.mask_mod->lanes != kWord ||
      site.kv0 % kWord != 0 || hi > kWord) {
    return nullptr;
  }
  const int64_t slot = bits->slot(st.blocks.key_row(), st.blocks.partial_position(kb));
  std::atomic<uint8_t>& state = bits->state(slot);
  uint8_t seen = state.load(std::memory_order_acquire);
  if (seen == PartialBlockBits::kEmpty &&
      state.compare_exchange_strong(seen, PartialBlockBits::kFilling,
                                    std::memory_order_acquire)) {
    const int64_t qb = site.q_first / bits->mask().q_block_size;
    seen = FillPartialBlock(*st.mask_mod, *bits, slot, site.b, site.h, qb, kb)
               ? PartialBlockBits::kReady
               : PartialBlockBits::kUncached;
    state.store(seen, std::memory_order_release);
  }
  if (seen != PartialBlockBits::kReady) return nullptr;
  const int64_t r = site.q_first % bits->mask().q_block_size;
  return bits->row(slot, r) + (site.kv0 / kWord - bits->first_word(kb));
}

// Lanes [lo, hi) (hi <= 64) of a word.
SDPA_INLINE uint64_t LaneRange(uint64_t word, int64_t lo, int64_t hi) {
  const uint64_t below_hi = hi >= 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
  return word & below_hi & (~uint64_t{0} << lo);
}

/// CountKeptLanes over lanes [lo, hi) of partial kv block kb (st has a mask_mod), from the
/// shared bits where there are.
SDPA_INLINE KeptLanes PartialKeptLanes(RowState& st, const EvalSite& site, int64_t kb, int64_t lo,
                                       int64_t hi) {
  const uint64_t* word = SharedPartialWord(st, site, kb, hi);
  if (word == nullptr) return CountKeptLanes(*st.mask_mod, site, lo, hi);
  const uint64_t bits = LaneRange(*word, lo, hi);
  if (bits == 0) return {};
  const int64_t first = std::countr_zero(bits), last = 63 - std::countl_zero(bits);
  return {first, last, std::popcount(bits)};
}

/// ApplyMaskMod over lanes [lo, hi) of partial kv block kb (st has a mask_mod), from the
/// shared bits where there are.
SDPA_INLINE void PartialMaskRow(RowState& st, const EvalSite& site, int64_t kb,
                                float* HWY_RESTRICT s, int64_t lo, int64_t hi) {
  const uint64_t* word = SharedPartialWord(st, site, kb, hi);
  if (word == nullptr) return ApplyMaskMod(*st.mask_mod, site, s, lo, hi);
  const uint64_t bits = *word;
  for (int64_t j = lo; j < hi; ++j) {
    if (((bits >> j) & 1) == 0) s[j] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::flex
HWY_AFTER_NAMESPACE();

#endif  // SDPA_FLEX_PARTIAL_BITS_INL_H_
