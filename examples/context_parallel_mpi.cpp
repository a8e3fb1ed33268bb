// Context-parallel attention over MPI: every rank takes its slice of a sequence, runs
// sdpa::distributed::context_parallel_attention forward and backward, and checks its
// slice of the output and of the gradients against one sdpa call over the whole sequence
// (computed on every rank). Exits 1 when a case disagrees.
//
//   mpirun -np 4 build/release/tests/sdpa_context_parallel_mpi
//
// Cases: plain and causal, contiguous slices (uneven, one empty with 4 ranks) and the
// zigzag layout, GQA, bfloat16.

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "sdpa/context_parallel_mpi.h"

using namespace sdpa;
namespace cp = sdpa::distributed;

namespace {

Tensor randn(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  float* d = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = normal(gen);
  return t;
}

// The rows [begin, begin + n) of every rank's slice under contiguous slices of `lengths`.
Tensor rows_of(const Tensor& x, const std::vector<int64_t>& lengths, int rank) {
  int64_t begin = 0;
  for (int r = 0; r < rank; ++r) begin += lengths[static_cast<size_t>(r)];
  return x.slice(2, begin, begin + lengths[static_cast<size_t>(rank)]).contiguous();
}

// max |a - b| / max(max |b|, 1), in float64.
double relative_error(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(DType::kFloat64), y = b.to(DType::kFloat64);
  double diff = 0.0, scale = 1.0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    diff = std::max(diff, std::abs(x.data<double>()[i] - y.data<double>()[i]));
    scale = std::max(scale, std::abs(y.data<double>()[i]));
  }
  return diff / scale;
}

struct Case {
  std::string name;
  bool causal;
  cp::Layout layout;
  std::vector<int64_t> uneven;  // contiguous slice lengths (empty: the layout's split)
  int64_t heads_q, heads_kv;
  DType dtype;
};

bool run(const Case& c, int rank, int world) {
  const int64_t B = 2, E = 16, Ev = 12;
  int64_t total = 13 * world + 5;
  if (!c.uneven.empty()) {
    total = 0;
    for (int64_t n : c.uneven) total += n;
  }
  const Tensor q = randn({B, c.heads_q, total, E}, 1).to(c.dtype);
  const Tensor k = randn({B, c.heads_kv, total, E}, 2).to(c.dtype);
  const Tensor v = randn({B, c.heads_kv, total, Ev}, 3).to(c.dtype);
  const Tensor dout = randn({B, c.heads_q, total, Ev}, 4).to(c.dtype);
  SDPAOptions whole;
  whole.is_causal = c.causal;
  whole.enable_gqa = c.heads_q != c.heads_kv;
  const AttentionResult ref = scaled_dot_product_attention_with_lse(q, k, v, whole);
  const AttentionGradients ref_g =
      scaled_dot_product_attention_backward(dout, q, k, v, ref.out, ref.lse, whole);

  auto local = [&](const Tensor& x) {
    return c.uneven.empty() ? cp::shard(x, c.layout, world, rank) : rows_of(x, c.uneven, rank);
  };
  cp::ContextParallelOptions options;
  options.layout = c.layout;
  options.is_causal = c.causal;
  options.enable_gqa = whole.enable_gqa;
  const AttentionState mine = cp::context_parallel_attention(MPI_COMM_WORLD, local(q), local(k),
                                                             local(v), options);
  const AttentionGradients g = cp::context_parallel_attention_backward(
      MPI_COMM_WORLD, local(dout), local(q), local(k), local(v), mine.out, mine.lse, options);
  const double tolerance = c.dtype == DType::kFloat32 ? 2e-5 : 3e-2;
  bool ok = true;
  const std::pair<const char*, std::pair<Tensor, Tensor>> checks[] = {
      {"out", {mine.out, local(ref.out)}},       {"grad_q", {g.grad_q, local(ref_g.grad_q)}},
      {"grad_k", {g.grad_k, local(ref_g.grad_k)}}, {"grad_v", {g.grad_v, local(ref_g.grad_v)}}};
  for (const auto& [what, pair] : checks) {
    const double err = relative_error(pair.first, pair.second);
    if (!(err <= tolerance)) {
      std::printf("rank %d: %s: %s relative error %.3e > %.0e\n", rank, c.name.c_str(), what, err,
                  tolerance);
      ok = false;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<int64_t> uneven = {7, 30};
  if (world == 4) uneven = {5, 0, 20, 12};
  if (world != 2 && world != 4) uneven.clear();
  std::vector<Case> cases = {
      {"plain contiguous GQA", false, cp::Layout::kContiguous, {}, 4, 2, DType::kFloat32},
      {"causal zigzag GQA", true, cp::Layout::kZigzag, {}, 4, 2, DType::kFloat32},
      {"causal zigzag bf16", true, cp::Layout::kZigzag, {}, 2, 2, DType::kBFloat16},
  };
  if (!uneven.empty()) {
    cases.push_back({"causal uneven", true, cp::Layout::kContiguous, uneven, 3, 3,
                     DType::kFloat32});
  }
  int failures = 0;
  for (const Case& c : cases) {
    try {
      failures += run(c, rank, world) ? 0 : 1;
    } catch (const std::exception& e) {
      std::printf("rank %d: %s: %s\n", rank, c.name.c_str(), e.what());
      ++failures;
    }
  }
  if (failures == 0) std::printf("rank %d of %d: %zu cases ok\n", rank, world, cases.size());
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
