// The ring forward and backward of context_parallel_mpi.h over MPI point-to-point
// messages.

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <string>

#include "distributed/pieces.h"
#include "sdpa/backend.h"
#include "sdpa/context_parallel_mpi.h"
#include "sdpa/error.h"

namespace sdpa::distributed {
namespace {

// Messages of at most 1 GiB (MPI counts are int), at most kTagsPerTensor of them per
// tensor (MPI guarantees tags up to 32767).
constexpr int64_t kMessageBytes = int64_t{1} << 30;
constexpr int kTagsPerTensor = 4096;

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  detail::throw_error("context_parallel_attention: ", what, " failed: ",
                      std::string(text, static_cast<size_t>(length)));
}

// One call's communicator, slice lengths and segments.
class Ring {
 public:
  Ring(MPI_Comm comm, int64_t q_len, int64_t kv_len, const ContextParallelOptions& options)
      : comm_(comm), options_(options) {
    check_mpi(MPI_Comm_rank(comm, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm, &world_), "MPI_Comm_size");
    const int64_t mine[2] = {q_len, kv_len};
    std::vector<int64_t> all(2 * static_cast<size_t>(world_));
    check_mpi(MPI_Allgather(mine, 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, comm),
              "the exchange of slice lengths (MPI_Allgather)");
    for (int r = 0; r < world_; ++r) {
      q_lengths_.push_back(all[2 * r]);
      kv_lengths_.push_back(all[2 * r + 1]);
    }
    SDPA_CHECK(q_lengths_ == kv_lengths_, "context_parallel_attention: query and key/value "
               "slices must hold the same positions on every rank");
    int64_t total = 0;
    for (int64_t n : q_lengths_) total += n;
    total_ = total;
    // Every rank computes the same mask from the same options: all throw alike.
    mask_ = global_mask(options, total);
    q_segs_ = segments(options.layout, q_lengths_, rank_);
    for (int r = 0; r < world_; ++r) kv_segs_.push_back(segments(options.layout, kv_lengths_, r));
  }

  int world() const { return world_; }
  // The rank whose K/V slice this rank holds at ring step `step`.
  int owner(int step) const { return ((rank_ - step) % world_ + world_) % world_; }
  int64_t kv_len(int rank) const { return kv_lengths_[static_cast<size_t>(rank)]; }
  std::vector<Piece> pieces_of(int owner) const {
    return pieces(q_segs_, kv_segs_[static_cast<size_t>(owner)], mask_);
  }
  // The options of one piece's call; with dropout, it draws its weights at their places
  // in the whole [T, T] attention.
  SDPAOptions call_options(const Piece& piece, const PhiloxState& dropout_state) const {
    SDPAOptions o;
    if (piece.mask) o.attn_mask = piece.mask;
    o.scale = options_.scale;
    o.enable_gqa = options_.enable_gqa;
    if (options_.dropout_p > 0.0) {
      o.dropout_p = options_.dropout_p;
      o.dropout_state = dropout_state;
      o.dropout_position = DropoutPosition{piece.q_start, piece.k_start, total_, total_};
    }
    return o;
  }

  // The dropout state of a forward: the given one, or rank 0's draw sent to every rank.
  PhiloxState forward_dropout_state() const {
    if (!(options_.dropout_p > 0.0)) return {};
    if (options_.dropout_state) return *options_.dropout_state;
    uint64_t state[2] = {0, 0};
    if (rank_ == 0) {
      Generator& gen = options_.generator ? *options_.generator : default_generator();
      const PhiloxState drawn = gen.next();
      state[0] = drawn.seed;
      state[1] = drawn.offset;
    }
    check_mpi(MPI_Bcast(state, 2, MPI_UINT64_T, 0, comm_),
              "the broadcast of the dropout state (MPI_Bcast)");
    return {state[0], state[1]};
  }

