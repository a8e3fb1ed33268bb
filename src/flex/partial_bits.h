#pragma once
// The kept keys of a BlockMask's partial blocks as bit rows, evaluated once per kernel call
// and shared by its threads and by every (batch, head) that the mask_mod does not read.

#include <atomic>
#include <cstdint>
#include <memory>

#include "sdpa/flex.h"
#include "sdpa/tensor.h"

namespace sdpa::flex {

/// Bit rows of the partial blocks of one call's BlockMask. A kernel evaluates a partial
/// block's mask_mod for every head that visits it: 16 times per call for a mask broadcast
/// over 16 heads, where the elements cannot differ. Here each listed partial block gets a
/// slot of q_block_size rows x words_per_row() 64-bit words, filled on first use
/// (partial_bits-inl.h) and read by every later visit. Bit j of word w of a row is key
/// 64 w + j; bits outside the block are clear.
/// Inactive (every lookup evaluates) without a mask_mod, for a mask_mod that reads score,
/// that reads b where the mask has one batch entry or h where it has one head (the rows
/// that share a slot would then differ), and when the slots would take more than
/// kMaxBytes.
class PartialBlockBits {
 public:
  static constexpr int64_t kWordKeys = 64;
  static constexpr int64_t kMaxBytes = int64_t{32} << 20;

  enum SlotState : uint8_t { kEmpty, kFilling, kReady, kUncached };

  /// `mask` may be null (inactive). It must outlive this object.
  explicit PartialBlockBits(const BlockMask* mask);
  PartialBlockBits(const PartialBlockBits&) = delete;
  PartialBlockBits& operator=(const PartialBlockBits&) = delete;

  bool active() const { return mask_ != nullptr; }
  const BlockMask& mask() const { return *mask_; }

  /// Slot of the partial block at `position` of the kv_indices list of row `key_row` of
  /// the mask's [B, H, num_q_blocks] lists.
  int64_t slot(int64_t key_row, int64_t position) const { return slot_base_[key_row] + position; }
  std::atomic<uint8_t>& state(int64_t slot) const { return states_[slot]; }
  /// Row r < q_block_size of slot `slot`: words_per_row() words from first_word(kb).
  uint64_t* row(int64_t slot, int64_t r) const {
    return words_.data<uint64_t>() + (slot * mask_->q_block_size + r) * words_per_row_;
  }
  int64_t words_per_row() const { return words_per_row_; }
  /// The word holding kv block kb's first key.
  int64_t first_word(int64_t kb) const { return kb * mask_->kv_block_size / kWordKeys; }

 private:
  const BlockMask* mask_ = nullptr;
  int64_t words_per_row_ = 0;
  std::unique_ptr<int64_t[]> slot_base_;
  std::unique_ptr<std::atomic<uint8_t>[]> states_;
  Tensor words_;
};

}  // namespace sdpa::flex
