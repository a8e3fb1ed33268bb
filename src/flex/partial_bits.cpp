#include "flex/partial_bits.h"

#include "flex/node.h"

namespace sdpa::flex {

PartialBlockBits::PartialBlockBits(const BlockMask* mask) {
  if (mask == nullptr || !mask->mask_mod) return;
  const CompiledProgram& program = *mask->mask_mod->compiled();
  if (program.uses_score || (program.uses_batch && mask->batch == 1) ||
      (program.uses_head && mask->num_heads == 1)) {
    return;
  }
  const int64_t key_rows = mask->batch * mask->num_heads * mask->num_q_blocks();
  const int32_t* counts = mask->kv_num_blocks.data<int32_t>();
  int64_t slots = 0;
  for (int64_t key = 0; key < key_rows; ++key) slots += counts[key];
  // A block's keys span at most this many words when it starts mid-word.
  words_per_row_ = (mask->kv_block_size + kWordKeys - 1) / kWordKeys + 1;
  const int64_t words = slots * mask->q_block_size * words_per_row_;
  if (slots == 0 || words * static_cast<int64_t>(sizeof(uint64_t)) > kMaxBytes) return;
  slot_base_ = std::make_unique<int64_t[]>(static_cast<size_t>(key_rows));
  for (int64_t key = 0, base = 0; key < key_rows; ++key) {
    slot_base_[key] = base;
    base += counts[key];
  }
  states_ = std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) states_[s].store(kEmpty, std::memory_order_relaxed);
  words_ = Tensor::empty({words}, DType::kInt64);
  mask_ = mask;
}

}  // namespace sdpa::flex
