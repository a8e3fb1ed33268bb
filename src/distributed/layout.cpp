// Layouts of a context-parallel sequence (which global positions each rank holds), as
// python/sdpa/distributed/layout.py.

#include <numeric>

#include "sdpa/context_parallel_mpi.h"
#include "sdpa/error.h"

namespace sdpa::distributed {
namespace {

// Boundaries of `chunks` chunks of `total` positions, the first total % chunks one longer.
std::vector<int64_t> chunk_bounds(int64_t total, int64_t chunks) {
  std::vector<int64_t> bounds{0};
  for (int64_t c = 0; c < chunks; ++c) {
    bounds.push_back(bounds.back() + total / chunks + (c < total % chunks ? 1 : 0));
  }
  return bounds;
}

}  // namespace

std::vector<Segment> segments(Layout layout, const std::vector<int64_t>& lengths, int rank) {
  const int world = static_cast<int>(lengths.size());
  SDPA_CHECK(rank >= 0 && rank < world, "segments: rank: expected 0 <= rank < ", world,
             ", got ", rank);
  if (layout == Layout::kContiguous) {
    const int64_t start = std::accumulate(lengths.begin(), lengths.begin() + rank, int64_t{0});
    if (lengths[rank] == 0) return {};
    return {{start, lengths[rank], 0}};
  }
  const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  const std::vector<int64_t> b = chunk_bounds(total, 2 * world);
  for (int r = 0; r < world; ++r) {
    const int64_t expected = b[r + 1] - b[r] + b[2 * world - r] - b[2 * world - r - 1];
    SDPA_CHECK(lengths[r] == expected, "zigzag layout: rank ", r, " holds ", lengths[r],
               " positions, expected ", expected, " (the zigzag split of ", total,
               " positions over ", world, " ranks)");
  }
  std::vector<Segment> out;
  int64_t local = 0;
  for (int chunk : {rank, 2 * world - 1 - rank}) {
    const int64_t length = b[chunk + 1] - b[chunk];
    if (length > 0) out.push_back({b[chunk], length, local});
    local += length;
  }
  return out;
}

Tensor shard(const Tensor& x, Layout layout, int world, int rank) {
  SDPA_CHECK(x.dim() == 4, "shard: x: expected [B, H, T, E], got ", x.describe());
  SDPA_CHECK(world > 0 && rank >= 0 && rank < world, "shard: rank: expected 0 <= rank < ",
             world, ", got ", rank);
  const int64_t total = x.size(2);
  std::vector<std::pair<int64_t, int64_t>> runs;  // [begin, end) of global positions
  if (layout == Layout::kContiguous) {
    const std::vector<int64_t> b = chunk_bounds(total, world);
    runs.emplace_back(b[rank], b[rank + 1]);
  } else {
    const std::vector<int64_t> b = chunk_bounds(total, 2 * world);
    runs.emplace_back(b[rank], b[rank + 1]);
    runs.emplace_back(b[2 * world - 1 - rank], b[2 * world - rank]);
  }
  int64_t rows = 0;
  for (const auto& [begin, end] : runs) rows += end - begin;
  Tensor out = Tensor::empty({x.size(0), x.size(1), rows, x.size(3)}, x.dtype());
  int64_t at = 0;
  for (const auto& [begin, end] : runs) {
    if (end > begin) out.slice(2, at, at + end - begin).copy_(x.slice(2, begin, end));
    at += end - begin;
  }
  return out;
}

}  // namespace sdpa::distributed
