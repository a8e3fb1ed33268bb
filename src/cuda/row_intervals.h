#pragma once
// The keys each query row keeps, as one interval per (batch, row): the CPU kernels' own
// definition (cpu/mask_rows.h) handed to the GPU kernels, which cannot walk documents,
// padding or other frames themselves. Used by the cuDNN lowering (as captured int32
// tensors) and by the CUDA FLASH kernels (as per-row bounds).

#include <cstdint>
#include <vector>

#include "sdpa/params.h"

namespace sdpa::cuda {

/// [lo, hi) of the kept keys per (batch, row) of [batches, L]; batches is 1 unless the
/// mask has key padding (the only part that depends on the batch).
struct RowIntervals {
  int64_t batches = 1;
  std::vector<int32_t> lo, hi;
  bool every_row_keeps_a_key = true;
};

/// The intervals of `p`'s mask (bands in every frame, documents, padding; not the dense
/// mask). Sizes must fit int32 (the callers' checks ensure it).
RowIntervals row_intervals(const AttentionParams& p);

/// Whether the keep condition needs per-row intervals (documents, padding or a band not in
/// the sequence frame) rather than index arithmetic alone.
bool needs_intervals(const MaskDescriptor& m);

}  // namespace sdpa::cuda
