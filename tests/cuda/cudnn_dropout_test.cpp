// Dropout on CUDNN_ATTENTION, element by element: with v the identity, the output row is
// the dropped, rescaled probability row itself, so the kept fraction, the 1 / (1 - p)
// scaling of every kept probability, and the backward's replay of the same mask (grad_v =
// dropped_P^T grad_out) can each be read off exactly. Needs a GPU; skips without one.

#include <cmath>

#include "sdpa/cuda.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::Device;
using sdpa::DeviceType;
using sdpa::SDPBackend;

const Device kCuda{DeviceType::kCUDA, 0};

TEST(CudnnDropout, KeepsAtTheRateScalesAndTheBackwardReplaysTheMask) {
  if (!sdpa::cuda::is_available()) GTEST_SKIP() << sdpa::cuda::unavailable_reason();
  constexpr int64_t B = 2, H = 4, L = 128, S = 128, E = 128;
  constexpr double p = 0.3;
  // Scores of moderate size: every probability is far from underflow, so a zero output
  // element is a dropped one.
  const Tensor q = randn({B, H, L, E}, DType::kBFloat16, 1, 0.3);
  const Tensor k = randn({B, H, S, E}, DType::kBFloat16, 2, 0.3);
  Tensor v = Tensor::empty({B, H, S, S}, DType::kFloat64);
  for_each_index(v.sizes(), [&](const Shape& i) { v.set_item(i, i[2] == i[3] ? 1.0 : 0.0); });
  v = v.to(DType::kBFloat16);
  const Tensor grad_out = randn({B, H, L, S}, DType::kBFloat16, 3);

  sdpa::SDPAOptions o;
  o.dropout_p = p;
  o.dropout_state = sdpa::PhiloxState{1234, 5};
  sdpa::sdpa_kernel only(SDPBackend::CUDNN_ATTENTION);
  const auto gpu = [](const Tensor& t) { return sdpa::cuda::to_device(t, kCuda); };
  const auto host = [](const Tensor& t) { return sdpa::cuda::to_device(t, Device{}); };
  const sdpa::AttentionResult fwd = sdpa::scaled_dot_product_attention_with_lse(gpu(q), gpu(k), gpu(v), o);
  ASSERT_EQ(fwd.backend, SDPBackend::CUDNN_ATTENTION);
  const sdpa::AttentionGradients grads = sdpa::scaled_dot_product_attention_backward(
      gpu(grad_out), gpu(q), gpu(k), gpu(v), fwd.out, fwd.lse, o);
  const std::vector<double> dropped = values(host(fwd.out));  // [B, H, L, S]
  const std::vector<double> grad_v = values(host(grads.grad_v));
  const std::vector<double> qv = values(q), kv = values(k), go = values(grad_out);

  int64_t kept = 0;
  double worst_scale = 0.0;
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t i = 0; i < L; ++i) {
      // The undropped probabilities of row i in float64.
      std::vector<double> prob(S);
      double max = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < S; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < E; ++e) dot += qv[(bh * L + i) * E + e] * kv[(bh * S + j) * E + e];
        prob[j] = dot / std::sqrt(static_cast<double>(E));
        max = std::max(max, prob[j]);
      }
      for (double& x : prob) sum += (x = std::exp(x - max));
      for (int64_t j = 0; j < S; ++j) {
        const double out = dropped[(bh * L + i) * S + j];
        if (out == 0.0) continue;
        ++kept;
        const double expected = prob[j] / sum / (1.0 - p);
        worst_scale = std::max(worst_scale, std::fabs(out - expected) / expected);
      }
    }
  }
  const double n = static_cast<double>(B * H * L * S);
  const double sigma = std::sqrt(n * p * (1.0 - p));
  EXPECT_NEAR(static_cast<double>(kept), n * (1.0 - p), 6.0 * sigma) << "kept " << kept << " of " << n;
  EXPECT_LT(worst_scale, 2e-2);  // bfloat16 outputs, rescaled by 1 / (1 - p)

  // grad_v[j] = sum_i dropped[i, j] * grad_out[i]: the backward must drop what the
  // forward dropped.
  double worst = 0.0, largest = 0.0;
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t j = 0; j < S; ++j) {
      for (int64_t c = 0; c < S; ++c) {
        double expected = 0.0;
        for (int64_t i = 0; i < L; ++i) {
          expected += dropped[(bh * L + i) * S + j] * go[(bh * L + i) * S + c];
        }
        worst = std::max(worst, std::fabs(grad_v[(bh * S + j) * S + c] - expected));
        largest = std::max(largest, std::fabs(expected));
      }
    }
  }
  EXPECT_LT(worst / largest, 2e-2);
}

}  // namespace
}  // namespace sdpa_test
