// The op declarations (one schema each), their meta functions (validation and output
// shapes) and the typed entry points of the variants.

#include <cmath>

#include "registry/registry_impl.h"

namespace sdpa::registry {
namespace {

Shape scores_shape(const AttentionParams& p) {
  return {p.batch, p.num_heads_q, p.q_len, p.kv_len};
}

// Returns out [B, Hq, L, Ev] (query dtype) and lse [B, Hq, L] (float32).
std::vector<TensorMeta> attention_meta(const OpCall& call) {
  const AttentionParams& p = *call.params;
  return {{{p.batch, p.num_heads_q, p.q_len, p.head_dim_vo}, p.dtype, p.device},
          {{p.batch, p.num_heads_q, p.q_len}, DType::kFloat32, p.device}};
}

// Returns grad_q/k/v like q/k/v and grad_attn_mask [B, Hq, L, S] when asked for.
std::vector<TensorMeta> attention_backward_meta(const OpCall& call) {
  const AttentionParams& p = *call.params;
  SDPA_CHECK(p.backward, "attention_backward: expected backward params (make_backward_params)");
  return {{p.q.sizes(), p.dtype, p.device},
          {p.k.sizes(), p.dtype, p.device},
          {p.v.sizes(), p.dtype, p.device},
          {scores_shape(p), p.dtype, p.device, p.attn_mask_requires_grad}};
}

std::vector<TensorMeta> merge_meta(const OpCall& call) {
  SDPA_CHECK(call.args.size() == 4, "merge_attention_states: expected 4 tensors, got ",
             call.args.size());
  const char* names[] = {"out_a", "lse_a", "out_b", "lse_b"};
  for (size_t i = 0; i < 4; ++i) {
    SDPA_CHECK(call.args[i].defined(), names[i], ": expected a tensor, got an undefined one");
  }
  const Tensor& out_a = call.args[0];
  const Tensor& lse_a = call.args[1];
  const Tensor& out_b = call.args[2];
  const Tensor& lse_b = call.args[3];
  SDPA_CHECK(out_a.dim() >= 1, "out_a: expected [..., L, Ev], got a 0-D tensor");
  SDPA_CHECK(is_floating(out_a.dtype()), "out_a: expected a floating dtype, got ",
             dtype_name(out_a.dtype()));
  SDPA_CHECK(out_b.dtype() == out_a.dtype(), "out_b: expected dtype ", dtype_name(out_a.dtype()),
             " (the out_a dtype), got ", dtype_name(out_b.dtype()));
  SDPA_CHECK(out_b.sizes() == out_a.sizes(), "out_b: expected shape ", shape_str(out_a.sizes()),
             " (the out_a shape), got ", shape_str(out_b.sizes()));
  Shape lse_shape = out_a.sizes();
  lse_shape.pop_back();
  for (const Tensor* lse : {&lse_a, &lse_b}) {
    const char* name = lse == &lse_a ? "lse_a" : "lse_b";
    SDPA_CHECK(lse->dtype() == DType::kFloat32, name, ": expected dtype float32, got ",
               dtype_name(lse->dtype()));
    SDPA_CHECK(lse->sizes() == lse_shape, name, ": expected shape ", shape_str(lse_shape),
               " (out_a without its last dimension), got ", shape_str(lse->sizes()));
  }
  for (size_t i = 1; i < 4; ++i) {
    SDPA_CHECK(call.args[i].device() == out_a.device(), names[i], ": expected device ",
               device_name(out_a.device()), " (the out_a device), got ",
               device_name(call.args[i].device()));
  }
  return {{out_a.sizes(), out_a.dtype(), out_a.device()},
          {lse_shape, DType::kFloat32, out_a.device()}};
}

std::vector<TensorMeta> materialize_bias_meta(const OpCall& call) {
  const AttentionParams& p = *call.params;
  SDPA_CHECK(!p.mask.score_mod && !p.mask.block_mask,
             "materialize_bias: a flex score_mod or BlockMask has no dense bias form");
  return {{scores_shape(p), p.dtype, p.device}};
}

// The attention arguments after `query`, as scaled_dot_product_attention names them.
#define SDPA_ATTENTION_ARGS                                                 \
  "Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0.0, " \
  "bool is_causal=False, float? scale=None, bool enable_gqa=False"
#define SDPA_BACKWARD_ARGS                                                                 \
  "Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor lse, "      \
  "Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, float? scale=None, " \
  "bool enable_gqa=False, bool attn_mask_requires_grad=False"

constexpr const char* kAttentionSchema =
    "attention(Tensor query, " SDPA_ATTENTION_ARGS ") -> (Tensor out, Tensor lse)";
constexpr const char* kAttentionOutSchema =
    "attention.out(Tensor query, " SDPA_ATTENTION_ARGS
    ", *, Tensor(a!) out, Tensor(b!) lse) -> (Tensor(a!) out, Tensor(b!) lse)";
constexpr const char* kAttentionInplaceSchema =
    "attention_(Tensor(a!) query, " SDPA_ATTENTION_ARGS ") -> Tensor(a!)";
constexpr const char* kAttentionBackwardSchema =
    "attention_backward(" SDPA_BACKWARD_ARGS
    ") -> (Tensor grad_query, Tensor grad_key, Tensor grad_value, Tensor grad_attn_mask, "
    "Tensor[] grad_captured)";
constexpr const char* kAttentionBackwardOutSchema =
    "attention_backward.out(" SDPA_BACKWARD_ARGS
    ", *, Tensor(a!) grad_query, Tensor(b!) grad_key, Tensor(c!) grad_value) -> "
    "(Tensor(a!) grad_query, Tensor(b!) grad_key, Tensor(c!) grad_value)";
constexpr const char* kMergeSchema =
    "merge_attention_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b) -> "
    "(Tensor out, Tensor lse)";
constexpr const char* kMaterializeBiasSchema =
    "materialize_bias(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
    "bool is_causal=False, bool enable_gqa=False) -> Tensor";

#undef SDPA_ATTENTION_ARGS
#undef SDPA_BACKWARD_ARGS

constexpr OpDecl kOps[] = {
    {OpId::kAttention, kAttentionSchema, true, attention_meta},
    {OpId::kAttentionOut, kAttentionOutSchema, true, attention_meta},
    {OpId::kAttentionInplace, kAttentionInplaceSchema, true, attention_meta},
    {OpId::kAttentionBackward, kAttentionBackwardSchema, true, attention_backward_meta},
    {OpId::kAttentionBackwardOut, kAttentionBackwardOutSchema, true,
     attention_backward_meta},
    {OpId::kMergeAttentionStates, kMergeSchema, false, merge_meta},
    {OpId::kMaterializeBias, kMaterializeBiasSchema, true, materialize_bias_meta},
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == kNumOps);

}  // namespace

const OpDecl& op_decl(OpId id) { return kOps[static_cast<int>(id)]; }

}  // namespace sdpa::registry

