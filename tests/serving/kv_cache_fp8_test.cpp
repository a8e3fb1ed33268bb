// attention_with_kvcache on float8_e4m3fn caches with per-head scales: against a float64
// reference (MATH in float64 over the dequantized cache: code value x scale, exact in
// float64), on every CPU capability, contiguous and paged (page sizes 1, 16, 64, shuffled),
// decode and chunked prefill (the split-KV decode path and the FLASH forward), GQA, ragged
// lengths, head dims whose rows end in a partial vector, strided caches, appends that
// quantize k_new / v_new, NaN codes; bad input refused with nothing written.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/capability.h"
#include "sdpa/attn_bias.h"
#include "sdpa/kv_cache.h"
#include "serving_util.h"

namespace sdpa {
namespace {

using ::testing::HasSubstr;
using serving_test::int32s;
using serving_test::max_abs_diff;
using serving_test::randn;

// A float8 copy of normal values spread over E4M3's range (times 2^-8 ... 2^2, so codes
// from subnormals to the tens occur).
Tensor float8_values(const Shape& shape, uint32_t seed) {
  Tensor x = randn(shape, seed, DType::kFloat64);
  std::mt19937 rng(seed + 100);
  std::uniform_int_distribution<int> exponent(-8, 2);
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.data<double>()[i] = std::ldexp(x.data<double>()[i], exponent(rng));
  }
  return x.to(DType::kFloat8E4M3FN);
}

Tensor scales(std::vector<float> values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::kFloat32);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

// cache [.., Hkv, D] (float8) times scale[h], in float64.
Tensor dequantize(const Tensor& cache, const Tensor& scale) {
  Tensor out = cache.to(DType::kFloat64).contiguous();
  const int64_t heads = cache.size(2), dim = cache.size(3);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const int64_t h = i / dim % heads;
    out.data<double>()[i] *= scale.dim() == 0 ? scale.item({}) : scale.item({h});
  }
  return out;
}

double max_abs(const Tensor& a) {
  const Tensor x = a.to(DType::kFloat64).contiguous();
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::isfinite(x.data<double>()[i])) worst = std::max(worst, std::abs(x.data<double>()[i]));
  }
  return worst;
}

struct Case {
  std::vector<int32_t> cached = {0, 1, 15, 64, 65, 190};
  int64_t q_len = 1, Hq = 8, Hkv = 2, E = 40, Ev = 24, S_max = 256;
  bool causal = false;
  bool per_head_scales = true;
  bool strided = false;  // caches as permuted views: rows not of unit stride
  DType dtype = DType::kFloat32;
};

// out and lse of each sequence by MATH in float64 over its first n keys of the dequantized
// caches k / v [B, S_max, Hkv, D] (causal: aligned bottom-right).
AttentionResult reference(const Case& c, const Tensor& q, const Tensor& k, const Tensor& v,
                          const std::vector<int64_t>& n) {
  const int64_t B = q.size(0);
  AttentionResult want;
  want.out = Tensor::zeros({B, c.q_len, c.Hq, c.Ev}, DType::kFloat64);
  want.lse = Tensor::zeros({B, c.Hq, c.q_len}, DType::kFloat64);
  const Tensor q64 = q.to(DType::kFloat64);
  sdpa_kernel guard(SDPBackend::MATH);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = n[static_cast<size_t>(b)];
    SDPAOptions o;
    o.enable_gqa = true;
    if (c.causal) o.attn_mask = causal_lower_right(c.q_len, len);
    const auto rows = [&](const Tensor& t, int64_t count) {
      return t.select(0, b).slice(0, 0, count).transpose(0, 1).unsqueeze(0);
    };
    const AttentionResult r = scaled_dot_product_attention_with_lse(
        rows(q64, c.q_len), rows(k, len), rows(v, len), o);
    want.out.select(0, b).copy_(r.out.select(0, 0).transpose(0, 1));
    want.lse.select(0, b).copy_(r.lse.select(0, 0));
  }
  return want;
}

