// MATH forward for float16 / bfloat16 without the float32 upcast
// (backends::allow_fp16_bf16_reduction_math_sdp, PyTorch's
// torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp). torch's math path then runs
// each of its steps as a tensor op in the input dtype, so each result is rounded to it:
//   q * sqrt(scale) and k * sqrt(scale) (the sign of a negative scale on q),
//   scores = q k^T (a product accumulating in float32),
//   scores + mask, softmax (computed in float32, stored rounded), dropout's scaling,
//   out = P v (accumulating in float32).
// Rounding at the same points gives torch's results up to the products' summation order.

#include <cmath>
#include <limits>

#include "core/scratch.h"
#include "cpu/flash_tile.h"
#include "cpu/kernel_context.h"
#include "cpu/kernels.h"
#include "cpu/kv_rows.h"
#include "cpu/math_scores.h"
#include "cpu/online_softmax.h"
#include "cpu/rows.h"

namespace sdpa::cpu {
namespace {

// One thread's buffers: scaled and rounded k and v of one kv head, q, one score row, out.
struct ReducedBuffers {
  explicit ReducedBuffers(const AttentionParams& p)
      : q(p.head_dim_qk),
        k(p.kv_len * p.head_dim_qk),
        v(p.kv_len * p.head_dim_vo),
        scores(p.kv_len),
        o(p.head_dim_vo),
        flex(p.mask, kMaxLanes) {}
  detail::ScratchArray<float> q, k, v, scores, o;
  flex::RowState flex;
};

// x rounded to the storage type S, back in float.
template <typename S>
void round_to(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = widen(narrow<S>(x[i]));
}

template <typename S>
void forward_head(const AttentionParams& p, int64_t bh, ReducedBuffers& buf, const Tensor& out,
                  float* lse) {
  const int64_t b = bh / p.num_heads_q, h = bh % p.num_heads_q;
  const int64_t L = p.q_len, S_len = p.kv_len, E = p.head_dim_qk, Ev = p.head_dim_vo;
  const int64_t hk = h / p.group_size();
  // torch splits the scale as sqrt(|scale|) on each side, negated on q for a negative one.
  const float k_mult = static_cast<float>(std::sqrt(std::abs(p.scale)));
  const float q_mult = p.scale < 0 ? -k_mult : k_mult;
  const RowView q_rows(p.q, b, h), k_rows = key_rows(p, b, hk), v_rows = value_rows(p, b, hk);
  const RowView out_rows(out, b, h);
  const DenseMaskRows dense(p.mask, b, h);
  const HeadMasking masking{p.mask, dense, &buf.flex, b, h, L, S_len};
  for (int64_t j = 0; j < S_len; ++j) {
    k_rows.load(j, buf.k.data() + j * E, k_mult);
    v_rows.load(j, buf.v.data() + j * Ev);
  }
  round_to<S>(buf.k.data(), S_len * E);
  for (int64_t i = 0; i < L; ++i) {
    q_rows.load(i, buf.q.data(), q_mult);
    round_to<S>(buf.q.data(), E);
    float* s = buf.scores.data();
    for (int64_t j = 0; j < S_len; ++j) {
      float dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += buf.q[e] * buf.k[j * E + e];
      s[j] = widen(narrow<S>(dot));
    }
    mask_score_row(masking, i, s);
    round_to<S>(s, S_len);
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < S_len; ++j) max = max_keeping_nan(max, s[j]);
    const int64_t row = query_row_index(p, b, h, i);
    if (!has_finite_score(max)) {  // fully masked row: zeros (torch's _safe_softmax)
      std::fill(buf.o.begin(), buf.o.end(), 0.0f);
      lse[row] = kMaskedLse<float>;
      out_rows.store(i, buf.o.data());
      continue;
    }
    float sum = 0;
    for (int64_t j = 0; j < S_len; ++j) sum += (s[j] = std::exp(s[j] - max));
    lse[row] = max + std::log(sum);
    for (int64_t j = 0; j < S_len; ++j) s[j] /= sum;
    round_to<S>(s, S_len);
    if (p.has_dropout()) {
      apply_dropout(p, {b, h, i, 0}, s, S_len);
      round_to<S>(s, S_len);
    }
    std::fill(buf.o.begin(), buf.o.end(), 0.0f);
    for (int64_t j = 0; j < S_len; ++j) {
      for (int64_t e = 0; e < Ev; ++e) buf.o[e] += s[j] * buf.v[j * Ev + e];
    }
    out_rows.store(i, buf.o.data());  // rounds to S
  }
}

}  // namespace

void math_forward_reduced(const AttentionParams& p, const Tensor& out, const Tensor& lse) {
  for_each_query_head<ReducedBuffers>(p, [&](int64_t bh, ReducedBuffers& buf) {
    if (p.dtype == DType::kBFloat16) {
      forward_head<bfloat16>(p, bh, buf, out, lse.data<float>());
    } else {
      forward_head<float16>(p, bh, buf, out, lse.data<float>());
    }
  });
}

}  // namespace sdpa::cpu
