// attention_with_kvcache against a float64 reference written here from flash-attn's
// documented semantics (bottom-right causal / window per sequence length, ALiBi,
// soft-cap, rotary at cache_seqlens + i): ragged lengths 0 … 300, GQA, appends, both
// rotary layouts, strided caches, bfloat16; bad input refused with the caches untouched.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/capability.h"
#include "serving_util.h"
#include "sdpa/kv_cache.h"

namespace sdpa {
namespace {

using ::testing::HasSubstr;
using serving_test::int32s;
using serving_test::randn;

// cos / sin tables [positions, half] of RoPE with base 10000.
std::pair<Tensor, Tensor> rope_tables(int64_t positions, int64_t half) {
  Tensor c = Tensor::empty({positions, half}, DType::kFloat32);
  Tensor s = Tensor::empty({positions, half}, DType::kFloat32);
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t d = 0; d < half; ++d) {
      const double angle = static_cast<double>(p) * std::pow(10000.0, -static_cast<double>(d) / half);
      c.data<float>()[p * half + d] = static_cast<float>(std::cos(angle));
      s.data<float>()[p * half + d] = static_cast<float>(std::sin(angle));
    }
  }
  return {c, s};
}

// x [B, L, H, E] as doubles, row (b, i) rotated at position positions[b] + i * step.
std::vector<double> rotate_reference(const Tensor& x, const Tensor& cos, const Tensor& sin,
                                     const std::vector<int64_t>& positions, int64_t step,
                                     bool interleaved) {
  const int64_t B = x.size(0), L = x.size(1), H = x.size(2), E = x.size(3);
  const int64_t half = cos.size(1);
  std::vector<double> out(static_cast<size_t>(x.numel()));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < L; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        double* row = out.data() + ((b * L + i) * H + h) * E;
        for (int64_t e = 0; e < E; ++e) row[e] = x.item({b, i, h, e});
        const int64_t p = positions[static_cast<size_t>(b)] + i * step;
        for (int64_t d = 0; d < half; ++d) {
          const int64_t a = interleaved ? 2 * d : d, z = interleaved ? 2 * d + 1 : d + half;
          const double c = cos.item({p, d}), s = sin.item({p, d});
          const double xa = row[a], xz = row[z];
          row[a] = xa * c - xz * s;
          row[z] = xz * c + xa * s;
        }
      }
    }
  }
  return out;
}

struct Reference {
  std::vector<double> out;  // [B, L, Hq, Ev]
  std::vector<double> lse;  // [B, Hq, L]
};

// Dense float64 attention of q rows [B, L, Hq, E] over each sequence's first n[b] keys of
// k/v [B, S, Hkv, *] (doubles), with the options' mask, ALiBi and soft-cap.
Reference reference(const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, Shape q_shape, int64_t S, int64_t Hkv,
                    int64_t Ev, const std::vector<int64_t>& n, const KvCacheOptions& o) {
  const int64_t B = q_shape[0], L = q_shape[1], Hq = q_shape[2], E = q_shape[3];
  const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(E)));
  const double inf = std::numeric_limits<double>::infinity();
  Reference r{std::vector<double>(static_cast<size_t>(B * L * Hq * Ev), 0.0),
              std::vector<double>(static_cast<size_t>(B * Hq * L), -inf)};
  const int64_t right = o.causal ? 0 : o.window_right;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      for (int64_t i = 0; i < L; ++i) {
        const int64_t diagonal = i + n[static_cast<size_t>(b)] - L;
        std::vector<double> s(static_cast<size_t>(n[static_cast<size_t>(b)]), -inf);
        double max = -inf;
        for (int64_t j = 0; j < n[static_cast<size_t>(b)]; ++j) {
          if (right >= 0 && j > diagonal + right) continue;
          if (o.window_left >= 0 && j < diagonal - o.window_left) continue;
          double dot = 0;
          for (int64_t e = 0; e < E; ++e) {
            dot += q[static_cast<size_t>(((b * L + i) * Hq + h) * E + e)] *
                   k[static_cast<size_t>(((b * S + j) * Hkv + hk) * E + e)];
          }
          double score = dot * scale;
          if (o.softcap > 0) score = o.softcap * std::tanh(score / o.softcap);
          if (!o.alibi_slopes.empty()) {
            score -= o.alibi_slopes[static_cast<size_t>(h)] * std::abs(static_cast<double>(diagonal - j));
          }
          s[static_cast<size_t>(j)] = score;
          max = std::max(max, score);
        }
        if (max == -inf) continue;
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - max));
        r.lse[static_cast<size_t>((b * Hq + h) * L + i)] = max + std::log(sum);
        for (int64_t j = 0; j < n[static_cast<size_t>(b)]; ++j) {
          for (int64_t e = 0; e < Ev; ++e) {
            r.out[static_cast<size_t>(((b * L + i) * Hq + h) * Ev + e)] +=
                s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>(((b * S + j) * Hkv + hk) * Ev + e)];
          }
        }
      }
    }
  }
  return r;
}