// The caches of a case as float8 [B, S_max, Hkv, D] tensors (strided: views of
// [B, S_max, D, Hkv] storage).
Tensor float8_cache(const Case& c, int64_t dim, uint32_t seed) {
  const int64_t B = static_cast<int64_t>(c.cached.size());
  if (!c.strided) return float8_values({B, c.S_max, c.Hkv, dim}, seed);
  return float8_values({B, c.S_max, dim, c.Hkv}, seed).transpose(2, 3);
}

// Runs the case with `new_len` appended rows on contiguous caches and on paged copies of
// each page size against the float64 reference; `tolerance` is relative to the largest
// |out| and |lse|.
void check(const Case& c, int64_t new_len, std::vector<int64_t> page_sizes, double tolerance) {
  const int64_t B = static_cast<int64_t>(c.cached.size());
  const Tensor q = randn({B, c.q_len, c.Hq, c.E}, 1, c.dtype);
  Tensor k = float8_cache(c, c.E, 2), v = float8_cache(c, c.Ev, 3);
  KvCacheOptions o;
  o.causal = c.causal;
  o.k_scale = c.per_head_scales ? scales({0.37f, 2.5f}) : Tensor::full({}, 0.75, DType::kFloat32);
  o.v_scale = c.per_head_scales ? scales({1.75f, 0.0625f}) : Tensor::full({}, 3.0, DType::kFloat32);
  if (new_len > 0) {
    o.k_new = randn({B, new_len, c.Hkv, c.E}, 4, c.dtype);
    o.v_new = randn({B, new_len, c.Hkv, c.Ev}, 5, c.dtype);
  }
  std::vector<int64_t> n(c.cached.begin(), c.cached.end());
  for (int64_t& x : n) x += new_len;

  // Expected caches after the append: float8(x / scale) at the new rows.
  Tensor k_want = k.clone(), v_want = v.clone();
  for (int64_t b = 0; b < B && new_len > 0; ++b) {
    for (const auto& [want, rows, scale] : {std::tuple{&k_want, &o.k_new, &o.k_scale},
                                            std::tuple{&v_want, &o.v_new, &o.v_scale}}) {
      Tensor block = want->select(0, b).slice(0, c.cached[static_cast<size_t>(b)],
                                                    c.cached[static_cast<size_t>(b)] + new_len);
      for (int64_t i = 0; i < new_len; ++i) {
        for (int64_t h = 0; h < c.Hkv; ++h) {
          for (int64_t e = 0; e < block.size(2); ++e) {
            const double s = scale->dim() == 0 ? scale->item({}) : scale->item({h});
            const int64_t at[] = {i, h, e};
            block.set_item(at, static_cast<float>(float8_e4m3fn(
                                   static_cast<float>(rows->item({b, i, h, e}) / s))));
          }
        }
      }
    }
  }
  const AttentionResult want =
      reference(c, q, dequantize(k_want, o.k_scale), dequantize(v_want, o.v_scale), n);
  const double out_tolerance = tolerance * std::max(1.0, max_abs(want.out));
  const double lse_tolerance = tolerance * std::max(1.0, max_abs(want.lse));

  for (const std::string& capability : test::supported_capabilities()) {
    SCOPED_TRACE("capability " + capability);
    const test::ScopedCapability level(capability);
    const Tensor k_run = c.strided ? k.transpose(2, 3).clone().transpose(2, 3) : k.clone();
    const Tensor v_run = c.strided ? v.transpose(2, 3).clone().transpose(2, 3) : v.clone();
    const AttentionResult got = attention_with_kvcache(q, k_run, v_run, int32s(c.cached), o);
    EXPECT_EQ(max_abs_diff(k_run, k_want), 0.0) << "k_cache after the append";
    EXPECT_EQ(max_abs_diff(v_run, v_want), 0.0) << "v_cache after the append";
    EXPECT_LE(max_abs_diff(got.out, want.out), out_tolerance);
    EXPECT_LE(max_abs_diff(got.lse, want.lse), lse_tolerance);

    for (int64_t page_size : page_sizes) {
      SCOPED_TRACE("page_size " + std::to_string(page_size));
      const int64_t per_seq = c.S_max / page_size, num_pages = B * per_seq + 2;
      std::vector<int32_t> ids(static_cast<size_t>(num_pages));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), std::mt19937(9));
      const Tensor table = int32s({ids.begin(), ids.begin() + B * per_seq}, {B, per_seq});
      Tensor k_pool = float8_values({num_pages, page_size, c.Hkv, c.E}, 11);
      Tensor v_pool = float8_values({num_pages, page_size, c.Hkv, c.Ev}, 12);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < per_seq; ++i) {
          const int64_t id = table.item({b, i});
          k_pool.select(0, id).copy_(k.select(0, b).slice(0, i * page_size, (i + 1) * page_size));
          v_pool.select(0, id).copy_(v.select(0, b).slice(0, i * page_size, (i + 1) * page_size));
        }
      }
      KvCacheOptions paged = o;
      paged.block_table = table;
      const AttentionResult r = attention_with_kvcache(q, k_pool, v_pool, int32s(c.cached), paged);
      EXPECT_LE(max_abs_diff(r.out, want.out), out_tolerance);
      EXPECT_LE(max_abs_diff(r.lse, want.lse), lse_tolerance);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t at = c.cached[static_cast<size_t>(b)];
        for (int64_t j = at; j < at + new_len; ++j) {
          const int64_t id = table.item({b, j / page_size});
          EXPECT_EQ(max_abs_diff(k_pool.select(0, id).select(0, j % page_size),
                                 k_want.select(0, b).select(0, j)), 0.0);
          EXPECT_EQ(max_abs_diff(v_pool.select(0, id).select(0, j % page_size),
                                 v_want.select(0, b).select(0, j)), 0.0);
        }
      }
    }
  }
}

