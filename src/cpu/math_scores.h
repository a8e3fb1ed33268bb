#pragma once
// MATH's building blocks, shared by its forward (math.cpp) and flex's max_scores pass
// (max_scores.cpp): one (batch, query head) per loop item, and one full score row.

#include <optional>

#include "core/parallel.h"
#include "core/threading.h"
#include "cpu/kernels.h"
#include "cpu/mask_rows.h"
#include "sdpa/params.h"

namespace sdpa::cpu {

/// Runs fn(bh, buffers) for every bh = b * Hq + h, over a team sized by the forward's
/// work; each thread builds its own Buffers(p). The first sdpa::Error (or allocation
/// failure) of any thread is rethrown after the region.
template <class Buffers, class Fn>
void for_each_query_head(const AttentionParams& p, Fn&& fn) {
  detail::ParallelErrors errors;
  const int threads =
      detail::ThreadingContext::current().threads_for(p.batch * p.num_heads_q, forward_work(p));
  detail::run_region(threads, [&] {
    std::optional<Buffers> buf;
    errors.guard([&] { buf.emplace(p); });
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < p.batch * p.num_heads_q; ++bh) {
      if (buf) errors.guard([&] { fn(bh, *buf); });
    }
  });
  errors.rethrow();
}

/// s[j] for every key j < S: q . k_j * scale with the call's biases, score_mod and masks
/// applied (masked scores are -inf). q: [E]; keys: [S, E] rows of the query's kv head.
template <typename Acc>
void masked_score_row(const AttentionParams& p, const HeadMasking& masking, int64_t i,
                      const Acc* q, const Acc* keys, Acc* s) {
  const int64_t E = p.head_dim_qk;
  const Acc scale = static_cast<Acc>(p.scale);
  for (int64_t j = 0; j < p.kv_len; ++j) {
    Acc dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += q[e] * keys[j * E + e];
    s[j] = dot * scale;
  }
  mask_score_row(masking, i, s);
}

}  // namespace sdpa::cpu
