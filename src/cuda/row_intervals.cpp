// Per-row key intervals from the CPU kernels' definition (row_intervals.h).

#include "cuda/row_intervals.h"

#include "cpu/mask_rows.h"

namespace sdpa::cuda {

RowIntervals row_intervals(const AttentionParams& p) {
  RowIntervals r;
  r.batches = p.mask.kv_lengths.empty() ? 1 : p.batch;
  r.lo.reserve(static_cast<size_t>(r.batches * p.q_len));
  r.hi.reserve(static_cast<size_t>(r.batches * p.q_len));
  for (int64_t b = 0; b < r.batches; ++b) {
    for (int64_t i = 0; i < p.q_len; ++i) {
      const cpu::ColumnRange keys = cpu::row_columns(p.mask, b, i, p.q_len, p.kv_len);
      r.every_row_keeps_a_key = r.every_row_keeps_a_key && !keys.empty();
      r.lo.push_back(static_cast<int32_t>(keys.begin));
      r.hi.push_back(static_cast<int32_t>(keys.end));
    }
  }
  return r;
}

bool needs_intervals(const MaskDescriptor& m) {
  bool other_frame = false;
  for (const DiagonalBand& band : m.bands) other_frame |= band.frame != BandFrame::kSequence;
  return m.has_documents() || !m.kv_lengths.empty() || other_frame;
}

}  // namespace sdpa::cuda