namespace sdpa {

AttentionResult scaled_dot_product_attention_out(const Tensor& q, const Tensor& k,
                                                 const Tensor& v, Tensor& out, Tensor& lse,
                                                 const SDPAOptions& options) {
  const AttentionParams p = make_params(q, k, v, options);
  OpCall call;
  call.params = &p;
  call.args = {out, lse};
  call.backend = select_backend(p);
  registry::call(registry::OpId::kAttentionOut, call);
  out = call.args[0];
  lse = call.args[1];
  return {out, lse, call.backend, p.dropout.philox};
}

Tensor scaled_dot_product_attention_(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const SDPAOptions& options) {
  const AttentionParams p = make_params(q, k, v, options);
  OpCall call;
  call.params = &p;
  call.backend = select_backend(p);
  registry::call(registry::OpId::kAttentionInplace, call);
  return q;
}

AttentionGradients scaled_dot_product_attention_backward_out(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
    const Tensor& out, const Tensor& lse, Tensor& grad_q, Tensor& grad_k, Tensor& grad_v,
    const SDPAOptions& options) {
  const AttentionParams p = make_backward_params(grad_out, q, k, v, out, lse, options);
  SDPA_CHECK(!p.attn_mask_requires_grad,
             "attention_backward.out: attn_mask_requires_grad is not supported (grad_attn_mask "
             "has no out= argument); use scaled_dot_product_attention_backward");
  OpCall call;
  call.params = &p;
  call.args = {grad_q, grad_k, grad_v};
  call.backend = select_backend(p);
  registry::call(registry::OpId::kAttentionBackwardOut, call);
  grad_q = call.args[0];
  grad_k = call.args[1];
  grad_v = call.args[2];
  AttentionGradients g;
  g.grad_q = grad_q;
  g.grad_k = grad_k;
  g.grad_v = grad_v;
  g.backend = call.backend;
  return g;
}

AttentionState merge_attention_states(const Tensor& out_a, const Tensor& lse_a,
                                      const Tensor& out_b, const Tensor& lse_b) {
  OpCall call;
  call.args = {out_a, lse_a, out_b, lse_b};
  registry::call(registry::OpId::kMergeAttentionStates, call);
  return {call.returns.at(0), call.returns.at(1)};
}

Tensor materialize_bias(const Tensor& q, const Tensor& k, const Tensor& v,
                        const SDPAOptions& options) {
  SDPAOptions opt = options;
  opt.dropout_p = 0.0;  // irrelevant here; avoids drawing dropout state from the generator
  opt.attn_mask_requires_grad = false;
  const AttentionParams p = make_params(q, k, v, opt);
  OpCall call;
  call.params = &p;
  registry::call(registry::OpId::kMaterializeBias, call);
  Tensor bias = call.returns.at(0);
  return p.unbatched ? bias.squeeze(0) : bias;
}

}  // namespace sdpa
