#pragma once
// What the serving entry points share: the checks of SequenceOptions and the per-sequence
// attention call they run (mask, ALiBi, soft-cap as a flex score_mod), forward and
// backward, on [1, H, n, E] views of one sequence.

#include <cstdint>
#include <memory>
#include <optional>

#include "sdpa/flex.h"
#include "sdpa/sdpa.h"
#include "sdpa/sequence_options.h"

namespace sdpa::serving {

/// Checks the options for Hq query heads; throws sdpa::Error naming the option.
void check_sequence_options(const SequenceOptions& o, int64_t num_heads_q);

/// One sequence's attention: the options' band and ALiBi for q_len x kv_len, their scale,
/// GQA when the head counts differ, and the soft-cap program (none when softcap is 0; it
/// adds the ALiBi term after capping when both are given).
struct SequenceCall {
  SDPAOptions options;
  std::optional<flex::Program> softcap;

  /// q [1, Hq, q_len, E], k/v [1, Hkv, kv_len, E/Ev] views of the sequence.
  SequenceCall(const SequenceOptions& o, int64_t q_len, int64_t kv_len, bool gqa);
  /// Validates the call (shapes, mask sizes) without running it; `dequant` as in forward.
  void check(const Tensor& q, const Tensor& k, const Tensor& v,
             const std::shared_ptr<const KvDequant>& dequant = nullptr) const;
  /// `pages`: k / v are views of a paged cache read through it (CacheLayout::rows);
  /// `dequant`: k / v are a float8_e4m3fn cache read with these scales.
  AttentionResult forward(const Tensor& q, const Tensor& k, const Tensor& v,
                          const std::shared_ptr<const KvPages>& pages = nullptr,
                          const std::shared_ptr<const KvDequant>& dequant = nullptr) const;
  AttentionGradients backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse) const;

 private:
  AttentionParams params(const Tensor& q, const Tensor& k, const Tensor& v,
                         const std::shared_ptr<const KvDequant>& dequant) const;
};

}  // namespace sdpa::serving