  // Posts the sends of `tensors` (contiguous) to the next rank and the receives of the
  // previous rank's, shaped alike with `recv_len` rows along dim 2; returns the receive
  // buffers. wait() completes them.
  std::vector<Tensor> post(const std::vector<Tensor>& tensors, int64_t recv_len) {
    std::vector<Tensor> received;
    const int next = (rank_ + 1) % world_, prev = (rank_ + world_ - 1) % world_;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      Tensor buf = Tensor::empty({t.size(0), t.size(1), recv_len, t.size(3)}, t.dtype());
      // Tensor i's messages take tags from i * kTagsPerTensor: a sender and its receiver
      // agree whatever the other tensors' sizes (an empty slice sends nothing).
      const int tag = static_cast<int>(i) * kTagsPerTensor;
      transfer(t, next, tag, true);
      transfer(buf, prev, tag, false);
      received.push_back(std::move(buf));
    }
    return received;
  }

  void wait() {
    check_mpi(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(),
                          MPI_STATUSES_IGNORE),
              "a ring exchange (MPI_Waitall)");
    requests_.clear();
  }

 private:
  // Posts t's bytes in messages of at most kMessageBytes with tags from `tag` on.
  void transfer(const Tensor& t, int peer, int tag, bool send) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(element_size(t.dtype()));
    SDPA_CHECK(bytes <= kMessageBytes * kTagsPerTensor, "context_parallel_attention: a ",
               bytes, "-byte slice exceeds the ring's ", kMessageBytes * kTagsPerTensor,
               "-byte messages");
    char* data = static_cast<char*>(t.data_ptr());
    for (int64_t at = 0; at < bytes; at += kMessageBytes, ++tag) {
      const int count = static_cast<int>(std::min(kMessageBytes, bytes - at));
      MPI_Request request;
      check_mpi(send ? MPI_Isend(data + at, count, MPI_BYTE, peer, tag, comm_, &request)
                     : MPI_Irecv(data + at, count, MPI_BYTE, peer, tag, comm_, &request),
                send ? "MPI_Isend" : "MPI_Irecv");
      requests_.push_back(request);
    }
  }

  MPI_Comm comm_;
  ContextParallelOptions options_;
  int rank_ = 0, world_ = 1;
  int64_t total_ = 0;
  GlobalMask mask_;
  std::vector<int64_t> q_lengths_, kv_lengths_;
  std::vector<Segment> q_segs_;
  std::vector<std::vector<Segment>> kv_segs_;
  std::vector<MPI_Request> requests_;
};

// Checks every rank makes alike before any message, so that none is left waiting for a
// rank that threw.
void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v,
                  const ContextParallelOptions& options) {
  SDPA_CHECK(options.dropout_p >= 0.0 && options.dropout_p <= 1.0,
             "context_parallel_attention: dropout_p: expected a probability in [0, 1], got ",
             options.dropout_p);
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    SDPA_CHECK(t->dim() == 4, "context_parallel_attention: ", name,
               ": expected [B, H, L_r, E], got ", t->describe());
    SDPA_CHECK(t->device().type == DeviceType::kCPU, "context_parallel_attention: ", name,
               ": expected a CPU tensor, got ", t->describe());
  }
  SDPA_CHECK(q.dtype() != DType::kFloat64, "context_parallel_attention: q: float64 is not "
             "supported (FLASH's float64 backward recomputes row statistics instead of "
             "taking the global logsumexp); got ", q.describe());
}

// dst (a view of a contiguous float32 tensor, [B, H, rows, E]) += src.
void add_into(const Tensor& dst, const Tensor& src) {
  const Tensor s = src.to(DType::kFloat32);
  const float* in = s.data<float>();
  float* base = dst.data<float>();
  const int64_t B = dst.size(0), H = dst.size(1), R = dst.size(2), E = dst.size(3);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t r = 0; r < R; ++r) {
        float* row = base + b * dst.stride(0) + h * dst.stride(1) + r * dst.stride(2);
        const float* from = in + ((b * H + h) * R + r) * E;
        for (int64_t e = 0; e < E; ++e) row[e] += from[e];
      }
    }
  }
}

}  // namespace

