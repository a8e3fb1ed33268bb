#pragma once
// Attention biases that fused kernels run natively (the "Scaled Dot Product Attention API
// Changes" RFC's AttnBias, extended): each lowers to the native MaskDescriptor instead of
// a dense [L, S] tensor; materialize() gives the dense equivalent for any backend.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sdpa/params.h"
#include "sdpa/tensor.h"

namespace sdpa {

/// Sizes of the call a bias is applied to: scores are [batch, num_heads_q, q_len, kv_len].
struct BiasShape {
  int64_t batch = 1;
  int64_t num_heads_q = 1;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  Shape scores() const { return {batch, num_heads_q, q_len, kv_len}; }
};

/// Base of every attention bias.
class AttnBias {
 public:
  virtual ~AttnBias() = default;

  /// The dense equivalent, broadcastable to shape.scores(): bool (true = take part) or an
  /// additive float tensor of `dtype` (-inf = masked). Any backend can run this.
  virtual Tensor materialize(const BiasShape& shape, DType dtype) const = 0;

  /// True when lower() cannot describe the bias, so every backend uses materialize().
  /// The default, so a user bias that only implements materialize() works everywhere.
  virtual bool needs_materialization() const { return true; }

  /// Adds this bias to the native descriptor (the RFC's dispatch). Called only when
  /// needs_materialization() is false. Throws sdpa::Error when the bias does not fit the
  /// call (e.g. lengths differ) or conflicts with what `mask` already holds.
  virtual void lower(const BiasShape& shape, MaskDescriptor& mask) const;

  /// One line for explain(), e.g. "causal lower-right (L=7, S=9)".
  virtual std::string describe() const = 0;
};

using AttnBiasPtr = std::shared_ptr<const AttnBias>;

/// What SDPAOptions::attn_mask holds: nothing, a tensor, or any AttnBias. Implicitly
/// constructible from both, so `options.attn_mask = tensor` and
/// `options.attn_mask = causal_lower_right(L, S)` both work.
class AttnMask {
 public:
  AttnMask() = default;
  AttnMask(Tensor mask);  // NOLINT(google-explicit-constructor)
  AttnMask(AttnBiasPtr bias) : bias_(std::move(bias)) {}  // NOLINT
  template <typename B>
    requires std::derived_from<B, AttnBias>
  AttnMask(std::shared_ptr<B> bias) : bias_(std::move(bias)) {}  // NOLINT

  bool defined() const { return bias_ != nullptr; }
  const AttnBiasPtr& bias() const { return bias_; }
  /// The tensor when this holds a TensorBias, else undefined.
  Tensor tensor() const;
  std::string describe() const { return bias_ ? bias_->describe() : "none"; }

 private:
  AttnBiasPtr bias_;
};

/// A dense mask tensor: bool (true = take part) or additive float of the query dtype,
/// broadcastable to [B, Hq, L, S] ([Hq, L, S] for unbatched calls). Lowers to the
/// descriptor's dense slot: the one materialized kind.
class TensorBias : public AttnBias {
 public:
  explicit TensorBias(Tensor mask);
  const Tensor& tensor() const { return mask_; }
  Tensor materialize(const BiasShape& shape, DType dtype) const override;
  bool needs_materialization() const override { return false; }
  void lower(const BiasShape& shape, MaskDescriptor& mask) const override;
  std::string describe() const override;

 private:
  Tensor mask_;
};

/// PyTorch's torch.nn.attention.bias.CausalVariant (same values).
enum class CausalVariant { UPPER_LEFT = 1, LOWER_RIGHT = 2 };

/// Causal mask for q_len x kv_len scores. UPPER_LEFT: query i sees keys j <= i.
/// LOWER_RIGHT: the diagonal ends at the bottom-right corner, query i sees
/// j <= i + kv_len - q_len (rows with no key give zeros when q_len > kv_len).
class CausalBias : public AttnBias {
 public:
  /// Throws sdpa::Error for negative lengths.
  CausalBias(CausalVariant variant, int64_t q_len, int64_t kv_len);
  CausalVariant variant() const { return variant_; }
  Tensor materialize(const BiasShape& shape, DType dtype) const override;
  bool needs_materialization() const override { return false; }
  void lower(const BiasShape& shape, MaskDescriptor& mask) const override;
  std::string describe() const override;

 private:
  CausalVariant variant_;
  int64_t q_len_, kv_len_;
};

/// PyTorch's causal_upper_left / causal_lower_right factories.
std::shared_ptr<CausalBias> causal_upper_left(int64_t q_len, int64_t kv_len);
std::shared_ptr<CausalBias> causal_lower_right(int64_t q_len, int64_t kv_len);

/// Sliding-window (local) attention, FlashAttention's window_size semantics: query i sees
/// keys j with i + d - left <= j <= i + d + right, d = kv_len - q_len for bottom-right
/// alignment (FlashAttention's) or 0 for top-left; an absent bound is unbounded.
/// left = W, right = 0 is causal sliding-window attention over W + 1 keys.
class LocalAttentionBias : public AttnBias {
 public:
  /// Throws sdpa::Error for a negative bound.
  LocalAttentionBias(std::optional<int64_t> left, std::optional<int64_t> right,
                     DiagonalAlignment alignment = DiagonalAlignment::kBottomRight);
  Tensor materialize(const BiasShape& shape, DType dtype) const override;
  bool needs_materialization() const override { return false; }
  void lower(const BiasShape& shape, MaskDescriptor& mask) const override;
  std::string describe() const override;