TEST(Float8KvCache, DecodeWithPerHeadScales) { check(Case{}, 0, {1, 16, 64}, 1e-5); }

TEST(Float8KvCache, DecodeWithOneScaleAndHeadDim128) {
  Case c;
  c.per_head_scales = false;
  c.E = c.Ev = 128;
  c.cached = {300, 7, 1000};
  c.S_max = 1024;
  check(c, 0, {16}, 1e-5);
}

TEST(Float8KvCache, AppendQuantizesNewRows) {
  Case c;
  c.q_len = 2;
  c.causal = true;
  check(c, 2, {1, 16}, 1e-5);
}

// 5 queries x 4 heads per kv head exceed the decode path's rows: the FLASH forward.
TEST(Float8KvCache, ChunkedPrefillTakesTheFlashForward) {
  Case c;
  c.q_len = 5;
  c.causal = true;
  check(c, 5, {16}, 1e-5);
}

TEST(Float8KvCache, StridedCacheRows) {
  Case c;
  c.strided = true;
  check(c, 1, {}, 1e-5);
}

// bfloat16 queries on AVX512_BF16 CPUs take vdpbf16ps with the codes widened to bf16
// (exact) and P rounded to bf16; float16 ones the float32 path. Head dims 40 / 24 end in
// partial vectors (masked loads), 128 takes the four-row score kernel.
TEST(Float8KvCache, HalfPrecisionQueries) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int64_t dim : {40, 128}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " E " + std::to_string(dim));
      Case c;
      c.dtype = dtype;
      c.E = dim;
      c.Ev = dim == 40 ? 24 : dim;
      // The output rounded to q's dtype (and bf16 P): one ulp.
      check(c, 1, {16}, dtype == DType::kBFloat16 ? 1.0 / 128 : 1.0 / 1024);
    }
  }
}