std::vector<double> doubles(const Tensor& t) {
  const Tensor c = t.to(DType::kFloat64);
  return {c.data<double>(), c.data<double>() + c.numel()};
}

double max_error(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) && got[i] == want[i]) continue;
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  return worst;
}

struct Case {
  std::vector<int32_t> cached;  // cache_seqlens
  int64_t q_len = 1, new_len = 0, Hq = 4, Hkv = 2, E = 24, Ev = 24, S_max = 320;
  KvCacheOptions options;
  int64_t rotary_half = 0;
  DType dtype = DType::kFloat32;
  bool strided_cache = false;  // caches as permuted views of [B, Hkv, S_max, E] storage
  bool poison_past_lengths = false;  // NaN in every cache row past a sequence's keys
};

// Runs the case and checks out, lse and the caches against the float64 reference.
void check(Case c, double tolerance) {
  const int64_t B = static_cast<int64_t>(c.cached.size());
  const Tensor q = randn({B, c.q_len, c.Hq, c.E}, 1, c.dtype);
  Tensor k_cache, v_cache;
  if (c.strided_cache) {
    k_cache = randn({B, c.Hkv, c.S_max, c.E}, 2, c.dtype).transpose(1, 2);
    v_cache = randn({B, c.Hkv, c.S_max, c.Ev}, 3, c.dtype).transpose(1, 2);
  } else {
    k_cache = randn({B, c.S_max, c.Hkv, c.E}, 2, c.dtype);
    v_cache = randn({B, c.S_max, c.Hkv, c.Ev}, 3, c.dtype);
  }
  std::vector<int64_t> cached(c.cached.begin(), c.cached.end()), n = cached;
  for (int64_t b = 0; b < B && c.poison_past_lengths; ++b) {
    for (Tensor* cache : {&k_cache, &v_cache}) {
      Tensor rows = cache->select(0, b).slice(0, cached[static_cast<size_t>(b)] + c.new_len, c.S_max);
      rows.copy_(Tensor::full(rows.sizes(), std::numeric_limits<double>::quiet_NaN(), c.dtype));
    }
  }
  std::vector<double> k_want = doubles(k_cache.contiguous()), v_want = doubles(v_cache.contiguous());
  if (c.new_len > 0) {
    c.options.k_new = randn({B, c.new_len, c.Hkv, c.E}, 4, c.dtype);
    c.options.v_new = randn({B, c.new_len, c.Hkv, c.Ev}, 5, c.dtype);
  }
  if (c.rotary_half > 0) {
    std::tie(c.options.rotary_cos, c.options.rotary_sin) = rope_tables(c.S_max, c.rotary_half);
  }
  const bool own_positions = c.options.causal || c.options.window_left >= 0 || c.options.window_right >= 0;
  std::vector<double> q_ref = doubles(q);
  if (c.rotary_half > 0) {
    q_ref = rotate_reference(q, c.options.rotary_cos, c.options.rotary_sin, cached,
                             own_positions ? 1 : 0, c.options.rotary_interleaved);
  }
  if (c.new_len > 0) {
    std::vector<double> k_new = doubles(c.options.k_new), v_new = doubles(c.options.v_new);
    if (c.rotary_half > 0) {
      k_new = rotate_reference(c.options.k_new, c.options.rotary_cos, c.options.rotary_sin,
                               cached, 1, c.options.rotary_interleaved);
    }
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < c.new_len; ++i) {
        const int64_t row = b * c.S_max + cached[static_cast<size_t>(b)] + i;
        for (int64_t x = 0; x < c.Hkv * c.E; ++x) {
          // Rounded to the cache dtype, as the append stores it.
          const double value = k_new[static_cast<size_t>((b * c.new_len + i) * c.Hkv * c.E + x)];
          k_want[static_cast<size_t>(row * c.Hkv * c.E + x)] =
              Tensor::full({1}, value, c.dtype).item({0});
        }
        for (int64_t x = 0; x < c.Hkv * c.Ev; ++x) {
          v_want[static_cast<size_t>(row * c.Hkv * c.Ev + x)] =
              v_new[static_cast<size_t>((b * c.new_len + i) * c.Hkv * c.Ev + x)];
        }
      }
      n[static_cast<size_t>(b)] += c.new_len;
    }
  }
  const AttentionResult r = attention_with_kvcache(q, k_cache, v_cache, int32s(c.cached), c.options);
  ASSERT_EQ(r.out.sizes(), (Shape{B, c.q_len, c.Hq, c.Ev}));
  ASSERT_EQ(r.lse.sizes(), (Shape{B, c.Hq, c.q_len}));
  // Appended keys are exact copies, or rotated in float32 (one rounding per product).
  const double rotated_error = c.rotary_half > 0 ? 1e-6 : 0.0;
  EXPECT_LE(max_error(doubles(k_cache.contiguous()), k_want), rotated_error)
      << "k_cache after the append";
  EXPECT_EQ(max_error(doubles(v_cache.contiguous()), v_want), 0.0) << "v_cache after the append";
  const Reference want = reference(q_ref, k_want, v_want, q.sizes(), c.S_max, c.Hkv, c.Ev, n,
                                   c.options);
  EXPECT_LE(max_error(doubles(r.out), want.out), tolerance);
  EXPECT_LE(max_error(doubles(r.lse), want.lse), tolerance * 4);
}

