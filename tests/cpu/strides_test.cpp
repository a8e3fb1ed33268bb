// Unusual but valid memory layouts on every backend: zero strides (k/v broadcast over the
// batch, a query expanded over heads), negative strides (from_blob over reversed rows),
// non-contiguous and expanded masks, and concurrent calls from several threads.

#include <gtest/gtest.h>

#include <thread>

#include "common/harness.h"

namespace sdpa::test {
namespace {

void expect_math_and_flash_ran(const CaseReport& r, const std::string& what) {
  EXPECT_TRUE(r.ran_backend(SDPBackend::MATH)) << what;
  EXPECT_TRUE(r.ran_backend(SDPBackend::FLASH_ATTENTION))
      << what << ": "
      << (r.not_supported.count(SDPBackend::FLASH_ATTENTION)
              ? r.not_supported.at(SDPBackend::FLASH_ATTENTION)
              : std::string());
}

CaseInputs finish(Tensor q, Tensor k, Tensor v, SDPAOptions o, Tensor mask = {}) {
  CaseInputs in;
  in.q = std::move(q);
  in.k = std::move(k);
  in.v = std::move(v);
  in.mask = mask;
  if (mask.defined()) o.attn_mask = mask;
  in.options = o;
  ReferenceOptions ro;
  ro.mask = mask;
  ro.causal = o.is_causal;
  ro.scale = o.scale;
  in.ref = reference_attention(in.q, in.k, in.v, ro);
  return in;
}

// K and V shared by every batch element (stride 0 over B); q expanded over heads.
TEST(Strides, ZeroStrideBroadcastInputs) {
  std::mt19937 rng(1);
  const Tensor k1 = random_tensor({1, 2, 70, 24}, DType::kFloat32, Layout::kBHSD, rng);
  const Tensor v1 = random_tensor({1, 2, 70, 40}, DType::kFloat32, Layout::kBSHD, rng);
  const Tensor q1 = random_tensor({3, 1, 65, 24}, DType::kFloat32, Layout::kBHSD, rng);
  for (bool causal : {false, true}) {
    SDPAOptions o;
    o.is_causal = causal;
    const CaseInputs in = finish(q1.expand({3, 2, 65, 24}), k1.expand({3, 2, 70, 24}),
                                 v1.expand({3, 2, 70, 40}), o);
    EXPECT_EQ(in.k.stride(0), 0);
    expect_math_and_flash_ran(check_inputs(in, DType::kFloat32, false, "zero strides"),
                              "zero strides");
  }
}

// from_blob over the last row with a negative sequence stride: rows in reverse order.
TEST(Strides, NegativeSequenceStride) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::mt19937 rng(2);
    const int64_t S = 77, E = 24;
    const Tensor kbuf = random_tensor({1, 1, S, E}, dtype, Layout::kBHSD, rng);
    const Tensor vbuf = random_tensor({1, 1, S, E}, dtype, Layout::kBHSD, rng);
    const auto esz = static_cast<int64_t>(element_size(dtype));
    auto reversed = [&](const Tensor& buf) {
      char* last = static_cast<char*>(buf.data_ptr()) + (S - 1) * E * esz;
      return Tensor::from_blob(last, {1, 1, S, E}, {S * E, S * E, -E, 1}, dtype, {},
                               buf.storage());
    };
    const Tensor q = random_tensor({1, 1, 33, E}, dtype, Layout::kBSHD, rng);
    SDPAOptions o;
    o.is_causal = true;
    const CaseInputs in = finish(q, reversed(kbuf), reversed(vbuf), o);
    EXPECT_EQ(in.k.item({0, 0, 0, 3}), kbuf.item({0, 0, S - 1, 3}));
    expect_math_and_flash_ran(check_inputs(in, dtype, false, "negative strides"),
                              "negative strides");
  }
}