// A NaN code in a visible key or value makes its sequence's output NaN, as a NaN in a
// float cache does; other sequences are untouched.
TEST(Float8KvCache, NaNCodesReachTheOutput) {
  for (const std::string& capability : test::supported_capabilities()) {
    SCOPED_TRACE("capability " + capability);
    const test::ScopedCapability level(capability);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (const auto& [in_values, nan_code] : {std::pair{false, 0x7F}, std::pair{true, 0xFF}}) {
        Tensor k = float8_values({2, 64, 1, 32}, 2), v = float8_values({2, 64, 1, 32}, 3);
        (in_values ? v : k).select(0, 0).select(0, 5).select(0, 0).data<float8_e4m3fn>()[3].bits =
            static_cast<uint8_t>(nan_code);
        const AttentionResult r = attention_with_kvcache(randn({2, 1, 4, 32}, 1, dtype), k, v,
                                                         int32s({40, 40}));
        EXPECT_TRUE(std::isnan(r.out.select(0, 0).item({0, 0, 3})));
        EXPECT_FALSE(std::isnan(r.out.select(0, 1).item({0, 0, 3})));
      }
    }
  }
}

// Every code, as a key and as a value, through the decode path on every capability:
// sequences of one cached row, whose output is that value row and whose logsumexp is the
// one score, q . k times the softmax scale. Rows 0-3 (Hkv=2, E=32) hold the 254 finite
// codes in order (then two zeros); query head i of each group of 8 is one-hot at element
// offset + i, so four calls read every key element once. Row 4 holds the NaN codes 0x7F
// and 0xFF: a NaN anywhere in a key row makes every score of its heads NaN (0 x NaN is
// NaN), so row 4's outputs and logsumexps are NaN. float32 queries take the float32 path,
// bfloat16 ones vdpbf16ps where the CPU has it.
TEST(Float8KvCache, EveryCodeAsKeyAndValue) {
  const int64_t B = 5, Hkv = 2, G = 8, E = 32;
  Tensor cache = Tensor::zeros({B, 1, Hkv, E}, DType::kFloat8E4M3FN);
  float8_e4m3fn* codes = cache.data<float8_e4m3fn>();
  int64_t next = 0;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) != 0x7F) codes[next++].bits = static_cast<uint8_t>(code);
  }
  codes[(B - 1) * Hkv * E].bits = 0x7F;
  codes[(B - 1) * Hkv * E + E + 1].bits = 0xFF;
  KvCacheOptions o;
  o.k_scale = Tensor::full({}, 1.0, DType::kFloat32);
  o.v_scale = Tensor::full({}, 1.0, DType::kFloat32);
  const double softmax_scale = 1.0 / std::sqrt(static_cast<double>(E));
  for (const std::string& capability : test::supported_capabilities()) {
    SCOPED_TRACE("capability " + capability);
    const test::ScopedCapability level(capability);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(dtype_name(dtype));
      for (int64_t offset = 0; offset < E; offset += G) {
        Tensor q = Tensor::zeros({B, 1, Hkv * G, E}, DType::kFloat32);
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t h = 0; h < Hkv * G; ++h) {
            const int64_t at[] = {b, 0, h, offset + h % G};
            q.set_item(at, 1.0);
          }
        }
        const AttentionResult r =
            attention_with_kvcache(q.to(dtype), cache, cache, int32s({1, 1, 1, 1, 1}), o);
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t h = 0; h < Hkv * G; ++h) {
            const float8_e4m3fn* row = codes + (b * Hkv + h / G) * E;
            const double lse = r.lse.item({b, h, 0});
            if (b == B - 1) {
              EXPECT_TRUE(std::isnan(lse)) << "NaN key row, head " << h;
              for (int64_t e = 0; e < E; ++e) EXPECT_TRUE(std::isnan(r.out.item({b, 0, h, e})));
              continue;
            }
            const double key = static_cast<float>(row[offset + h % G]);
            EXPECT_NEAR(lse, key * softmax_scale, 1e-6 * std::max(1.0, std::abs(key)))
                << "key code " << int{row[offset + h % G].bits};
            for (int64_t e = 0; e < E; ++e) {
              EXPECT_EQ(r.out.item({b, 0, h, e}), static_cast<float>(row[e]))
                  << "value code " << int{row[e].bits};
            }
          }
        }
      }
    }
  }
}

