#include "variants.h"

#include <algorithm>

#include "common.h"
#include "sdpa/flex_mods.h"

namespace sdpa::cli {
namespace {

// Lengths of packed documents of `doc_len` tokens covering `n` (the last one shorter).
std::vector<int64_t> document_lengths(int64_t n, int64_t doc_len) {
  std::vector<int64_t> lengths;
  for (int64_t start = 0; start < n; start += doc_len) {
    lengths.push_back(std::min(doc_len, n - start));
  }
  return lengths;
}

void require_square(const std::string& name, int64_t q_len, int64_t kv_len) {
  if (q_len != kv_len) {
    throw UsageError(name + " needs L == S (packed documents), got L=" + std::to_string(q_len) +
                     ", S=" + std::to_string(kv_len));
  }
}

[[noreturn]] void unknown(const std::string& what, const std::string& name,
                          const std::vector<std::string>& names) {
  throw UsageError("unknown " + what + " '" + name + "' (expected one of: " + join(names) + ")");
}

}  // namespace

const std::vector<std::string>& bias_names() {
  static const std::vector<std::string> names = {
      "causal-upper-left", "causal-lower-right", "window", "alibi",
      "documents",         "documents-causal",   "padding"};
  return names;
}

const std::vector<std::string>& flex_names() {
  static const std::vector<std::string> names = {"causal",    "sliding-window", "prefix-lm",
                                                 "documents", "alibi",          "relative-position",
                                                 "softcap"};
  return names;
}

void add_variant_options(CLI::App& app, VariantOptions& o) {
  app.add_option("--bias", o.bias, "attn_mask as an AttnBias (" + join(bias_names()) + ")")
      ->check(CLI::IsMember(bias_names()));
  app.add_option("--flex", o.flex, "A standard flex mod (" + join(flex_names()) + ")")
      ->check(CLI::IsMember(flex_names()));
  app.add_option("--window", o.window, "Sliding window width W (window, sliding-window)")
      ->check(integer_in<int64_t>(0))
      ->capture_default_str();
  app.add_option("--doc-len", o.doc_len, "Packed document length (documents)")
      ->check(integer_in<int64_t>(1))
      ->capture_default_str();
  app.add_option("--prefix-len", o.prefix_len, "Visible prefix (prefix-lm)")
      ->check(integer_in<int64_t>(0))
      ->capture_default_str();
  app.add_option("--soft-cap", o.soft_cap, "Soft-capping value (softcap)")
      ->check(number_above(0.0))
      ->capture_default_str();
  app.add_option("--block-size", o.block_size, "BlockMask block size (flex mask_mods)")
      ->check(integer_in<int64_t>(1))
      ->capture_default_str();
}

namespace {

AttnBiasPtr bias_named(const std::string& name, int64_t batch, int64_t heads_q, int64_t q_len,
                       int64_t kv_len, const VariantOptions& o) {
  if (name == "causal-upper-left") return causal_upper_left(q_len, kv_len);
  if (name == "causal-lower-right") return causal_lower_right(q_len, kv_len);
  // The causal sliding window of Mistral / FlashAttention's window_size=(W, 0).
  if (name == "window") return std::make_shared<LocalAttentionBias>(o.window, 0);
  if (name == "alibi") return std::make_shared<AlibiBias>(heads_q);
  if (name == "documents" || name == "documents-causal") {
    require_square(name, q_len, kv_len);
    return BlockDiagonalBias::from_seqlens(document_lengths(q_len, o.doc_len), {},
                                           name == "documents-causal");
  }
  if (name == "padding") {
    std::vector<int64_t> lengths(static_cast<size_t>(batch), kv_len);
    for (size_t b = 1; b < lengths.size(); b += 2) lengths[b] = kv_len * 3 / 4;
    return std::make_shared<PaddedKeysBias>(std::move(lengths));
  }
  unknown("bias", name, bias_names());
}

}  // namespace

BiasVariant make_bias(const std::string& name, int64_t batch, int64_t heads_q, int64_t q_len,
                      int64_t kv_len, const VariantOptions& o) {
  BiasVariant v{bias_named(name, batch, heads_q, q_len, kv_len, o)};
  if (name == "alibi" || q_len * kv_len == 0) return v;
  const Tensor mask = v.bias->materialize({batch, 1, q_len, kv_len}, DType::kFloat32)
                          .expand({batch, 1, q_len, kv_len})
                          .contiguous();
  if (mask.dtype() != DType::kBool) return v;
  const bool* keep = mask.data<bool>();
  const int64_t n = mask.numel();
  v.density = static_cast<double>(std::count(keep, keep + n, true)) / static_cast<double>(n);
  return v;
}

FlexVariant make_flex(const std::string& name, int64_t batch, int64_t heads_q, int64_t q_len,
                      int64_t kv_len, const VariantOptions& o) {
  FlexVariant v;
  std::optional<flex::MaskMod> mask_mod;
  if (name == "causal") {
    mask_mod = flex::mods::causal();
  } else if (name == "sliding-window") {
    mask_mod = flex::mods::sliding_window(o.window);
  } else if (name == "prefix-lm") {
    mask_mod = flex::mods::prefix_lm(o.prefix_len);
  } else if (name == "documents") {
    require_square(name, q_len, kv_len);
    Tensor ids = Tensor::empty({q_len}, DType::kInt32);
    for (int64_t i = 0; i < q_len; ++i)
      ids.data<int32_t>()[i] = static_cast<int32_t>(i / o.doc_len);
    mask_mod = flex::mods::document(ids);
  } else if (name == "alibi") {
    const std::vector<float> slopes = alibi_slopes(heads_q);
    Tensor t = Tensor::empty({heads_q}, DType::kFloat32);
    std::copy(slopes.begin(), slopes.end(), t.data<float>());
    v.score_mod = flex::Program::from_score_mod(flex::mods::alibi(t));
  } else if (name == "relative-position") {
    // Every distance |q_idx - kv_idx| < max(L, S) indexes the table.
    const int64_t max_distance = std::max(q_len, kv_len);
    const Tensor table = randn({heads_q, 2 * max_distance + 1}, DType::kFloat32, 7);
    v.score_mod = flex::Program::from_score_mod(flex::mods::relative_position(table, max_distance));
  } else if (name == "softcap") {
    v.score_mod = flex::Program::from_score_mod(flex::mods::soft_cap(o.soft_cap));
  } else {
    unknown("flex variant", name, flex_names());
  }
  if (mask_mod) {
    v.block_mask = std::make_shared<const flex::BlockMask>(
        flex::create_block_mask(*mask_mod, batch, 1, q_len, kv_len, o.block_size));
  }
  return v;
}

void add_flex(AttentionParams& params, const FlexVariant& variant) {
  if (variant.score_mod) {
    params.mask.score_mod = std::make_shared<const flex::Program>(*variant.score_mod);
  }
  params.mask.block_mask = variant.block_mask;
}

}  // namespace sdpa::cli
