#pragma once
// Context parallelism over MPI: one attention call over a sequence split across the ranks
// of a communicator, for programs that do not use Python (Python: sdpa.distributed on
// torch.distributed). Built as the library sdpa::sdpa_mpi where CMake finds MPI (Debian's
// Open MPI: libopenmpi-dev); link it and run the program with mpirun.
//
// Ring Attention (Liu et al., 2023): every rank holds a slice of q, k and v (Layout);
// the K/V slices travel around the ranks with MPI_Isend / MPI_Irecv posted before the
// attention to the current slice, and each rank merges its partial results by
// logsumexp (merge_attention_states). The backward passes K, V and float32 dK / dV
// accumulators around once more, taking the forward's merged out and logsumexp, so that
// every piece's probabilities are the global ones (FLASH_ATTENTION), and each slice's
// gradients arrive back at its owner.

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "sdpa/registry.h"
#include "sdpa/sdpa.h"

namespace sdpa::distributed {

/// Which global positions a rank holds. kContiguous: rank r the run after ranks 0..r-1
/// (slices may differ in length, or be empty). kZigzag: the sequence cut into 2N chunks
/// (the first total % 2N one longer), rank r holding chunks r and 2N-1-r, which gives
/// every rank the same causal work.
enum class Layout { kContiguous, kZigzag };

/// Global positions [start, start + length) held at local rows [local, local + length).
struct Segment {
  int64_t start;
  int64_t length;
  int64_t local;
};

/// The segments of `rank` given every rank's local length. Throws sdpa::Error when the
/// lengths are not a zigzag split (kZigzag) or rank is out of range.
std::vector<Segment> segments(Layout layout, const std::vector<int64_t>& lengths, int rank);

/// Rank `rank`'s slice (of `world`) of x [B, H, T, E] along dim 2, contiguous.
Tensor shard(const Tensor& x, Layout layout, int world, int rank);

struct ContextParallelOptions {
  Layout layout = Layout::kContiguous;
  /// Causal over global positions: query i sees keys j <= i. Error with attn_mask.
  bool is_causal = false;
  /// A mask over the global positions of the whole [T, T] attention: LocalAttentionBias
  /// (windows), CausalBias, BlockDiagonalBias with the same documents for queries and
  /// keys (causal or not), or compose() of them. Each rank cuts it into pieces of native
  /// calls, so no [T, T] tensor exists. Other masks are refused with sdpa::Error.
  AttnMask attn_mask;
  std::optional<double> scale;
  bool enable_gqa = false;
  /// Attention dropout: weight (b, h, i, j) of the whole call is dropped exactly as one
  /// scaled_dot_product_attention call over the whole sequence with the same state drops
  /// it, on any number of ranks.
  double dropout_p = 0.0;
  /// Rank 0's generator draws the state (broadcast to the others) when dropout_state is
  /// absent; null: the default generator.
  Generator* generator = nullptr;
  /// The state to use (the backward must pass the forward's AttentionResult::philox).
  std::optional<PhiloxState> dropout_state;
};

/// This rank's out [B, Hq, L_r, Ev] (query dtype) and logsumexp [B, Hq, L_r] (float32) of
/// attention over the whole sequence, the dropout state used (philox) and the backend
/// that ran this rank's pieces (ERROR when it had none). q [B, Hq, L_r, E],
/// k [B, Hkv, L_r, E], v [B, Hkv, L_r, Ev]: this rank's slice, CPU, float32 / float16 /
/// bfloat16. Every rank of `comm` must call it with the same options. Throws sdpa::Error for invalid input (naming the argument) before any
/// communication where it can; MPI errors follow the communicator's error handler (by
/// default they abort the job: a rank that dies makes mpirun end every other rank).
AttentionResult context_parallel_attention(MPI_Comm comm, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const ContextParallelOptions& options);

/// Gradients of context_parallel_attention for this rank's slices, given grad_out and the
/// forward's out and lse (and, with dropout, options.dropout_state = the forward's
/// philox). Returns grad_q / grad_k / grad_v shaped and typed like q / k / v.
AttentionGradients context_parallel_attention_backward(MPI_Comm comm, const Tensor& grad_out,
                                                       const Tensor& q, const Tensor& k,
                                                       const Tensor& v, const Tensor& out,
                                                       const Tensor& lse,
                                                       const ContextParallelOptions& options);

}  // namespace sdpa::distributed
