// `sdpa explain`: which backend would run a call of the given shape and options, and why
// every other backend would not. Tensors are allocated but never read.

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "common.h"
#include "variants.h"

namespace sdpa::cli {
namespace {

struct ExplainOptions {
  int64_t batch = 1;
  int64_t heads_q = 8;
  std::optional<int64_t> heads_kv;  // default: heads_q
  int64_t q_len = 128;
  std::optional<int64_t> kv_len;  // default: q_len
  int64_t head_dim = 64;
  std::optional<int64_t> head_dim_v;  // default: head_dim
  std::string dtype = "float32";
  std::string mask = "none";
  bool causal = false;
  double dropout = 0.0;
  bool gqa = false;
  std::string layout = "bhsd";
  VariantOptions variant;
  bool backward = false;
  std::vector<std::string> backends;
  bool priority = false;
};

// A tensor of `shape` that explain can describe and validate without memory: a broadcast
// view of one zero element. Selection reads shapes, dtypes and devices only, and real
// tensors of a 2^32-long call would need terabytes.
Tensor placeholder(const Shape& shape, DType dtype) {
  return Tensor::zeros({1}, dtype).expand(shape);
}

// A [batch, heads, seq, dim] input; with layout bshd a transposed [batch, seq, heads, dim]
// (the layout of a projection's output before transposing).
Tensor make_input(const ExplainOptions& o, int64_t heads, int64_t seq, int64_t dim, DType dtype) {
  if (o.layout == "bshd") return placeholder({o.batch, seq, heads, dim}, dtype).transpose(1, 2);
  return placeholder({o.batch, heads, seq, dim}, dtype);
}

int run_explain(const ExplainOptions& o) {
  const int64_t heads_kv = o.heads_kv.value_or(o.heads_q);
  const int64_t kv_len = o.kv_len.value_or(o.q_len);
  const int64_t head_dim_v = o.head_dim_v.value_or(o.head_dim);
  const DType dtype = parse_dtype(o.dtype);
  if (o.priority && o.backends.empty()) throw UsageError("--priority needs --backends");

  const Tensor q = make_input(o, o.heads_q, o.q_len, o.head_dim, dtype);
  const Tensor k = make_input(o, heads_kv, kv_len, o.head_dim, dtype);
  const Tensor v = make_input(o, heads_kv, kv_len, head_dim_v, dtype);
  SDPAOptions options;
  if (!o.variant.bias.empty() && o.mask != "none")
    throw UsageError("--bias and --mask are exclusive");
  // [B, 1, L, S]: one mask per sequence (padding-style), broadcast over heads.
  if (o.mask == "bool")
    options.attn_mask = placeholder({o.batch, 1, o.q_len, kv_len}, DType::kBool);
  if (o.mask == "float") options.attn_mask = placeholder({o.batch, 1, o.q_len, kv_len}, dtype);
  if (!o.variant.bias.empty()) {
    options.attn_mask =
        make_bias(o.variant.bias, o.batch, o.heads_q, o.q_len, kv_len, o.variant).bias;
  }
  options.is_causal = o.causal;
  options.dropout_p = o.dropout;
  options.enable_gqa = o.gqa;
  // The backward validates the forward's results by shape only: placeholders suffice.
  if (o.backward && o.dropout > 0.0) options.dropout_state = PhiloxState{};

  std::unique_ptr<sdpa_kernel> guard;
  if (!o.backends.empty())
    guard = std::make_unique<sdpa_kernel>(parse_backends(o.backends), o.priority);
  AttentionParams params;
  try {
    if (o.backward) {
      const Tensor out = placeholder({o.batch, o.heads_q, o.q_len, head_dim_v}, dtype);
      const Tensor lse = placeholder({o.batch, o.heads_q, o.q_len}, DType::kFloat32);
      params = make_backward_params(out, q, k, v, out, lse, options);
    } else {
      params = make_params(q, k, v, options);
    }
    if (!o.variant.flex.empty()) {
      add_flex(params, make_flex(o.variant.flex, o.batch, o.heads_q, o.q_len, kv_len, o.variant));
    }
  } catch (const Error& e) {
    // Every input came from a flag, so an invalid call is a bad flag combination.
    throw UsageError(e.what());
  }
  std::cout << "q " << q.describe() << ", k " << k.describe() << ", v " << v.describe()
            << " (layout " << o.layout << ")\n"
            << "attn_mask " << options.attn_mask.describe() << ", is_causal "
            << (o.causal ? "true" : "false") << ", dropout_p " << o.dropout << ", enable_gqa "
            << (o.gqa ? "true" : "false") << ", scale " << params.scale
            << (o.backward ? ", backward pass" : "") << "\n\n"
            << explain(params).to_string() << '\n';
  return kExitOk;
}

}  // namespace

Command add_explain_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "explain", "Show which backend would run a call and why the others would not");
  auto o = std::make_shared<ExplainOptions>();
  const CLI::Validator positive = integer_in<int64_t>(1);
  app->add_option("-b,--batch", o->batch, "Batch size B")->check(positive)->capture_default_str();
  app->add_option("--heads-q", o->heads_q, "Query heads Hq")
      ->check(positive)
      ->capture_default_str();
  app->add_option("--heads-kv", o->heads_kv, "Key/value heads Hkv (default: Hq)")->check(positive);
  app->add_option("--q-len", o->q_len, "Query length L")->check(positive)->capture_default_str();
  app->add_option("--kv-len", o->kv_len, "Key/value length S (default: L)")->check(positive);
  app->add_option("--head-dim", o->head_dim, "Query/key head dim E")
      ->check(positive)
      ->capture_default_str();
  app->add_option("--head-dim-v", o->head_dim_v, "Value head dim Ev (default: E)")->check(positive);
  add_dtype_option(*app, o->dtype);
  app->add_option("--mask", o->mask, "attn_mask: none, bool or float, shaped [B, 1, L, S]")
      ->check(CLI::IsMember({"none", "bool", "float"}))
      ->capture_default_str();
  app->add_flag("--causal", o->causal, "is_causal=True");
  app->add_option("--dropout", o->dropout, "dropout_p")
      ->check(number_in(0.0, 1.0))
      ->capture_default_str();
  app->add_flag("--gqa", o->gqa, "enable_gqa=True");
  app->add_option("--layout", o->layout, "Memory layout of q, k, v")
      ->check(CLI::IsMember({"bhsd", "bshd"}))
      ->capture_default_str();
  add_variant_options(*app, o->variant);
  app->add_flag("--backward", o->backward, "Explain the backward pass instead of the forward");
  add_backends_option(*app, o->backends);
  app->add_flag("--priority", o->priority, "Try --backends in the given order");
  return {app, [o] { return run_explain(*o); }};
}

}  // namespace sdpa::cli