AttentionResult context_parallel_attention(MPI_Comm comm, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const ContextParallelOptions& options) {
  check_inputs(q, k, v, options);
  Ring ring(comm, q.size(2), k.size(2), options);
  const PhiloxState dropout_state = ring.forward_dropout_state();
  SDPBackend backend = SDPBackend::ERROR;
  Tensor out = Tensor::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, DType::kFloat32);
  Tensor lse = Tensor::full({q.size(0), q.size(1), q.size(2)},
                            -std::numeric_limits<double>::infinity(), DType::kFloat32);
  Tensor keys = k.contiguous(), values = v.contiguous();
  for (int step = 0; step < ring.world(); ++step) {
    std::vector<Tensor> next;  // the next slice travels while this one is used
    if (step + 1 < ring.world()) next = ring.post({keys, values}, ring.kv_len(ring.owner(step + 1)));
    for (const Piece& p : ring.pieces_of(ring.owner(step))) {
      const AttentionResult part = scaled_dot_product_attention_with_lse(
          q.slice(2, p.q0, p.q1), keys.slice(2, p.k0, p.k1), values.slice(2, p.k0, p.k1),
          ring.call_options(p, dropout_state));
      Tensor out_rows = out.slice(2, p.q0, p.q1), lse_rows = lse.slice(2, p.q0, p.q1);
      const AttentionState merged = merge_attention_states(
          out_rows, lse_rows, part.out.to(DType::kFloat32), part.lse);
      out_rows.copy_(merged.out);
      lse_rows.copy_(merged.lse);
      backend = part.backend;
    }
    if (!next.empty()) {
      ring.wait();
      keys = next[0];
      values = next[1];
    }
  }
  AttentionResult result;
  result.out = out.to(q.dtype());
  result.lse = lse;
  result.backend = backend;
  result.philox = dropout_state;
  return result;
}

AttentionGradients context_parallel_attention_backward(MPI_Comm comm, const Tensor& grad_out,
                                                       const Tensor& q, const Tensor& k,
                                                       const Tensor& v, const Tensor& out,
                                                       const Tensor& lse,
                                                       const ContextParallelOptions& options) {
  check_inputs(q, k, v, options);
  SDPA_CHECK(!(options.dropout_p > 0.0) || options.dropout_state,
             "context_parallel_attention_backward: options.dropout_state: the backward of a "
             "call with dropout needs the forward's state (its AttentionResult::philox)");
  Ring ring(comm, q.size(2), k.size(2), options);
  const PhiloxState dropout_state = options.dropout_state.value_or(PhiloxState{});
  Tensor dq = Tensor::zeros(q.sizes(), DType::kFloat32);
  Tensor dk = Tensor::zeros(k.sizes(), DType::kFloat32);
  Tensor dv = Tensor::zeros(v.sizes(), DType::kFloat32);
  Tensor keys = k.contiguous(), values = v.contiguous();
  // FLASH computes each piece's probabilities from the given (global) logsumexp.
  const sdpa_kernel flash(SDPBackend::FLASH_ATTENTION);
  for (int step = 0; step < ring.world(); ++step) {
    for (const Piece& p : ring.pieces_of(ring.owner(step))) {
      const AttentionGradients g = scaled_dot_product_attention_backward(
          grad_out.slice(2, p.q0, p.q1), q.slice(2, p.q0, p.q1), keys.slice(2, p.k0, p.k1),
          values.slice(2, p.k0, p.k1), out.slice(2, p.q0, p.q1), lse.slice(2, p.q0, p.q1),
          ring.call_options(p, dropout_state));
      add_into(dq.slice(2, p.q0, p.q1), g.grad_q);
      add_into(dk.slice(2, p.k0, p.k1), g.grad_k);
      add_into(dv.slice(2, p.k0, p.k1), g.grad_v);
    }
    if (ring.world() == 1) break;
    // The slice and its gradients move on; after the last step only the gradients
    // travel, back to their owner.
    const bool last = step + 1 == ring.world();
    const int64_t len = ring.kv_len(ring.owner(step + 1));
    std::vector<Tensor> received =
        last ? ring.post({dk, dv}, len) : ring.post({keys, values, dk, dv}, len);
    ring.wait();
    if (last) {
      dk = received[0];
      dv = received[1];
    } else {
      keys = received[0];
      values = received[1];
      dk = received[2];
      dv = received[3];
    }
  }
  AttentionGradients grads;
  grads.grad_q = dq.to(q.dtype());
  grads.grad_k = dk.to(k.dtype());
  grads.grad_v = dv.to(v.dtype());
  grads.backend = SDPBackend::FLASH_ATTENTION;
  return grads;
}

}  // namespace sdpa::distributed
