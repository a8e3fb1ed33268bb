#pragma once
// Attention variants named on the command line (`--bias NAME`, `--flex NAME`) for
// `sdpa explain` and `sdpa bench`: an AttnBias, or a standard flex score_mod / mask_mod
// (sdpa/flex_mods.h) with its BlockMask, built for one call shape.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sdpa/flex_attention.h"

namespace sdpa::cli {

/// The variant named on the command line and the parameters it takes.
struct VariantOptions {
  std::string bias;          ///< --bias NAME, or empty
  std::string flex;          ///< --flex NAME, or empty
  int64_t window = 256;      ///< sliding window: keys q_idx - window .. q_idx
  int64_t doc_len = 512;     ///< documents: packed documents of this many tokens
  int64_t prefix_len = 256;  ///< prefix LM: visible prefix
  double soft_cap = 30.0;    ///< tanh soft-capping value
  int64_t block_size = 128;  ///< BlockMask block size
};

/// Names accepted by `--bias`: causal-upper-left, causal-lower-right, window, alibi,
/// documents, documents-causal, padding.
const std::vector<std::string>& bias_names();
/// Names accepted by `--flex`: causal, sliding-window, prefix-lm, documents (mask_mods
/// run through a BlockMask), alibi, relative-position, softcap (score_mods).
const std::vector<std::string>& flex_names();

/// Adds --bias, --flex, --window, --doc-len, --prefix-len, --soft-cap and --block-size
/// to `app`.
void add_variant_options(CLI::App& app, VariantOptions& options);

/// An AttnBias call variant.
struct BiasVariant {
  AttnBiasPtr bias;
  /// Fraction of the [B, L, S] score matrix the bias keeps (1 for additive biases).
  double density = 1.0;
};

/// The AttnBias `name` for a [batch, heads_q, q_len, kv_len] call; its density is counted
/// on its materialization for masks (B·L·S bytes). Padding keeps the first 3/4 of the
/// keys of every other batch entry. Throws UsageError for an unknown name or a shape the
/// variant cannot take (documents need L == S).
BiasVariant make_bias(const std::string& name, int64_t batch, int64_t heads_q, int64_t q_len,
                      int64_t kv_len, const VariantOptions& options);

/// A flex call's program and BlockMask.
struct FlexVariant {
  std::optional<flex::Program> score_mod;
  std::shared_ptr<const flex::BlockMask> block_mask;
  /// Fraction of the score matrix computed: the BlockMask's block density, else 1.
  double density() const { return block_mask ? block_mask->density() : 1.0; }
};

/// The standard flex variant `name` for a [batch, heads_q, q_len, kv_len] call.
/// Throws UsageError for an unknown name or a shape it cannot take.
FlexVariant make_flex(const std::string& name, int64_t batch, int64_t heads_q, int64_t q_len,
                      int64_t kv_len, const VariantOptions& options);

/// Puts `variant` into params built by make_params / make_backward_params, as
/// flex_attention does.
void add_flex(AttentionParams& params, const FlexVariant& variant);

}  // namespace sdpa::cli
