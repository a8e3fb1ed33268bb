// NaN inputs propagate as in PyTorch: a NaN score makes its query row's output and
// logsumexp NaN, and only those rows. Checked on MATH and on FLASH at every CPU
// capability this CPU supports, for float32 / bfloat16 / float16, on tiles the fused
// AVX-512 kernels take (no mask), on masked tiles (causal diagonal), in the decode path
// (L = 1) and through the backward.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "common/capability.h"
#include "common/harness.h"
#include "sdpa/backend.h"
#include "sdpa/sdpa.h"

namespace sdpa::test {
namespace {

namespace bcpu = sdpa::backends::cpu;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Per (head, query row): whether out's row holds a NaN, and whether the lse is NaN.
struct RowNaNs {
  std::vector<bool> out, lse;
};

RowNaNs row_nans(const AttentionResult& r) {
  const Tensor out = r.out.to(DType::kFloat32).contiguous();
  const int64_t rows = out.size(0) * out.size(1) * out.size(2), ev = out.size(3);
  RowNaNs n{std::vector<bool>(static_cast<size_t>(rows)),
            std::vector<bool>(static_cast<size_t>(rows))};
  const Tensor lse = r.lse.contiguous();
  for (int64_t i = 0; i < rows; ++i) {
    bool any = false;
    for (int64_t e = 0; e < ev; ++e) any = any || std::isnan(out.data<float>()[i * ev + e]);
    n.out[static_cast<size_t>(i)] = any;
    n.lse[static_cast<size_t>(i)] = std::isnan(lse.data<float>()[i]);
  }
  return n;
}

// q [1, H, L, E], k/v [1, H, S, E] (float32 values, cast to `dtype`), with NaN written at
// q[0, 0, q_row, 3] when q_row >= 0 and at k[0, 0, key, 5] when key >= 0.
AttentionResult run(SDPBackend backend, DType dtype, int64_t L, int64_t S, int64_t q_row,
                    int64_t key, bool causal) {
  const int64_t H = 2, E = 64;
  std::mt19937 rng(static_cast<uint32_t>(L * 7 + S));
  Tensor q = random_tensor({1, H, L, E}, DType::kFloat32, Layout::kBHSD, rng);
  Tensor k = random_tensor({1, H, S, E}, DType::kFloat32, Layout::kBHSD, rng);
  const Tensor v = random_tensor({1, H, S, E}, DType::kFloat32, Layout::kBHSD, rng);
  if (q_row >= 0) q.data<float>()[q_row * E + 3] = kNaN;
  if (key >= 0) k.data<float>()[key * E + 5] = kNaN;
  SDPAOptions options;
  options.is_causal = causal;
  const sdpa_kernel only(backend);
  AttentionResult r =
      scaled_dot_product_attention_with_lse(q.to(dtype), k.to(dtype), v.to(dtype), options);
  EXPECT_EQ(r.backend, backend);
  return r;
}

class NaNInputs : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (capability_rank(GetParam()) > capability_rank(bcpu::detected_cpu_capability())) {
      GTEST_SKIP() << GetParam() << " is not supported by this CPU";
    }
    bcpu::set_cpu_capability(GetParam());
  }
  ScopedCapability reset_;
};

const SDPBackend kBackends[] = {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION};
const DType kDtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

TEST_P(NaNInputs, NaNInAQueryRowMakesThatRowNaN) {
  const int64_t L = 130, S = 257, q_row = 70;  // row 70: the second q block, a full tile row
  for (SDPBackend backend : kBackends) {
    for (DType dtype : kDtypes) {
      for (bool causal : {false, true}) {
        const RowNaNs n = row_nans(run(backend, dtype, L, S, q_row, -1, causal));
        for (int64_t i = 0; i < 2 * L; ++i) {
          const bool want = i == q_row;
          ASSERT_EQ(n.out[static_cast<size_t>(i)], want)
              << GetParam() << " " << backend_name(backend) << " " << dtype_name(dtype)
              << (causal ? " causal" : "") << " row " << i;
          ASSERT_EQ(n.lse[static_cast<size_t>(i)], want) << "lse row " << i;
        }
      }
    }
  }
}

TEST_P(NaNInputs, NaNInAKeyMakesTheRowsThatSeeItNaN) {
  const int64_t L = 130, S = 200, key = 100;
  for (SDPBackend backend : kBackends) {
    for (DType dtype : kDtypes) {
      for (bool causal : {false, true}) {
        const RowNaNs n = row_nans(run(backend, dtype, L, S, -1, key, causal));
        for (int64_t i = 0; i < 2 * L; ++i) {
          // Head 0 holds the NaN key; causal rows before it never see it.
          const bool want = i < L && (!causal || i >= key);
          ASSERT_EQ(n.out[static_cast<size_t>(i)], want)
              << GetParam() << " " << backend_name(backend) << " " << dtype_name(dtype)
              << (causal ? " causal" : "") << " row " << i;
          ASSERT_EQ(n.lse[static_cast<size_t>(i)], want) << "lse row " << i;
        }
      }
    }
  }
}

TEST_P(NaNInputs, DecodeNaNKeyOrQueryMakesItsHeadNaN) {
  for (SDPBackend backend : kBackends) {
    for (DType dtype : kDtypes) {
      // A NaN key (one chunk's sum turns NaN), then a NaN query (every score NaN, so each
      // chunk's max stays -inf), at decode lengths: one long row and a short one.
      for (const auto& [S, q_row, key] :
           {std::tuple{3000, -1, 2500}, std::tuple{3000, 0, -1}, std::tuple{8, 0, -1}}) {
        const RowNaNs n = row_nans(run(backend, dtype, 1, S, q_row, key, false));
        EXPECT_TRUE(n.out[0] && n.lse[0]) << GetParam() << " " << backend_name(backend) << " "
                                          << dtype_name(dtype) << " S " << S << " q_row " << q_row;
        EXPECT_FALSE(n.out[1] || n.lse[1]) << backend_name(backend) << " " << dtype_name(dtype);
      }
    }
  }
}

TEST_P(NaNInputs, BackwardGivesTheNaNRowANaNQueryGradient) {
  const int64_t L = 70, S = 90, E = 64, q_row = 9;
  for (SDPBackend backend : kBackends) {
    std::mt19937 rng(5);
    Tensor q = random_tensor({1, 2, L, E}, DType::kFloat32, Layout::kBHSD, rng);
    const Tensor k = random_tensor({1, 2, S, E}, DType::kFloat32, Layout::kBHSD, rng);
    const Tensor v = random_tensor({1, 2, S, E}, DType::kFloat32, Layout::kBHSD, rng);
    const Tensor grad_out = random_tensor({1, 2, L, E}, DType::kFloat32, Layout::kBHSD, rng);
    q.data<float>()[q_row * E + 3] = kNaN;
    const sdpa_kernel only(backend);
    const AttentionResult r = scaled_dot_product_attention_with_lse(q, k, v);
    const AttentionGradients g =
        scaled_dot_product_attention_backward(grad_out, q, k, v, r.out, r.lse);
    const Tensor dq = g.grad_q.contiguous();
    for (int64_t i = 0; i < 2 * L; ++i) {
      bool any = false;
      for (int64_t e = 0; e < E; ++e) any = any || std::isnan(dq.data<float>()[i * E + e]);
      ASSERT_EQ(any, i == q_row) << GetParam() << " " << backend_name(backend) << " row " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, NaNInputs, ::testing::Values("AVX512", "AVX2", "DEFAULT"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace sdpa::test
