// Validation of user inputs and their normalization into AttentionParams.

#include <cmath>
#include <initializer_list>
#include <utility>

#include "dispatch/lowering.h"
#include "sdpa/cuda.h"
#include "sdpa/sdpa.h"

namespace sdpa {
namespace {

void check_same(const char* what, const char* a_name, int64_t a, const char* b_name, int64_t b,
                const Tensor& t_a, const Tensor& t_b) {
  SDPA_CHECK(a == b, what, ": expected ", b_name, " to match ", a_name, " (", a, "), got ", b,
             " (", a_name, " ", t_a.describe(), ", ", b_name, " ", t_b.describe(), ")");
}

void lower_bias(const AttnBiasPtr& bias, AttentionParams& p) {
  const BiasShape shape{p.batch, p.num_heads_q, p.q_len, p.kv_len};
  p.bias = bias;
  p.mask = MaskDescriptor{};
  if (bias->needs_materialization()) {
    Tensor dense = bias->materialize(shape, p.dtype);
    // Biases materialize in host memory; a CUDA call reads them on its device.
    if (p.device.type == DeviceType::kCUDA) dense = cuda::to_device(dense, p.device, p.stream);
    TensorBias(std::move(dense)).lower(shape, p.mask);
  } else {
    bias->lower(shape, p.mask);
  }
  if (p.mask.dense_kind == DenseMaskKind::kNone) return;
  const Tensor& m = p.mask.dense;
  SDPA_CHECK(m.device() == p.device, "attn_mask: expected device ", device_name(p.device),
             ", got ", device_name(m.device()));
  SDPA_CHECK(m.dtype() == DType::kBool || m.dtype() == p.dtype, "attn_mask: expected dtype bool "
             "or ", dtype_name(p.dtype), " (the query dtype), got ", dtype_name(m.dtype()));
}

}  // namespace

bool bias_stays_native(const AttentionParams& params) {
  return params.bias && !params.bias->needs_materialization() && params.mask.score_mod;
}

AttentionParams with_materialized_bias(const AttentionParams& params) {
  if (!params.bias || params.bias->needs_materialization() ||
      dynamic_cast<const TensorBias*>(params.bias.get()) || bias_stays_native(params)) {
    return params;
  }
  AttentionParams p = params;
  const BiasShape shape{p.batch, p.num_heads_q, p.q_len, p.kv_len};
  // Only the bias is replaced by its dense form; flex parts (score_mod, BlockMask) stay.
  // Half-precision calls get it in float32, the precision the fused kernels add it in:
  // float16 would turn terms beyond 65504 (a long-range ALiBi) into infinities.
  const DType dtype = p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16
                          ? DType::kFloat32 : p.dtype;
  MaskDescriptor mask;
  TensorBias(p.bias->materialize(shape, dtype)).lower(shape, mask);
  mask.score_mod = p.mask.score_mod;
  mask.block_mask = p.mask.block_mask;
  p.mask = std::move(mask);
  return p;
}

AttentionParams make_params(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                            const SDPAOptions& opt) {
  SDPA_CHECK(q_in.defined(), "query: expected a tensor, got an undefined one");
  SDPA_CHECK(k_in.defined(), "key: expected a tensor, got an undefined one");
  SDPA_CHECK(v_in.defined(), "value: expected a tensor, got an undefined one");
  const int64_t rank = q_in.dim();
  SDPA_CHECK(rank == 3 || rank == 4, "query: expected a 3-D [Hq, L, E] or 4-D [B, Hq, L, E] "
             "tensor, got ", rank, "-D ", shape_str(q_in.sizes()));
  SDPA_CHECK(k_in.dim() == rank, "key: expected ", rank, "-D like query, got ", k_in.dim(),
             "-D ", shape_str(k_in.sizes()));
  SDPA_CHECK(v_in.dim() == rank, "value: expected ", rank, "-D like query, got ", v_in.dim(),
             "-D ", shape_str(v_in.sizes()));
  SDPA_CHECK(is_floating(q_in.dtype()), "query: expected dtype float32, float64, bfloat16 or "
             "float16, got ", dtype_name(q_in.dtype()));
  SDPA_CHECK(k_in.dtype() == q_in.dtype(), "key: expected dtype ", dtype_name(q_in.dtype()),
             " (the query dtype), got ", dtype_name(k_in.dtype()));
  SDPA_CHECK(v_in.dtype() == q_in.dtype(), "value: expected dtype ", dtype_name(q_in.dtype()),
             " (the query dtype), got ", dtype_name(v_in.dtype()));
  SDPA_CHECK(k_in.device() == q_in.device(), "key: expected device ",
             device_name(q_in.device()), " (the query device), got ", device_name(k_in.device()));
  SDPA_CHECK(v_in.device() == q_in.device(), "value: expected device ",
             device_name(q_in.device()), " (the query device), got ", device_name(v_in.device()));

  // Kernels round sizes up to tiles and chunks ((n + tile - 1) / tile): a bound far above
  // any memory keeps that arithmetic from overflowing for broadcast (zero-stride) inputs.
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"query", &q_in},
                                {"key", &k_in}, {"value", &v_in}}) {
    for (int64_t size : t->sizes()) {
      SDPA_CHECK(size <= kMaxAttentionExtent, name, ": expected sizes <= 2^62, got ",
                 shape_str(t->sizes()));
    }
  }

  AttentionParams p;
  p.unbatched = rank == 3;
  p.q = p.unbatched ? q_in.unsqueeze(0) : q_in;
  p.k = p.unbatched ? k_in.unsqueeze(0) : k_in;
  p.v = p.unbatched ? v_in.unsqueeze(0) : v_in;
  p.batch = p.q.size(0);
  p.num_heads_q = p.q.size(1);
  p.num_heads_kv = p.k.size(1);
  p.q_len = p.q.size(2);
  p.kv_len = p.k.size(2);
  p.head_dim_qk = p.q.size(3);
  p.head_dim_vo = p.v.size(3);
  p.dtype = q_in.dtype();
  p.device = q_in.device();
  p.stream = opt.stream;
  p.enable_gqa = opt.enable_gqa;

  check_same("key", "query batch", p.batch, "key batch", p.k.size(0), q_in, k_in);
  check_same("value", "query batch", p.batch, "value batch", p.v.size(0), q_in, v_in);
  check_same("value", "key heads", p.num_heads_kv, "value heads", p.v.size(1), k_in, v_in);
  check_same("value", "key length S", p.kv_len, "value length S", p.v.size(2), k_in, v_in);
  check_same("key", "query head_dim E", p.head_dim_qk, "key head_dim E", p.k.size(3), q_in, k_in);
  if (opt.enable_gqa) {
    SDPA_CHECK(p.num_heads_kv >= 1 && p.num_heads_q % p.num_heads_kv == 0,
               "key: with enable_gqa, query heads Hq (", p.num_heads_q,
               ") must be a multiple of key/value heads Hkv, got Hkv = ", p.num_heads_kv);
  } else {
    SDPA_CHECK(p.num_heads_q == p.num_heads_kv, "key: expected ", p.num_heads_q,
               " heads like query (pass enable_gqa for grouped-query attention), got ",
               p.num_heads_kv);
  }
  // Kernels index [B, H, L, S] score/dropout elements linearly: that count must fit.
  const auto fits = [](std::initializer_list<int64_t> sizes) {
    int64_t n = 1;
    for (int64_t s : sizes) {
      if (__builtin_mul_overflow(n, s, &n)) return false;
    }
    return true;
  };
  SDPA_CHECK(fits({p.batch, p.num_heads_q, p.q_len, p.kv_len}),
             "query/key: the score count B * Hq * L * S = ", p.batch, " * ", p.num_heads_q, " * ",
             p.q_len, " * ", p.kv_len, " overflows int64");
  SDPA_CHECK(fits({p.batch, p.num_heads_q, p.q_len, p.head_dim_vo}),
             "query/value: the output element count B * Hq * L * Ev = ", p.batch, " * ",
             p.num_heads_q, " * ", p.q_len, " * ", p.head_dim_vo, " overflows int64");

  SDPA_CHECK(opt.dropout_p >= 0.0 && opt.dropout_p <= 1.0,
             "dropout_p: expected a probability in [0, 1], got ", opt.dropout_p);
  if (opt.scale) {
    SDPA_CHECK(std::isfinite(*opt.scale), "scale: expected a finite number, got ", *opt.scale);
    p.scale = *opt.scale;
  } else {
    // E = 0: every score is an empty dot product (0) whatever the scale; 1 keeps it finite.
    p.scale = p.head_dim_qk == 0 ? 1.0 : 1.0 / std::sqrt(static_cast<double>(p.head_dim_qk));
  }

  if (opt.attn_mask.defined()) {
    SDPA_CHECK(!opt.is_causal, "attn_mask: expected no mask when is_causal is set (as PyTorch), "
               "got ", opt.attn_mask.describe());
    lower_bias(opt.attn_mask.bias(), p);
  }
  if (opt.is_causal) p.mask.bands.push_back(DiagonalBand{DiagonalAlignment::kTopLeft, std::nullopt, 0});

  if (opt.dropout_position) {
    const DropoutPosition& at = *opt.dropout_position;
    SDPA_CHECK(at.q_offset >= 0 && at.kv_offset >= 0,
               "dropout_position: expected non-negative offsets, got q_offset = ", at.q_offset,
               ", kv_offset = ", at.kv_offset);
    SDPA_CHECK(at.q_offset <= at.q_len && p.q_len <= at.q_len - at.q_offset &&
                   at.kv_offset <= at.kv_len && p.kv_len <= at.kv_len - at.kv_offset,
               "dropout_position: expected the call's L = ", p.q_len, " and S = ", p.kv_len,
               " to fit in q_len = ", at.q_len, " from q_offset = ", at.q_offset,
               " and kv_len = ", at.kv_len, " from kv_offset = ", at.kv_offset);
    SDPA_CHECK(fits({p.batch, p.num_heads_q, at.q_len, at.kv_len}),
               "dropout_position: the whole call's score count B * Hq * q_len * kv_len = ",
               p.batch, " * ", p.num_heads_q, " * ", at.q_len, " * ", at.kv_len,
               " overflows int64");
    p.dropout.q_offset = at.q_offset;
    p.dropout.kv_offset = at.kv_offset;
    p.dropout.q_total = at.q_len;
    p.dropout.kv_total = at.kv_len;
  }
  if (opt.dropout_p > 0.0) {
    p.dropout.p = opt.dropout_p;
    if (opt.dropout_state) {
      p.dropout.philox = *opt.dropout_state;
    } else {
      Generator& gen = opt.generator ? *opt.generator : default_generator();
      p.dropout.philox = gen.next();
    }
  }
  if (opt.attn_mask_requires_grad) {
    SDPA_CHECK(opt.attn_mask.tensor().defined() &&
                   p.mask.dense_kind == DenseMaskKind::kAdditive,
               "attn_mask_requires_grad: expected a float attn_mask tensor, got ",
               opt.attn_mask.describe());
    p.attn_mask_requires_grad = true;
  }
  p.deterministic = are_deterministic_algorithms_enabled();
  p.reduced_precision_math =
      (p.dtype == DType::kFloat16 || p.dtype == DType::kBFloat16) &&
      (opt.allow_fp16_bf16_reduction_math || backends::fp16_bf16_reduction_math_sdp_allowed());
  return p;
}

