#pragma once
// Per-thread lookup of a BlockMask's block states for the rows a kernel visits.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sdpa/flex.h"

namespace sdpa::flex {

enum class BlockState : uint8_t { kEmpty = 0, kPartial = 1, kFull = 2 };

class BlockMaskLookup {
 public:
  explicit BlockMaskLookup(const BlockMask* mask) : mask_(mask) {}

  bool active() const { return mask_ != nullptr; }
  int64_t kv_block_size() const { return mask_->kv_block_size; }

  /// State of kv block `kb` for query row i of (b, h); b and h broadcast when the mask has
  /// size 1 there.
  BlockState state(int64_t b, int64_t h, int64_t i, int64_t kb) {
    load_row(b, h, i / mask_->q_block_size);
    return row_[kb];
  }

  /// Key columns [begin, end) spanned by the non-empty blocks of rows [r0, r1) of (b, h).
  std::pair<int64_t, int64_t> columns(int64_t b, int64_t h, int64_t r0, int64_t r1) {
    int64_t lo = mask_->kv_len, hi = 0;
    for (int64_t qb = r0 / mask_->q_block_size; qb <= (r1 - 1) / mask_->q_block_size; ++qb) {
      load_row(b, h, qb);
      for (size_t kb = 0; kb < row_.size(); ++kb) {
        if (row_[kb] == BlockState::kEmpty) continue;
        lo = std::min<int64_t>(lo, static_cast<int64_t>(kb) * mask_->kv_block_size);
        hi = std::max<int64_t>(hi, std::min<int64_t>(mask_->kv_len, (kb + 1) * mask_->kv_block_size));
      }
    }
    return lo < hi ? std::pair<int64_t, int64_t>{lo, hi} : std::pair<int64_t, int64_t>{0, 0};
  }

 private:
  void load_row(int64_t b, int64_t h, int64_t qb) {
    const int64_t bb = mask_->batch == 1 ? 0 : b, hh = mask_->num_heads == 1 ? 0 : h;
    const int64_t nq = mask_->num_q_blocks(), nkv = mask_->num_kv_blocks();
    const int64_t key = (bb * mask_->num_heads + hh) * nq + qb;
    if (key == cached_) return;
    cached_ = key;
    row_.assign(static_cast<size_t>(nkv), BlockState::kEmpty);
    const int32_t* part = mask_->kv_indices.data<int32_t>() + key * nkv;
    const int32_t* full = mask_->full_kv_indices.data<int32_t>() + key * nkv;
    for (int32_t k = 0; k < mask_->kv_num_blocks.data<int32_t>()[key]; ++k) {
      row_[part[k]] = BlockState::kPartial;
    }
    for (int32_t k = 0; k < mask_->full_kv_num_blocks.data<int32_t>()[key]; ++k) {
      row_[full[k]] = BlockState::kFull;
    }
  }

  const BlockMask* mask_;
  int64_t cached_ = -1;
  std::vector<BlockState> row_;
};

}  // namespace sdpa::flex
