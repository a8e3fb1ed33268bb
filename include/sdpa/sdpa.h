#pragma once
// The public entry point: scaled dot-product attention with PyTorch's semantics,
// served by the best available backend.

#include <string>
#include <vector>

#include "sdpa/backend.h"
#include "sdpa/error.h"
#include "sdpa/generator.h"
#include "sdpa/params.h"
#include "sdpa/tensor.h"

namespace sdpa {

/// Options of one call; the names and defaults are
/// torch.nn.functional.scaled_dot_product_attention's.
struct SDPAOptions {
  /// Undefined, or broadcastable to [B, Hq, L, S]: bool (true = the key takes part) or
  /// float of the query dtype (added to the scores).
  Tensor attn_mask;
  /// Probability in [0, 1) of dropping an attention weight.
  double dropout_p = 0.0;
  /// Causal mask aligned top-left (query i sees keys j <= i). Error with attn_mask.
  bool is_causal = false;
  /// Score multiplier; 1/sqrt(E) when absent. Must be finite.
  std::optional<double> scale;
  /// Allows Hq to be a multiple of Hkv (grouped-query attention).
  bool enable_gqa = false;
  /// Dropout randomness; the default generator when null.
  Generator* generator = nullptr;
};

/// Output of an attention call.
struct AttentionResult {
  Tensor out;  ///< [B, Hq, L, Ev] (or [Hq, L, Ev] for 3-D inputs), query dtype, contiguous.
  Tensor lse;  ///< logsumexp of the scaled, masked scores, float32 [B, Hq, L]; -inf on fully
               ///< masked rows.
  SDPBackend backend = SDPBackend::ERROR;  ///< The backend that ran.
};

/// Returns softmax(q k^T * scale + mask) v, with q [B, Hq, L, E], k [B, Hkv, S, E],
/// v [B, Hkv, S, Ev] (or 3-D without B), any strides, dtype float32/float64/bfloat16/
/// float16. Fully masked rows give zeros. Throws sdpa::Error for invalid input (naming the
/// argument, expected and actual) and when no allowed backend supports the call (listing
/// every backend's reasons).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SDPAOptions& options = {});

/// As scaled_dot_product_attention, also returning the logsumexp and the backend used.
AttentionResult scaled_dot_product_attention_with_lse(const Tensor& q, const Tensor& k,
                                                      const Tensor& v,
                                                      const SDPAOptions& options = {});

/// Validates the inputs and normalizes them into AttentionParams (4-D views, the mask as
/// a native descriptor, the default scale, dropout state drawn from the generator when
/// dropout_p > 0). Throws sdpa::Error for invalid input.
AttentionParams make_params(const Tensor& q, const Tensor& k, const Tensor& v,
                            const SDPAOptions& options = {});

/// Reasons a backend rejects a call, collected only when asked for.
struct Reasons {
  bool collect = true;
  std::vector<std::string> items;
  void add(std::string reason) {
    if (collect) items.push_back(std::move(reason));
  }
};

/// True when `backend` is built, allowed for the calling thread, and supports `params`;
/// otherwise false with the reasons appended to `reasons` (when non-null).
bool can_use(SDPBackend backend, const AttentionParams& params, Reasons* reasons = nullptr);

/// One backend's verdict on a call.
struct BackendVerdict {
  SDPBackend backend;
  bool allowed;   ///< Permitted by the sdpa_kernel guard / enable flags.
  bool supported; ///< Every check passed.
  std::vector<std::string> reasons;  ///< Why not, when !allowed or !supported.
};

/// The choice for a call and every backend's verdict, in priority order.
struct Explanation {
  SDPBackend chosen = SDPBackend::ERROR;
  std::vector<BackendVerdict> verdicts;
  /// Multi-line text: "chosen: FLASH_ATTENTION", then "MATH: supported" or
  /// "EFFICIENT_ATTENTION is not supported because: ...".
  std::string to_string() const;
};

/// Runs every backend's checks on `params` and reports which one would run and why each
/// other was rejected. Never throws for an unsupported call.
Explanation explain(const AttentionParams& params);

/// Returns the backend that would run `params` (the first allowed, supporting backend in
/// priority order); throws sdpa::Error listing every backend's reasons when none fits.
SDPBackend select_backend(const AttentionParams& params);

/// Library version, "MAJOR.MINOR.PATCH".
std::string version();

}  // namespace sdpa