namespace {
// Returns `t` as a 4-D view after checking it is [B, Hq, L, last] (3-D without B when
// unbatched) of dtype `dtype`.
Tensor expect_output_like(const char* name, const Tensor& t, const AttentionParams& p,
                          int64_t last, DType dtype, bool has_last) {
  SDPA_CHECK(t.defined(), name, ": expected a tensor, got an undefined one");
  Shape want = {p.batch, p.num_heads_q, p.q_len};
  if (has_last) want.push_back(last);
  if (p.unbatched) want.erase(want.begin());
  SDPA_CHECK(t.sizes() == want, name, ": expected shape ", shape_str(want), ", got ",
             shape_str(t.sizes()));
  SDPA_CHECK(t.dtype() == dtype, name, ": expected dtype ", dtype_name(dtype), ", got ",
             dtype_name(t.dtype()));
  SDPA_CHECK(t.device() == p.device, name, ": expected device ", device_name(p.device),
             ", got ", device_name(t.device()));
  return p.unbatched ? t.unsqueeze(0) : t;
}
}  // namespace

AttentionParams make_backward_params(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                     const SDPAOptions& opt) {
  SDPA_CHECK(opt.dropout_p == 0.0 || opt.dropout_state.has_value(),
             "dropout_state: expected the forward's AttentionResult::philox when dropout_p > 0 "
             "(the backward must replay the forward's dropout mask), got none");
  AttentionParams p = make_params(q, k, v, opt);
  p.backward = true;
  p.grad_out = expect_output_like("grad_out", grad_out, p, p.head_dim_vo, p.dtype, true);
  p.out = expect_output_like("out", out, p, p.head_dim_vo, p.dtype, true);
  p.lse = expect_output_like("lse", lse, p, 0, DType::kFloat32, false);
  return p;
}

}  // namespace sdpa
