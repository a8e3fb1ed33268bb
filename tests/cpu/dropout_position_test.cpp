// DropoutPosition (context parallelism): a call split into blocks of queries x keys, each
// block computed alone with its position in the whole call and merged by logsumexp, drops
// exactly the weights of the whole call, forward and backward, on MATH and FLASH; without
// the position the blocks draw other masks; bad positions are named errors.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/harness.h"

namespace sdpa::test {
namespace {

constexpr int64_t B = 2, Hq = 4, Hkv = 2, L = 70, S = 95, E = 24;
constexpr double kDropout = 0.3;
const PhiloxState kPhilox{0x5eed, 11};
// Query rows [0, 33) and [33, 70), keys [0, 40) and [40, 95).
const std::vector<std::pair<int64_t, int64_t>> kQueryBlocks = {{0, 33}, {33, L}};
const std::vector<std::pair<int64_t, int64_t>> kKeyBlocks = {{0, 40}, {40, S}};

struct Qkv {
  Tensor q, k, v, dout;
};

Qkv inputs(DType dtype) {
  std::mt19937 rng(4242);
  return {random_tensor({B, Hq, L, E}, dtype, Layout::kBHSD, rng),
          random_tensor({B, Hkv, S, E}, dtype, Layout::kBHSD, rng),
          random_tensor({B, Hkv, S, E}, dtype, Layout::kBHSD, rng),
          random_tensor({B, Hq, L, E}, dtype, Layout::kBHSD, rng)};
}

SDPAOptions options(std::optional<DropoutPosition> at) {
  SDPAOptions o;
  o.dropout_p = kDropout;
  o.dropout_state = kPhilox;
  o.enable_gqa = true;
  o.dropout_position = at;
  return o;
}

// out / lse of the whole call from its blocks (each with its position, or none): rows of
// one query block merged over the key blocks by logsumexp, in float64.
std::pair<std::vector<double>, std::vector<double>> merged_blocks(const Qkv& in, bool positioned) {
  std::vector<double> out(static_cast<size_t>(B * Hq * L * E), 0.0);
  std::vector<double> lse(static_cast<size_t>(B * Hq * L), -std::numeric_limits<double>::infinity());
  for (const auto& [q0, q1] : kQueryBlocks) {
    for (const auto& [k0, k1] : kKeyBlocks) {
      const std::optional<DropoutPosition> at =
          positioned ? std::optional(DropoutPosition{q0, k0, L, S}) : std::nullopt;
      const AttentionResult r = scaled_dot_product_attention_with_lse(
          in.q.slice(2, q0, q1), in.k.slice(2, k0, k1), in.v.slice(2, k0, k1), options(at));
      for (int64_t bh = 0; bh < B * Hq; ++bh) {
        const int64_t b = bh / Hq, h = bh % Hq;
        for (int64_t i = q0; i < q1; ++i) {
          const size_t row = static_cast<size_t>(bh * L + i);
          const double part = r.lse.item({b, h, i - q0});
          const double m = std::max(lse[row], part);
          const double merged = m + std::log(std::exp(lse[row] - m) + std::exp(part - m));
          for (int64_t e = 0; e < E; ++e) {
            double& o = out[row * E + static_cast<size_t>(e)];
            o = o * std::exp(lse[row] - merged) +
                r.out.item({b, h, i - q0, e}) * std::exp(part - merged);
          }
          lse[row] = merged;
        }
      }
    }
  }
  return {out, lse};
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(DropoutPosition, ForwardBlocksEqualTheWholeCall) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::string(backend_name(backend)));
      sdpa_kernel guard(backend);
      const Qkv in = inputs(dtype);
      const AttentionResult whole = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, options({}));
      const auto [out, lse] = merged_blocks(in, true);
      // lse is float32 for every dtype: the merge weights carry its rounding.
      const double tol = dtype == DType::kFloat64 ? 2e-6 : 2e-5;
      EXPECT_LT(max_diff(out, to_doubles(whole.out)), tol);
      EXPECT_LT(max_diff(lse, to_doubles(whole.lse)), tol);
      // Drawn as calls of their own, the blocks drop other weights.
      EXPECT_GT(max_diff(merged_blocks(in, false).first, to_doubles(whole.out)), 1e-2);
    }
  }
}

// FLASH float32, whose backward takes the probabilities from the given lse (MATH and the
// float64 FLASH recompute the row statistics over the block's own keys).
TEST(DropoutPosition, BackwardBlocksSumToTheWholeCall) {
  {
    sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
    const Qkv in = inputs(DType::kFloat32);
    const AttentionResult whole = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, options({}));
    const AttentionGradients g = scaled_dot_product_attention_backward(
        in.dout, in.q, in.k, in.v, whole.out, whole.lse, options({}));
    // Each block's gradients from the whole call's out and lse (as the ring backward).
    std::vector<double> dq(static_cast<size_t>(B * Hq * L * E), 0.0);
    std::vector<double> dk(static_cast<size_t>(B * Hkv * S * E), 0.0), dv = dk;
    for (const auto& [q0, q1] : kQueryBlocks) {
      for (const auto& [k0, k1] : kKeyBlocks) {
        const AttentionGradients part = scaled_dot_product_attention_backward(
            in.dout.slice(2, q0, q1), in.q.slice(2, q0, q1), in.k.slice(2, k0, k1),
            in.v.slice(2, k0, k1), whole.out.slice(2, q0, q1), whole.lse.slice(2, q0, q1),
            options(DropoutPosition{q0, k0, L, S}));
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t e = 0; e < E; ++e) {
            for (int64_t h = 0; h < Hq; ++h) {
              for (int64_t i = q0; i < q1; ++i) {
                dq[static_cast<size_t>(((b * Hq + h) * L + i) * E + e)] +=
                    part.grad_q.item({b, h, i - q0, e});
              }
            }
            for (int64_t h = 0; h < Hkv; ++h) {
              for (int64_t j = k0; j < k1; ++j) {
                const size_t at = static_cast<size_t>(((b * Hkv + h) * S + j) * E + e);
                dk[at] += part.grad_k.item({b, h, j - k0, e});
                dv[at] += part.grad_v.item({b, h, j - k0, e});
              }
            }
          }
        }
      }
    }
    // Gradients are O(1); each sum adds two float32 blocks.
    EXPECT_LT(max_diff(dq, to_doubles(g.grad_q)), 2e-5);
    EXPECT_LT(max_diff(dk, to_doubles(g.grad_k)), 2e-5);
    EXPECT_LT(max_diff(dv, to_doubles(g.grad_v)), 2e-5);
  }
}

TEST(DropoutPosition, PositionsOutsideTheWholeCallAreErrors) {
  const Qkv in = inputs(DType::kFloat32);
  const Tensor q = in.q.slice(2, 0, 33), k = in.k.slice(2, 0, 40), v = in.v.slice(2, 0, 40);
  const auto message = [&](DropoutPosition at) {
    try {
      scaled_dot_product_attention(q, k, v, options(at));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({-1, 0, L, S}).find("dropout_position: expected non-negative offsets"),
            std::string::npos);
  EXPECT_NE(message({40, 0, L, S}).find("dropout_position: expected the call's L = 33"),
            std::string::npos);
  EXPECT_NE(message({0, 60, L, S}).find("S = 40 to fit"), std::string::npos);
  EXPECT_NE(message({0, 0, int64_t{1} << 40, int64_t{1} << 40}).find("overflows int64"),
            std::string::npos);
  EXPECT_EQ(message({37, 55, L, S}), "no error");
}

}  // namespace
}  // namespace sdpa::test