TEST(Strides, NonContiguousAndExpandedMasks) {
  std::mt19937 rng(3);
  const Tensor q = random_tensor({2, 4, 65, 64}, DType::kFloat32, Layout::kBSHD, rng);
  const Tensor k = random_tensor({2, 4, 63, 64}, DType::kFloat32, Layout::kBSHD, rng);
  const Tensor v = random_tensor({2, 4, 63, 64}, DType::kFloat32, Layout::kBSHD, rng);
  // A float mask stored [S, L] and transposed; a bool mask expanded to the full shape.
  const Tensor stored = random_tensor({1, 1, 63, 65}, DType::kFloat32, Layout::kBHSD, rng);
  const Tensor transposed = stored.select(0, 0).select(0, 0).transpose(0, 1);  // [65, 63]
  const Tensor keep = Tensor::empty({1, 4, 1, 63}, DType::kBool);
  std::vector<double> bits(4 * 63);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = (i * 7) % 5 != 0;
  fill_from_doubles(keep, bits);
  const Tensor expanded = keep.expand({2, 4, 65, 63});
  const Tensor sliced = Tensor::zeros({2, 4, 65, 126}, DType::kFloat32).slice(3, 0, 126, 2);
  for (const Tensor& mask : {transposed, expanded, sliced}) {
    const CaseInputs in = finish(q, k, v, {}, mask);
    const std::string what = "mask " + mask.describe();
    expect_math_and_flash_ran(check_inputs(in, DType::kFloat32, false, what), what);
  }
}

// float16 inputs whose dot products overflow float16 (but not float32, where the library
// computes); the softmax is nearly one-hot.
TEST(Magnitudes, Float16DotProductsBeyondFloat16Range) {
  Case c;
  c.heads_q = c.heads_kv = 2;
  c.q_len = 40;
  c.kv_len = 90;
  c.head_dim = 64;
  c.dtype = DType::kFloat16;
  c.input_std = 60.0;  // |q.k| ~ 60^2 * 8 = 28800 typical, far beyond for the largest
  c.scale = 1.0 / 64;
  const CaseReport r = check_case(c);
  expect_math_and_flash_ran(r, c.describe());
}

TEST(Magnitudes, LargeScaleNeedsTheRunningMax) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    Case c;
    c.heads_q = c.heads_kv = 1;
    c.q_len = 70;
    c.kv_len = 300;
    c.head_dim = 24;
    c.dtype = dtype;
    c.scale = 50.0;  // scores in the hundreds: exp() overflows without max subtraction
    expect_math_and_flash_ran(check_case(c), c.describe());
  }
}

// Scores that rise along the keys by a float mask's ramp (as ALiBi's do toward the
// diagonal): by 0.05 a key (3.2 a key tile, under the bf16 AMX path's lazy-max slack, so a
// row keeps its max for several tiles and P reaches e^5.5) and by 0.2 a key (12.8 a tile:
// every tile raises every row's max, and the waiting grouped P.v runs before each
// rescale); S = 333 leaves a partial group of tiles and a partial tile; L = 70 a partial
// q-block.
TEST(Magnitudes, ScoresRisingAlongTheKeys) {
  const int64_t L = 70, S = 333, E = 40;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (double ramp : {0.05, 0.2}) {
      std::mt19937 rng(5);
      const Tensor q = random_tensor({2, 3, L, E}, dtype, Layout::kBHSD, rng);
      const Tensor k = random_tensor({2, 3, S, E}, dtype, Layout::kBHSD, rng);
      const Tensor v = random_tensor({2, 3, S, E}, dtype, Layout::kBHSD, rng);
      Tensor mask = Tensor::empty({L, S}, dtype);
      std::vector<double> bias(static_cast<size_t>(L * S));
      for (int64_t i = 0; i < L; ++i) {
        for (int64_t j = 0; j < S; ++j) bias[static_cast<size_t>(i * S + j)] = ramp * j - i % 7;
      }
      fill_from_doubles(mask, bias);
      const std::string what = std::string(dtype_name(dtype)) + " ramp " + std::to_string(ramp);
      expect_math_and_flash_ran(check_inputs(finish(q, k, v, {}, mask), dtype, false, what), what);
    }
  }
}

// Several user threads calling at once (each call runs its own OpenMP region).
TEST(Concurrency, SimultaneousCallsGiveTheSequentialResults) {
  Case c;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.enable_gqa = true;
  c.q_len = 130;
  c.kv_len = 150;
  c.causal = true;
  const CaseInputs in = make_inputs(c);
  for (SDPBackend b : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    std::vector<double> expected;
    {
      sdpa_kernel guard(b);
      expected = to_doubles(scaled_dot_product_attention(in.q, in.k, in.v, in.options));
    }
    std::vector<std::vector<double>> got(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        sdpa_kernel guard(b);
        for (int rep = 0; rep < 3; ++rep) {
          got[t] = to_doubles(scaled_dot_product_attention(in.q, in.k, in.v, in.options));
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], expected) << backend_name(b) << " thread " << t;
  }
}

}  // namespace
}  // namespace sdpa::test
