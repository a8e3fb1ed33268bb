// Context-parallel attention over MPI: every rank takes its slice of a sequence, runs
// sdpa::distributed::context_parallel_attention forward and backward, and checks its
// slice of the output and of the gradients against one sdpa call over the whole sequence
// (computed on every rank). Exits 1 when a case disagrees.
//
//   mpirun -np 4 build/release/tests/sdpa_context_parallel_mpi
//
// Cases: plain and causal, contiguous slices (uneven, one empty with 4 ranks) and the
// zigzag layout, GQA, bfloat16, windows and documents over global positions (crossing
// the slices), dropout (the same weights dropped as by the whole call with the same
// state), and the refusal of a mask that is not over global positions. With --die, rank
// 1 dies before the call: mpirun must end the job (no rank left waiting).

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
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

// The mask of a case over `total` global positions.
enum class Mask { kNone, kCausal, kWindow, kLeftWindow, kCausalDocuments, kWindowedDocuments };

AttnMask mask_of(Mask m, int64_t total) {
  // Documents of uneven lengths, one of them empty, crossing every rank's slice edges.
  const std::vector<int64_t> cu = {0, total / 3, total / 3, total / 3 + 4, total};
  switch (m) {
    case Mask::kWindow:
      return std::make_shared<LocalAttentionBias>(int64_t{9}, int64_t{4});
    case Mask::kLeftWindow:
      return std::make_shared<LocalAttentionBias>(int64_t{6}, int64_t{0});
    case Mask::kCausalDocuments:
      return std::make_shared<BlockDiagonalBias>(cu, cu, true);
    case Mask::kWindowedDocuments:
      return compose({std::make_shared<BlockDiagonalBias>(cu),
                      std::make_shared<LocalAttentionBias>(int64_t{5}, int64_t{2})});
    default:
      return {};
  }
}

struct Case {
  std::string name;
  Mask mask;
  cp::Layout layout;
  std::vector<int64_t> uneven;  // contiguous slice lengths (empty: the layout's split)
  int64_t heads_q, heads_kv;
  DType dtype;
  double dropout_p = 0.0;
};

bool run(const Case& c, int rank, int world) {
  const int64_t B = 2, E = 16, Ev = 12;
  int64_t total = 13 * world + 5;
  if (!c.uneven.empty()) {
    total = 0;
    for (int64_t n : c.uneven) total += n;
  }
  const bool causal = c.mask == Mask::kCausal;
  const AttnMask mask = mask_of(c.mask, total);
  const Tensor q = randn({B, c.heads_q, total, E}, 1).to(c.dtype);
  const Tensor k = randn({B, c.heads_kv, total, E}, 2).to(c.dtype);
  const Tensor v = randn({B, c.heads_kv, total, Ev}, 3).to(c.dtype);
  const Tensor dout = randn({B, c.heads_q, total, Ev}, 4).to(c.dtype);
  auto local = [&](const Tensor& x) {
    return c.uneven.empty() ? cp::shard(x, c.layout, world, rank) : rows_of(x, c.uneven, rank);
  };
  cp::ContextParallelOptions options;
  options.layout = c.layout;
  options.is_causal = causal;
  options.attn_mask = mask;
  options.enable_gqa = c.heads_q != c.heads_kv;
  options.dropout_p = c.dropout_p;
  const AttentionResult mine = cp::context_parallel_attention(MPI_COMM_WORLD, local(q), local(k),
                                                              local(v), options);
  options.dropout_state = mine.philox;
  const AttentionGradients g = cp::context_parallel_attention_backward(
      MPI_COMM_WORLD, local(dout), local(q), local(k), local(v), mine.out, mine.lse, options);

  // One call over the whole sequence with the same mask and dropout state.
  SDPAOptions whole;
  whole.is_causal = causal;
  whole.attn_mask = mask;
  whole.enable_gqa = options.enable_gqa;
  whole.dropout_p = c.dropout_p;
  whole.dropout_state = mine.philox;
  const AttentionResult ref = scaled_dot_product_attention_with_lse(q, k, v, whole);
  const AttentionGradients ref_g =
      scaled_dot_product_attention_backward(dout, q, k, v, ref.out, ref.lse, whole);
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

// A dense mask tensor is not a mask over global positions: every rank refuses it by name
// before any message.
bool refuses_dense_masks(int rank, int world) {
  const int64_t T = 13 * world + 5;
  cp::ContextParallelOptions options;
  options.attn_mask = Tensor::full({T, T}, 1.0, DType::kBool);
  const Tensor x = randn({1, 1, 13, 8}, 5);
  try {
    (void)cp::context_parallel_attention(MPI_COMM_WORLD, x, x, x, options);
  } catch (const Error& e) {
    if (std::strstr(e.what(), "attn_mask") != nullptr) return true;
  }
  std::printf("rank %d: a dense attn_mask was not refused by name\n", rank);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc > 1 && std::strcmp(argv[1], "--die") == 0 && rank == 1) std::raise(SIGKILL);
  std::vector<int64_t> uneven = {7, 30};
  if (world == 4) uneven = {5, 0, 20, 12};
  if (world != 2 && world != 4) uneven.clear();
  using cp::Layout;
  std::vector<Case> cases = {
      {"plain contiguous GQA", Mask::kNone, Layout::kContiguous, {}, 4, 2, DType::kFloat32},
      {"causal zigzag GQA", Mask::kCausal, Layout::kZigzag, {}, 4, 2, DType::kFloat32},
      {"causal zigzag bf16", Mask::kCausal, Layout::kZigzag, {}, 2, 2, DType::kBFloat16},
      {"two-sided window", Mask::kWindow, Layout::kContiguous, {}, 2, 1, DType::kFloat32},
      {"causal window zigzag", Mask::kLeftWindow, Layout::kZigzag, {}, 2, 2, DType::kFloat32},
      {"causal documents zigzag", Mask::kCausalDocuments, Layout::kZigzag, {}, 4, 2,
       DType::kFloat32},
      {"documents with a window", Mask::kWindowedDocuments, Layout::kContiguous, {}, 2, 2,
       DType::kFloat32},
      {"dropout", Mask::kNone, Layout::kContiguous, {}, 4, 2, DType::kFloat32, 0.3},
      {"causal zigzag dropout", Mask::kCausal, Layout::kZigzag, {}, 2, 2, DType::kFloat32, 0.2},
  };
  if (!uneven.empty()) {
    cases.push_back({"causal uneven", Mask::kCausal, Layout::kContiguous, uneven, 3, 3,
                     DType::kFloat32});
    cases.push_back({"windowed documents uneven, dropout", Mask::kWindowedDocuments,
                     Layout::kContiguous, uneven, 2, 1, DType::kFloat32, 0.25});
  }
  int failures = refuses_dense_masks(rank, world) ? 0 : 1;
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