TEST(KvCache, RaggedDecodeWithGqa) {
  Case c;
  c.cached = {1, 7, 65, 300, 0};
  check(c, 2e-5);
}

TEST(KvCache, AppendCausalChunkAcrossLengths) {
  Case c;
  c.cached = {0, 63, 257};
  c.q_len = 5;
  c.new_len = 5;
  c.options.causal = true;
  c.Ev = 17;
  check(c, 2e-5);
}

TEST(KvCache, QueriesLongerThanNewKeysSeeNothingBeyondTheCache) {
  Case c;  // L = 4 queries, 1 new key, causal: the first rows of short sequences see no key
  c.cached = {0, 2, 40};
  c.q_len = 4;
  c.new_len = 1;
  c.options.causal = true;
  check(c, 2e-5);
}

TEST(KvCache, RotaryHalvesAndPairs) {
  for (const bool interleaved : {false, true}) {
    for (const bool causal : {false, true}) {
      Case c;
      c.cached = {3, 64, 100};
      c.q_len = 2;
      c.new_len = 2;
      c.rotary_half = 8;  // rotary_dim 16 of E = 24
      c.options.rotary_interleaved = interleaved;
      c.options.causal = causal;
      SCOPED_TRACE(testing::Message() << "interleaved " << interleaved << " causal " << causal);
      check(c, 2e-5);
    }
  }
}

TEST(KvCache, WindowAlibiAndStridedCache) {
  Case c;
  c.cached = {10, 150, 299};
  c.q_len = 3;
  c.new_len = 1;
  c.options.window_left = 37;
  c.options.window_right = 0;
  c.options.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  c.strided_cache = true;
  check(c, 2e-5);
}

TEST(KvCache, SoftcapAndScale) {
  Case c;
  c.cached = {5, 129};
  c.q_len = 2;
  c.new_len = 2;
  c.options.softcap = 2.5;
  c.options.scale = 0.7;
  c.options.causal = true;
  check(c, 2e-5);
}

// flash-attn's order: the scores are capped, then ALiBi is added (one flex score_mod).
TEST(KvCache, SoftcapThenAlibi) {
  Case c;
  c.cached = {5, 129};
  c.q_len = 2;
  c.new_len = 2;
  c.options.softcap = 1.5;
  c.options.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  c.options.causal = true;
  check(c, 2e-5);
}

TEST(KvCache, BFloat16Cache) {
  Case c;
  c.cached = {1, 33, 200};
  c.new_len = 1;
  c.dtype = DType::kBFloat16;
  check(c, 2e-2);
}

