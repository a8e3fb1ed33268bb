// float32 accuracy of long rows: FLASH (and MATH) against the float64 reference, on the
// patterns where float32 rounding compounds over the keys. The bounds are twice the error
// of PyTorch's own float32 CPU SDPA on the same shape kinds (measured with torch 2.15
// against its float64 result; see docs/design.md, "Accuracy of long rows"). The error is
// max |out - ref| / max |ref| over the whole output.
//
// What they guard against: a rescale factor exp(m - m) that is not exactly 1 (each key
// tile that leaves the running max unchanged multiplied the accumulators by 1 + 2^-23:
// 4.5e-5 after 1000 masked tiles) and output accumulators that round once per key
// (9.3e-6 at S = 65536) instead of once per key tile.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/capability.h"
#include "common/reference.h"
#include "sdpa/attn_bias.h"
#include "sdpa/sdpa.h"

namespace sdpa::test {
namespace {

Tensor normal_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

double relative_error(const Tensor& out, const std::vector<double>& ref) {
  const std::vector<double> got = to_doubles(out);
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return worst / scale;
}

struct LongRowCase {
  const char* name;
  int64_t heads_q, heads_kv, q_len, kv_len;
  AttnMask mask;   // as the library receives it
  Tensor ref_mask;  // the same mask for the reference (float64 additive or bool)
  double bound;
};

// Runs the case on FLASH at every capability level and on MATH.
void check_long_rows(const LongRowCase& c) {
  SCOPED_TRACE(c.name);
  constexpr int64_t kHeadDim = 64;
  const Tensor q = normal_tensor({1, c.heads_q, c.q_len, kHeadDim}, 1);
  const Tensor k = normal_tensor({1, c.heads_kv, c.kv_len, kHeadDim}, 2);
  const Tensor v = normal_tensor({1, c.heads_kv, c.kv_len, kHeadDim}, 3);
  ReferenceOptions ref_options;
  ref_options.mask = c.ref_mask;
  const std::vector<double> ref = reference_attention(q, k, v, ref_options).out;
  SDPAOptions options;
  options.attn_mask = c.mask;
  options.enable_gqa = c.heads_q != c.heads_kv;
  for (const std::string& level : supported_capabilities()) {
    SCOPED_TRACE(level);
    ScopedCapability forced(level);
    sdpa_kernel only(SDPBackend::FLASH_ATTENTION);
    EXPECT_LE(relative_error(scaled_dot_product_attention(q, k, v, options), ref), c.bound);
  }
  sdpa_kernel only(SDPBackend::MATH);
  EXPECT_LE(relative_error(scaled_dot_product_attention(q, k, v, options), ref), c.bound);
}

// transformers' StaticCache: 300 filled slots at the front of a long cache, the rest
// hidden by a bool mask. torch: 4.7e-7 (q_len 100) at S = 65536.
TEST(Accuracy, StaticCacheMaskDoesNotDriftWithTheHiddenKeys) {
  constexpr int64_t kL = 64, kS = 65536;
  Tensor keep = Tensor::empty({1, 1, kL, kS}, DType::kBool);
  for (int64_t i = 0; i < kL; ++i) {
    for (int64_t j = 0; j < kS; ++j) keep.data<bool>()[i * kS + j] = j < 300;
  }
  check_long_rows({"static cache", 2, 2, kL, kS, AttnMask(keep), keep, 1e-6});
}

// An unmasked decode step (q_len 1, GQA: the split-KV path). torch: 4.7e-6 at S = 65536.
TEST(Accuracy, UnmaskedDecodeRowsOf65536Keys) {
  check_long_rows({"decode", 4, 2, 1, 65536, AttnMask(), Tensor(), 1.8e-6});
}

// Every mask kind at S = 8192 (torch: 4.9e-7 unmasked, 7.5e-7 with a bool mask).
TEST(Accuracy, EveryMaskKindAt8192Keys) {
  constexpr int64_t kH = 2, kL = 96, kS = 8192;
  const BiasShape shape{1, kH, kL, kS};
  const std::vector<AttnBiasPtr> biases = {
      causal_lower_right(kL, kS),
      std::make_shared<LocalAttentionBias>(2000, 0),
      std::make_shared<AlibiBias>(kH),
      std::make_shared<BlockDiagonalBias>(std::vector<int64_t>{0, 40, kL},
                                          std::vector<int64_t>{0, 3000, kS}),
      std::make_shared<PaddedKeysBias>(std::vector<int64_t>{5000}),
  };
  for (const AttnBiasPtr& bias : biases) {
    const std::string name = bias->describe();
    check_long_rows({name.c_str(), kH, kH, kL, kS, AttnMask(bias),
                     bias->materialize(shape, DType::kFloat64), 1.5e-6});
  }
  // A float mask of small random values, broadcast over the heads.
  Tensor additive = normal_tensor({1, 1, kL, kS}, 4);
  for (int64_t i = 0; i < additive.numel(); ++i) additive.data<float>()[i] *= 0.5f;
  check_long_rows({"float mask", kH, kH, kL, kS, AttnMask(additive), additive, 1.5e-6});
}

}  // namespace
}  // namespace sdpa::test
