#pragma once
// Deterministic accumulation of gradients into a score_mod's captured tensors.
//
// Contributions are summed in float64 into one partial buffer per *chunk* of work items,
// where the chunking depends only on the number of items (never on the thread count);
// chunks are processed by one thread each, in item order, and reduced in chunk order.
// So the result is bit-identical for any number of threads.

#include <cstdint>
#include <vector>

#include "flex/autodiff.h"

namespace sdpa::flex {

class CapturedGrads {
 public:
  /// Chunks used for `items` work items.
  static int64_t num_chunks(int64_t items) { return items < 64 ? items : 64; }

  CapturedGrads(const GradientProgram& grad, const std::vector<Captured>& forward_captured,
                int64_t chunks);

  bool active() const { return !grad_->reads.empty(); }
  /// Adds `value` at `index` (one entry per tensor dimension) of the tensor behind read r.
  void add(int64_t chunk, size_t read, const int64_t* index, double value);
  /// Sums the chunks in order; returns one tensor per forward captured slot (undefined for
  /// slots without gradient), each shaped and typed like the captured tensor.
  std::vector<Tensor> finish() const;

 private:
  const GradientProgram* grad_;
  const std::vector<Captured>* forward_;
  int64_t chunks_;
  std::vector<int64_t> slot_offset_;  // per forward slot: offset in a chunk's buffer, -1 none
  int64_t chunk_size_ = 0;
  std::vector<double> partial_;       // [chunks, chunk_size_]
};

}  // namespace sdpa::flex