// Rows past a sequence's keys hold NaN (never-written cache memory may hold anything): no
// kernel may let them into the output, also where it reads whole vectors or pairs of keys
// past the last visible one, or copies key tiles of several kv heads (8 kv heads of
// [B, S, Hkv, E] rows). Every capability, lengths ending inside and at the end of key
// tiles, a window that starts a chunk's keys inside a tile.
TEST(KvCache, RowsPastTheLengthsNeverReachTheOutput) {
  for (const std::string& capability : test::supported_capabilities()) {
    test::ScopedCapability scoped(capability);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(capability + " " + std::string(dtype_name(dtype)));
      Case c;
      c.cached = {1, 63, 64, 129, 300};
      c.Hq = 16;
      c.Hkv = 8;
      c.E = 40;
      c.Ev = 17;
      c.new_len = 1;
      c.options.causal = true;
      c.dtype = dtype;
      c.poison_past_lengths = true;
      check(c, dtype == DType::kBFloat16 ? 2e-2 : 2e-5);
      c.options.window_left = 70;
      check(c, dtype == DType::kBFloat16 ? 2e-2 : 2e-5);
    }
  }
}

// Every refused call leaves both caches bit for bit as they were.
TEST(KvCache, BadInputIsAnErrorAndWritesNothing) {
  const int64_t B = 2, S = 16, H = 2, E = 8;
  const Tensor q = randn({B, 1, H, E}, 1);
  Tensor k_cache = randn({B, S, H, E}, 2), v_cache = randn({B, S, H, E}, 3);
  const Tensor k_before = k_cache.clone(), v_before = v_cache.clone();
  KvCacheOptions append;
  append.k_new = randn({B, 3, H, E}, 4);
  append.v_new = randn({B, 3, H, E}, 5);
  const auto message = [&](const Tensor& seqlens, const KvCacheOptions& o) -> std::string {
    try {
      (void)attention_with_kvcache(q, k_cache, v_cache, seqlens, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_THAT(message(int32s({14, 2}), append),
              HasSubstr("cache_seqlens[0] = 14 with 3 new keys exceeds the cache's capacity of 16"));
  EXPECT_THAT(message(int32s({-1, 2}), append), HasSubstr("cache_seqlens[0] = -1 is negative"));
  EXPECT_THAT(message(Tensor::zeros({B}, DType::kInt64), append),
              HasSubstr("cache_seqlens: expected an int32 tensor [B], got int64"));
  EXPECT_THAT(message(int32s({1}), append), HasSubstr("cache_seqlens: expected shape [2]"));
  KvCacheOptions only_k;
  only_k.k_new = append.k_new;
  EXPECT_THAT(message(int32s({1, 2}), only_k), HasSubstr("k_new / v_new: expected both"));
  KvCacheOptions rotary = append;
  std::tie(rotary.rotary_cos, rotary.rotary_sin) = rope_tables(4, 2);
  EXPECT_THAT(message(int32s({1, 2}), rotary),
              HasSubstr("rotary_cos: sequence 1 needs positions [2, 4] but the tables hold 4"));
  KvCacheOptions bad_scale = append;
  bad_scale.scale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(message(int32s({1, 2}), bad_scale), "accepted");
  KvCacheOptions wrong_heads = append;
  wrong_heads.k_new = randn({B, 3, H + 1, E}, 4);
  EXPECT_THAT(message(int32s({1, 2}), wrong_heads), HasSubstr("k_new: expected the cache's kv head count"));
  EXPECT_EQ(std::memcmp(k_cache.data_ptr(), k_before.data_ptr(), k_cache.numel() * 4), 0);
  EXPECT_EQ(std::memcmp(v_cache.data_ptr(), v_before.data_ptr(), v_cache.numel() * 4), 0);
}

TEST(KvCache, RotaryMatchesTheDirectFormula) {
  const Tensor x = randn({2, 3, 2, 10}, 9);
  const auto [cos, sin] = rope_tables(12, 4);
  for (const bool interleaved : {false, true}) {
    const Tensor y = x.clone();
    apply_rotary_embedding(y, cos, sin, {2, 8}, 1, interleaved);
    EXPECT_LE(max_error(doubles(y), rotate_reference(x, cos, sin, {2, 8}, 1, interleaved)), 1e-6);
  }
}

}  // namespace
}  // namespace sdpa
