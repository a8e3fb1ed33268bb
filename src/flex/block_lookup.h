#pragma once
// Per-thread lookup of a BlockMask's block states for the rows a kernel visits.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "sdpa/flex.h"

namespace sdpa::flex {

enum class BlockState : uint8_t { kEmpty = 0, kPartial = 1, kFull = 2 };

class BlockMaskLookup {
 public:
  explicit BlockMaskLookup(const BlockMask* mask) : mask_(mask) {}

  bool active() const { return mask_ != nullptr; }
  int64_t q_block_size() const { return mask_->q_block_size; }
  int64_t kv_block_size() const { return mask_->kv_block_size; }

  /// State of kv block `kb` for query row i of (b, h); b and h broadcast when the mask has
  /// size 1 there.
  BlockState state(int64_t b, int64_t h, int64_t i, int64_t kb) {
    load_row(b, h, i / mask_->q_block_size);
    return row_[kb];
  }

  /// After state() returned kPartial for kv block kb: the row of the mask's [B, H,
  /// num_q_blocks] lists it read, and kb's position in that row's kv_indices.
  int64_t key_row() const { return cached_; }
  int64_t partial_position(int64_t kb) const { return position_[kb]; }

  /// Key columns [begin, end) spanned by the non-empty blocks of rows [r0, r1) of (b, h).
  /// Reads only the listed blocks (kv_indices, full_kv_indices), not every kv block.
  std::pair<int64_t, int64_t> columns(int64_t b, int64_t h, int64_t r0, int64_t r1) {
    int64_t first = mask_->num_kv_blocks(), last = -1;  // listed block range
    const int64_t nkv = mask_->num_kv_blocks();
    for (int64_t qb = r0 / mask_->q_block_size; qb <= (r1 - 1) / mask_->q_block_size; ++qb) {
      const int64_t key = row_key(b, h, qb);
      for (const auto& [num, indices] :
           {std::pair{&mask_->kv_num_blocks, &mask_->kv_indices},
            std::pair{&mask_->full_kv_num_blocks, &mask_->full_kv_indices}}) {
        const int32_t* listed = indices->data<int32_t>() + key * nkv;
        for (int32_t k = 0; k < num->data<int32_t>()[key]; ++k) {
          first = std::min<int64_t>(first, listed[k]);
          last = std::max<int64_t>(last, listed[k]);
        }
      }
    }
    if (last < first) return {0, 0};
    return {first * mask_->kv_block_size,
            std::min(mask_->kv_len, (last + 1) * mask_->kv_block_size)};
  }

 private:
  // Row of (b, h, q block qb) in the [B, H, num_q_blocks] lists (b, h broadcast at size 1).
  int64_t row_key(int64_t b, int64_t h, int64_t qb) const {
    const int64_t bb = mask_->batch == 1 ? 0 : b, hh = mask_->num_heads == 1 ? 0 : h;
    return (bb * mask_->num_heads + hh) * mask_->num_q_blocks() + qb;
  }

  void load_row(int64_t b, int64_t h, int64_t qb) {
    const int64_t nkv = mask_->num_kv_blocks();
    const int64_t key = row_key(b, h, qb);
    if (key == cached_) return;
    cached_ = key;
    row_.assign(static_cast<size_t>(nkv), BlockState::kEmpty);
    position_.resize(static_cast<size_t>(nkv));
    const int32_t* part = mask_->kv_indices.data<int32_t>() + key * nkv;
    const int32_t* full = mask_->full_kv_indices.data<int32_t>() + key * nkv;
    for (int32_t k = 0; k < mask_->kv_num_blocks.data<int32_t>()[key]; ++k) {
      row_[part[k]] = BlockState::kPartial;
      position_[part[k]] = k;
    }
    for (int32_t k = 0; k < mask_->full_kv_num_blocks.data<int32_t>()[key]; ++k) {
      row_[full[k]] = BlockState::kFull;
    }
  }

  const BlockMask* mask_;
  int64_t cached_ = -1;
  std::vector<BlockState> row_;
  std::vector<int32_t> position_;  // of partial blocks in the row's kv_indices
};

}  // namespace sdpa::flex