TEST(Float8KvCache, BadInputIsAnErrorAndWritesNothing) {
  const Tensor q = randn({2, 1, 4, 16}, 1);
  const Tensor k = float8_values({2, 32, 2, 16}, 2), v = float8_values({2, 32, 2, 16}, 3);
  const Tensor k_before = k.clone(), v_before = v.clone();
  const Tensor seqlens = int32s({4, 9});
  const auto expect_error = [&](KvCacheOptions o, const Tensor& k_cache, const Tensor& v_cache,
                                const std::string& message) {
    o.k_new = randn({2, 1, 2, 16}, 4);
    o.v_new = randn({2, 1, 2, 16}, 5);
    try {
      attention_with_kvcache(q, k_cache, v_cache, seqlens, o);
      ADD_FAILURE() << "no error; expected " << message;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(message));
    }
    EXPECT_EQ(max_abs_diff(k, k_before), 0.0);
    EXPECT_EQ(max_abs_diff(v, v_before), 0.0);
  };
  KvCacheOptions o;
  o.k_scale = scales({1.0f, 2.0f, 3.0f});
  expect_error(o, k, v, "k_scale: expected a CPU float32 tensor [] or [Hkv = 2]");
  o.k_scale = scales({1.0f, -2.0f});
  expect_error(o, k, v, "k_scale[1] = -2: expected a finite scale > 0");
  o.k_scale = {};
  o.v_scale = scales({std::numeric_limits<float>::infinity(), 1.0f});
  expect_error(o, k, v, "v_scale[0] = inf: expected a finite scale > 0");
  o.v_scale = Tensor::full({}, 1.0, DType::kFloat64);
  expect_error(o, k, v, "v_scale: expected a CPU float32 tensor");
  expect_error(KvCacheOptions{}, k, v.to(DType::kFloat32),
               "v_cache: expected q's dtype float32 or float8_e4m3fn (k_cache and v_cache alike), "
               "got float32");
  KvCacheOptions float_cache;
  float_cache.k_scale = scales({1.0f, 1.0f});
  const Tensor k32 = k.to(DType::kFloat32), v32 = v.to(DType::kFloat32);
  EXPECT_THROW(
      {
        try {
          attention_with_kvcache(q, k32, v32, seqlens, float_cache);
        } catch (const Error& e) {
          EXPECT_THAT(e.what(), HasSubstr("k_scale: only float8_e4m3fn caches take scales"));
          throw;
        }
      },
      Error);
  // A float8 tensor is not an attention input.
  EXPECT_THROW(scaled_dot_product_attention(k, k, v), Error);
}

TEST(Float8KvCache, AppendPagedQuantizes) {
  const Tensor k_pool = float8_values({5, 4, 2, 8}, 1), v_pool = float8_values({5, 4, 2, 8}, 2);
  const Tensor k_new = randn({1, 3, 2, 8}, 3), v_new = randn({1, 3, 2, 8}, 4);
  const Tensor k_scale = scales({0.5f, 0.125f}), v_scale = Tensor::full({}, 4.0, DType::kFloat32);
  append_paged_kv_cache(k_new, v_new, k_pool, v_pool, int32s({3, 1}, {1, 2}), int32s({2}), k_scale,
                        v_scale);
  // Positions 2, 3 are page 3's rows 2, 3; position 4 is page 1's row 0.
  const int64_t pages[] = {3, 3, 1}, rows[] = {2, 3, 0};
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t e = 0; e < 8; ++e) {
        const float k_code = static_cast<float>(float8_e4m3fn(
            static_cast<float>(k_new.item({0, i, h, e}) / k_scale.item({h}))));
        const float v_code =
            static_cast<float>(float8_e4m3fn(static_cast<float>(v_new.item({0, i, h, e}) / 4.0)));
        EXPECT_EQ(k_pool.item({pages[i], rows[i], h, e}), k_code);
        EXPECT_EQ(v_pool.item({pages[i], rows[i], h, e}), v_code);
      }
    }
  }
}

}  // namespace
}  // namespace sdpa
