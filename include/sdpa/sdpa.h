#pragma once
// The public entry point: scaled dot-product attention with PyTorch's semantics,
// served by the best available backend.

#include <string>
#include <vector>

#include "sdpa/attn_bias.h"
#include "sdpa/backend.h"
#include "sdpa/error.h"
#include "sdpa/generator.h"
#include "sdpa/params.h"
#include "sdpa/tensor.h"
#include "sdpa/threading.h"

namespace sdpa {

/// Where one call's scores lie in a larger attention whose dropout mask it must draw:
/// context parallelism splits a call of [B, Hq, q_len, kv_len] scores into blocks of
/// queries x keys on several processes, and each block drops exactly the weights the
/// whole call would. Score (b, h, i, j) of the call draws as (b, h, q_offset + i,
/// kv_offset + j) of [B, Hq, q_len, kv_len]; the call's L and S must fit inside.
struct DropoutPosition {
  int64_t q_offset = 0;
  int64_t kv_offset = 0;
  int64_t q_len = 0;   ///< The whole call's L (>= q_offset + this call's L).
  int64_t kv_len = 0;  ///< The whole call's S (>= kv_offset + this call's S).
};

/// Options of one call; the names and defaults are
/// torch.nn.functional.scaled_dot_product_attention's.
struct SDPAOptions {
  /// None; a tensor broadcastable to [B, Hq, L, S] (bool, true = the key takes part, or
  /// float of the query dtype, added to the scores); or any AttnBias (attn_bias.h).
  AttnMask attn_mask;
  /// Probability in [0, 1] of dropping an attention weight (1: every weight; out = 0).
  double dropout_p = 0.0;
  /// Causal mask aligned top-left (query i sees keys j <= i). Error with attn_mask.
  bool is_causal = false;
  /// Score multiplier; 1/sqrt(E) when absent. Must be finite.
  std::optional<double> scale;
  /// Allows Hq to be a multiple of Hkv (grouped-query attention).
  bool enable_gqa = false;
  /// Dropout randomness; the default generator when null.
  Generator* generator = nullptr;
  /// Dropout state to replay instead of drawing from `generator`: a backward call passes
  /// the forward's AttentionResult::philox so both see the same mask.
  std::optional<PhiloxState> dropout_state;
  /// Dropout drawn as part of a larger call (context parallelism); absent: the call is
  /// whole. The backward must pass the forward's. CPU backends only.
  std::optional<DropoutPosition> dropout_position;
  /// Backward only: the float attn_mask needs a gradient (grad_attn_mask is returned).
  bool attn_mask_requires_grad = false;
  /// MATH computes a float16 / bfloat16 forward in its own dtype for this call, as with
  /// backends::allow_fp16_bf16_reduction_math_sdp(true) (either one turns it on).
  bool allow_fp16_bf16_reduction_math = false;
  /// CUDA tensors: the cudaStream_t the call's work is queued on (outputs are allocated
  /// and written in its order; nothing waits for it). Null is the legacy default stream.
  /// Ignored for CPU tensors.
  void* stream = nullptr;
};

/// Output of an attention call.
struct AttentionResult {
  Tensor out;  ///< [B, Hq, L, Ev] (or [Hq, L, Ev] for 3-D inputs), query dtype, contiguous.
  Tensor lse;  ///< logsumexp of the scaled, masked scores, float32 [B, Hq, L]; -inf on fully
               ///< masked rows.
  SDPBackend backend = SDPBackend::ERROR;  ///< The backend that ran.
  PhiloxState philox;  ///< Dropout state used (pass as dropout_state to the backward).
};

/// Gradients of an attention call, each shaped and typed like its input.
struct AttentionGradients {
  Tensor grad_q;          ///< [B, Hq, L, E]
  Tensor grad_k;          ///< [B, Hkv, S, E], summed over the query heads of each group
  Tensor grad_v;          ///< [B, Hkv, S, Ev]
  Tensor grad_attn_mask;  ///< the attn_mask's shape (summed over broadcast dimensions);
                          ///< undefined unless attn_mask_requires_grad
  /// flex_attention only: gradients of the score_mod's captured tensors, in
  /// Program::captured() order (undefined for tensors that do not require grad).
  std::vector<Tensor> grad_captured;
  SDPBackend backend = SDPBackend::ERROR;  ///< The backend that ran.
};

/// Returns softmax(q k^T * scale + mask) v, with q [B, Hq, L, E], k [B, Hkv, S, E],
/// v [B, Hkv, S, Ev] (or 3-D without B), any strides, dtype float32/float64/bfloat16/
/// float16. Also, as PyTorch: q [*, L, E] with 0 to 6 leading dimensions, and k/v whose
/// leading dimensions broadcast against q's (out takes q's shape; docs/semantics.md).
/// Fully masked rows give zeros. Throws sdpa::Error for invalid input (naming the
/// argument, expected and actual) and when no allowed backend supports the call (listing
/// every backend's reasons).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const SDPAOptions& options = {});

/// As scaled_dot_product_attention, also returning the logsumexp and the backend used.
AttentionResult scaled_dot_product_attention_with_lse(const Tensor& q, const Tensor& k,
                                                      const Tensor& v,
                                                      const SDPAOptions& options = {});

/// Returns the gradients of scaled_dot_product_attention with respect to q, k, v (and a
/// float attn_mask when options.attn_mask_requires_grad), given grad_out and the forward's
/// out [B, Hq, L, Ev] and lse [B, Hq, L] (float32). `options` must equal the forward's;
/// with dropout, options.dropout_state must be the forward's AttentionResult::philox.
/// Algorithm: FlashAttention-2's backward (Dao, 2023): P recomputed from lse,
/// dS = P o (dP - rowsum(dO o O)). Throws sdpa::Error for invalid or inconsistent input.
AttentionGradients scaled_dot_product_attention_backward(const Tensor& grad_out,
                                                         const Tensor& q, const Tensor& k,
                                                         const Tensor& v, const Tensor& out,
                                                         const Tensor& lse,
                                                         const SDPAOptions& options = {});

/// Makes every backend choose a deterministic algorithm (PyTorch's
/// torch.use_deterministic_algorithms). Every CPU path is deterministic regardless; the
/// flag matters for GPU backends that accumulate with atomics (see docs/semantics.md).
void use_deterministic_algorithms(bool enabled);
bool are_deterministic_algorithms_enabled();

/// Validates the inputs and normalizes them into AttentionParams (4-D views, the mask as
/// a native descriptor, the default scale, dropout state drawn from the generator when
/// dropout_p > 0). q, k, v: 3-D or 4-D of one rank (scaled_dot_product_attention and its
/// backward first reduce other ranks and broadcast k/v to that form). Throws sdpa::Error
/// for invalid input.
AttentionParams make_params(const Tensor& q, const Tensor& k, const Tensor& v,
                            const SDPAOptions& options = {});

/// make_params for a backward call (params.backward set); also validates grad_out, out and
/// lse against the inputs and requires options.dropout_state when dropout_p > 0.
AttentionParams make_backward_params(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                     const SDPAOptions& options = {});

/// Reasons a backend rejects a call, collected only when asked for.
struct Reasons {
  bool collect = true;
  std::vector<std::string> items;
  /// Appends the concatenation of `parts` (strings and string literals). Selection runs
  /// the checks with collect = false on every call: nothing is built then.
  template <class... Parts>
  void add(const Parts&... parts) {
    if (collect) items.push_back((std::string() + ... + parts));
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
  /// How this backend would take the call's attn_mask: "native: ...",
  /// "materialized: ..." or empty when the call has none.
  std::string bias_handling;
  /// How this backend expresses the call, for backends that lower it (CUDNN_ATTENTION:
  /// a flex score_mod as cuDNN pointwise nodes, or why it cannot), and how MATH and
  /// FLASH_ATTENTION use a flex BlockMask (blocks skipped, or every score masked per
  /// element); empty otherwise.
  std::string lowering;
};

/// The choice for a call and every backend's verdict, in priority order.
struct Explanation {
  SDPBackend chosen = SDPBackend::ERROR;
  std::vector<BackendVerdict> verdicts;
  /// Flex calls: the score_mod program and the BlockMask's block picture and sparsity.
  std::string flex;
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