 private:
  DiagonalBand band_;
};

/// ALiBi (Press et al., "Train Short, Test Long", ICLR 2022): adds
/// -slope[h] * |i + d - j| to the scores, d as in LocalAttentionBias (FlashAttention's
/// alibi_slopes convention; with a causal mask this is slope * (j - i - d)).
class AlibiBias : public AttnBias {
 public:
  /// The standard geometric slopes for `num_heads` heads (the paper's recipe, including
  /// its interpolation for head counts that are not powers of two).
  explicit AlibiBias(int64_t num_heads,
                     DiagonalAlignment alignment = DiagonalAlignment::kBottomRight);
  /// Given slopes, one per query head. Throws sdpa::Error when empty or non-finite.
  explicit AlibiBias(std::vector<float> slopes,
                     DiagonalAlignment alignment = DiagonalAlignment::kBottomRight);
  const std::vector<float>& slopes() const { return slopes_; }
  Tensor materialize(const BiasShape& shape, DType dtype) const override;
  bool needs_materialization() const override { return false; }
  void lower(const BiasShape& shape, MaskDescriptor& mask) const override;
  std::string describe() const override;

 private:
  std::vector<float> slopes_;
  DiagonalAlignment alignment_;
};

/// The most heads alibi_slopes (and AlibiBias(num_heads)) takes: far beyond any model, and
/// a bound on the slope table's memory (4 MiB).
inline constexpr int64_t kMaxAlibiHeads = int64_t{1} << 20;

/// The standard ALiBi slopes for `num_heads` heads. Throws sdpa::Error unless
/// 1 <= num_heads <= kMaxAlibiHeads.
std::vector<float> alibi_slopes(int64_t num_heads);

/// Packed variable-length documents (xFormers' BlockDiagonalMask, FlashAttention's varlen):
/// queries [cu_seqlens_q[d], cu_seqlens_q[d+1]) attend only to keys
/// [cu_seqlens_kv[d], cu_seqlens_kv[d+1]); optionally causal inside each document
/// (aligned as given: top-left is xFormers' BlockDiagonalCausalMask, bottom-right its
/// BlockDiagonalCausalFromBottomRightMask). Only its own causal band is measured inside
/// the document; other biases composed with it keep their own frame (a CausalBias or
/// LocalAttentionBias counts from the whole [L, S], PaddedKeysBias from the valid keys),
/// so the composition is the intersection of its parts' materializations.
class BlockDiagonalBias : public AttnBias {
 public:
  /// cu_seqlens_* start at 0 and are non-decreasing with the same number of documents;
  /// empty cu_seqlens_kv means the same as cu_seqlens_q. Throws sdpa::Error otherwise.
  BlockDiagonalBias(std::vector<int64_t> cu_seqlens_q, std::vector<int64_t> cu_seqlens_kv = {},
                    bool causal = false,
                    DiagonalAlignment alignment = DiagonalAlignment::kTopLeft);
  /// From per-document lengths instead of cumulative offsets.
  static std::shared_ptr<BlockDiagonalBias> from_seqlens(
      const std::vector<int64_t>& q_seqlens, const std::vector<int64_t>& kv_seqlens = {},
      bool causal = false, DiagonalAlignment alignment = DiagonalAlignment::kTopLeft);
  Tensor materialize(const BiasShape& shape, DType dtype) const override;
  bool needs_materialization() const override { return false; }
  void lower(const BiasShape& shape, MaskDescriptor& mask) const override;
  std::string describe() const override;

 private:
  std::vector<int64_t> cu_q_, cu_kv_;
  std::optional<DiagonalBand> band_;
};

/// Right-padded keys: batch b has kv_lengths[b] valid keys; the rest are masked. With
/// `causal`, query i also sees only keys j <= i + kv_lengths[b] - q_len (bottom-right
/// aligned to the last valid key: decoding against a padded KV cache, FlashAttention's
/// cache_seqlens).
class PaddedKeysBias : public AttnBias {
 public:
  /// Throws sdpa::Error for a negative length.
  explicit PaddedKeysBias(std::vector<int64_t> kv_lengths, bool causal = false);
  Tensor materialize(const BiasShape& shape, DType dtype) const override;
  bool needs_materialization() const override { return false; }
  void lower(const BiasShape& shape, MaskDescriptor& mask) const override;
  std::string describe() const override;

 private:
  std::vector<int64_t> kv_lengths_;
  bool causal_;
};

/// Several biases at once (masks intersect, additive terms add), e.g. documents + causal
/// + ALiBi + padding, lowered without materializing when every part can be. Every part is
/// checked against the call (documents covering L and S, lengths per batch...) whether the
/// composition runs natively or is materialized.
class ComposedBias : public AttnBias {
 public:
  /// Throws sdpa::Error when `parts` is empty or holds a null.
  explicit ComposedBias(std::vector<AttnBiasPtr> parts);
  const std::vector<AttnBiasPtr>& parts() const { return parts_; }
  Tensor materialize(const BiasShape& shape, DType dtype) const override;
  bool needs_materialization() const override;
  void lower(const BiasShape& shape, MaskDescriptor& mask) const override;
  std::string describe() const override;

 private:
  std::vector<AttnBiasPtr> parts_;
};

/// ComposedBias of `parts`.
std::shared_ptr<ComposedBias> compose(std::vector<AttnBiasPtr> parts);

}  // namespace sdpa
