// Randomized combinations (fixed seeds, so failures reproduce): every option of the other
// sweeps drawn together — shapes around tile edges, dtypes, layouts, broadcast masks with
// masked rows, causal, GQA, 3-D inputs, custom scales and dropout — on every backend.

#include <gtest/gtest.h>

#include <random>

#include "common/harness.h"

namespace sdpa::test {
namespace {

Case random_case(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  const int64_t lengths[] = {0, 1, 2, 15, 16, 17, 31, 63, 64, 65, 127, 128, 129, 200, 257};
  const int64_t dims[] = {1, 4, 7, 8, 16, 24, 31, 32, 48, 64, 80, 96, 128, 160};
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};
  const Layout layouts[] = {Layout::kBHSD, Layout::kBSHD, Layout::kSliceD, Layout::kStridedD,
                            Layout::kHeadDimMajor};
  Case c;
  c.seed = seed;
  c.unbatched = coin(0.2);
  c.batch = c.unbatched ? 1 : pick(1, 3);
  c.heads_kv = pick(1, 3);
  c.heads_q = c.heads_kv * pick(1, 3);
  c.enable_gqa = c.heads_q != c.heads_kv || coin(0.2);
  c.q_len = lengths[pick(0, 14)];
  c.kv_len = lengths[pick(0, 14)];
  c.head_dim = dims[pick(0, 13)];
  c.head_dim_v = coin(0.5) ? -1 : dims[pick(0, 13)];
  c.dtype = dtypes[pick(0, 3)];
  c.q_layout = layouts[pick(0, 4)];
  c.kv_layout = layouts[pick(0, 4)];
  if (coin(0.3)) c.input_std = 3.0;
  const int mask_choice = static_cast<int>(pick(0, 2));
  if (mask_choice == 0) {
    c.causal = coin(0.5);
  } else {
    c.mask = mask_choice == 1 ? MaskKind::kBool : MaskKind::kFloat;
    // Right-aligned rank 1..4 (..3 for 3-D), each dim full or broadcast.
    const Shape full = c.unbatched ? Shape{c.heads_q, c.q_len, c.kv_len}
                                   : Shape{c.batch, c.heads_q, c.q_len, c.kv_len};
    const int64_t rank = pick(1, static_cast<int64_t>(full.size()));
    for (int64_t d = static_cast<int64_t>(full.size()) - rank; d < static_cast<int64_t>(full.size());
         ++d) {
      c.mask_shape.push_back(coin(0.6) ? full[d] : 1);
    }
    const int64_t mr = static_cast<int64_t>(c.mask_shape.size());
    if (mr >= 2 && c.mask_shape[mr - 2] == c.q_len && c.q_len > 0 && coin(0.5)) {
      c.masked_rows = {pick(0, c.q_len - 1), pick(0, c.q_len - 1)};
    }
  }
  if (coin(0.3)) c.scale = std::uniform_real_distribution<double>(-1.0, 2.0)(rng);
  if (coin(0.25)) {
    c.dropout_p = 0.3;
    c.philox = {static_cast<uint64_t>(rng()), static_cast<uint64_t>(pick(0, 5))};
  }
  return c;
}

class RandomSweep : public ::testing::TestWithParam<int> {};

TEST_P(RandomSweep, EveryBackendMatchesReference) {
  SweepTally tally;
  constexpr int kCasesPerShard = 40;
  for (int n = 0; n < kCasesPerShard; ++n) {
    const Case c = random_case(static_cast<uint32_t>(GetParam() * 1000 + n));
    const CaseReport r = check_case(c);
    EXPECT_TRUE(r.ran_backend(SDPBackend::MATH)) << c.describe();
    if (c.dtype != DType::kFloat64) {
      EXPECT_TRUE(r.ran_backend(SDPBackend::FLASH_ATTENTION))
          << c.describe() << ": "
          << (r.not_supported.count(SDPBackend::FLASH_ATTENTION)
                  ? r.not_supported.at(SDPBackend::FLASH_ATTENTION)
                  : std::string());
    }
    tally.add(r);
  }
  tally.print("random shard " + std::to_string(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Shards, RandomSweep, ::testing::Range(0, 8));

}  // namespace
}  // namespace sdpa::test
