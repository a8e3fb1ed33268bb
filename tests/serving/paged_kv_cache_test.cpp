// attention_with_kvcache on a paged cache (block_table): the same results as on the
// contiguous caches holding the same rows (which kv_cache_test checks against a float64
// reference), with pages shuffled through the pool, page sizes 1 ... 256, ragged lengths,
// appends that cross page boundaries, GQA, decode and chunked-prefill shapes, every dtype,
// every CPU capability and MATH; bad block tables refused with nothing written.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/capability.h"
#include "serving_util.h"
#include "sdpa/kv_cache.h"

namespace sdpa {
namespace {

using ::testing::HasSubstr;
using serving_test::int32s;
using serving_test::max_abs_diff;
using serving_test::randn;

// A paged copy of contiguous caches [B, S_max, Hkv, D]: pages shuffled through a pool
// with spare pages, the table [B, S_max / page_size].
struct Paged {
  Tensor k_pool, v_pool, table;
};

Paged page(const Tensor& k, const Tensor& v, int64_t page_size, uint32_t seed) {
  const int64_t B = k.size(0), pages_per_seq = k.size(1) / page_size;
  const int64_t num_pages = B * pages_per_seq + 3;
  std::vector<int32_t> ids(static_cast<size_t>(num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  Paged p{randn({num_pages, page_size, k.size(2), k.size(3)}, seed + 1, k.dtype()),
          randn({num_pages, page_size, v.size(2), v.size(3)}, seed + 2, v.dtype()),
          int32s(std::vector<int32_t>(ids.begin(), ids.begin() + B * pages_per_seq),
                 {B, pages_per_seq})};
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < pages_per_seq; ++i) {
      const int64_t id = p.table.data<int32_t>()[b * pages_per_seq + i];
      p.k_pool.select(0, id).copy_(k.select(0, b).slice(0, i * page_size, (i + 1) * page_size));
      p.v_pool.select(0, id).copy_(v.select(0, b).slice(0, i * page_size, (i + 1) * page_size));
    }
  }
  return p;
}

// The contiguous view of a paged pool (what the contiguous caches should hold).
Tensor gather(const Tensor& pool, const Tensor& table) {
  const int64_t B = table.size(0), n = table.size(1), ps = pool.size(1);
  Tensor out = Tensor::empty({B, n * ps, pool.size(2), pool.size(3)}, pool.dtype());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      out.select(0, b).slice(0, i * ps, (i + 1) * ps)
          .copy_(pool.select(0, table.data<int32_t>()[b * n + i]));
    }
  }
  return out;
}

struct Case {
  std::vector<int32_t> cached = {0, 1, 63, 64, 65, 190};
  int64_t q_len = 1, new_len = 0, Hq = 8, Hkv = 2, E = 32, Ev = 24, S_max = 256;
  KvCacheOptions options;
  DType dtype = DType::kFloat32;
};

// Paged against contiguous: out, lse and the caches after the append.
void check(Case c, int64_t page_size, double tolerance) {
  SCOPED_TRACE("page_size " + std::to_string(page_size));
  const int64_t B = static_cast<int64_t>(c.cached.size());
  const Tensor q = randn({B, c.q_len, c.Hq, c.E}, 1, c.dtype);
  const Tensor k = randn({B, c.S_max, c.Hkv, c.E}, 2, c.dtype);
  const Tensor v = randn({B, c.S_max, c.Hkv, c.Ev}, 3, c.dtype);
  if (c.new_len > 0) {
    c.options.k_new = randn({B, c.new_len, c.Hkv, c.E}, 4, c.dtype);
    c.options.v_new = randn({B, c.new_len, c.Hkv, c.Ev}, 5, c.dtype);
  }
  const Tensor seqlens = int32s(c.cached, {B});
  const Paged paged = page(k, v, page_size, 7);
  const Tensor k_cont = k.clone(), v_cont = v.clone();
  const AttentionResult want = attention_with_kvcache(q, k_cont, v_cont, seqlens, c.options);
  KvCacheOptions o = c.options;
  o.block_table = paged.table;
  const AttentionResult got = attention_with_kvcache(q, paged.k_pool, paged.v_pool, seqlens, o);
  EXPECT_LE(max_abs_diff(got.out, want.out), tolerance);
  EXPECT_LE(max_abs_diff(got.lse, want.lse), tolerance);
  EXPECT_EQ(max_abs_diff(gather(paged.k_pool, paged.table), k_cont), 0.0);
  EXPECT_EQ(max_abs_diff(gather(paged.v_pool, paged.table), v_cont), 0.0);
}

TEST(PagedKvCache, DecodeMatchesContiguousForEveryPageSize) {
  for (int64_t page_size : {1, 16, 64, 256}) check(Case{}, page_size, 2e-6);
}

TEST(PagedKvCache, AppendsCrossPageBoundaries) {
  Case c;
  c.new_len = 3;
  c.q_len = 3;
  c.options.causal = true;
  for (int64_t page_size : {1, 16, 64}) check(c, page_size, 2e-6);
}

TEST(PagedKvCache, ChunkedPrefillTakesTheTilePath) {
  Case c;
  c.cached = {100, 0, 37};
  c.q_len = c.new_len = 80;  // 4 x 80 query rows per kv head: past the decode path
  c.options.causal = true;
  for (int64_t page_size : {16, 64}) check(c, page_size, 2e-6);
}

TEST(PagedKvCache, HalfTypesOnEveryCapability) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (const std::string& capability : test::supported_capabilities()) {
      SCOPED_TRACE(capability + " " + std::string(dtype_name(dtype)));
      test::ScopedCapability scoped(capability);
      Case c;
      c.dtype = dtype;
      c.new_len = 2;
      c.q_len = 2;
      c.options.window_left = 40;
      c.options.causal = true;
      // One kv head reads its rows through the pages (bf16 by vdpbf16ps only on pages of
      // whole 16-key groups); two copy each key tile of both first (any page size).
      for (int64_t Hkv : {1, 2}) {
        c.Hkv = Hkv;
        for (int64_t page_size : {1, 8, 16, 64}) {
          check(c, page_size, dtype == DType::kBFloat16 ? 2e-2 : 2e-3);
        }
      }
    }
  }
}

TEST(PagedKvCache, MathReadsPagesToo) {
  sdpa_kernel guard(SDPBackend::MATH);
  Case c;
  c.options.softcap = 0.0;
  c.options.alibi_slopes = std::vector<float>(8, 0.25f);
  check(c, 16, 2e-6);
}

TEST(PagedKvCache, SoftcapAsFlexProgram) {
  Case c;
  c.options.softcap = 3.0;
  check(c, 16, 2e-6);
}

TEST(PagedKvCache, BadBlockTablesWriteNothing) {
  const Tensor q = randn({2, 1, 2, 8}, 1, DType::kFloat32);
  const Tensor k_pool = randn({4, 16, 2, 8}, 2, DType::kFloat32);
  const Tensor v_pool = randn({4, 16, 2, 8}, 3, DType::kFloat32);
  const Tensor k_before = k_pool.clone(), v_before = v_pool.clone();
  KvCacheOptions o;
  o.k_new = randn({2, 1, 2, 8}, 4, DType::kFloat32);
  o.v_new = randn({2, 1, 2, 8}, 5, DType::kFloat32);
  auto fails = [&](const Tensor& table, const Tensor& seqlens, const char* what) {
    o.block_table = table;
    try {
      (void)attention_with_kvcache(q, k_pool, v_pool, seqlens, o);
      ADD_FAILURE() << "expected an error naming " << what;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(what));
    }
    EXPECT_EQ(max_abs_diff(k_pool, k_before), 0.0);
    EXPECT_EQ(max_abs_diff(v_pool, v_before), 0.0);
  };
  fails(int32s({0, 1, 4, 2}, {2, 2}), int32s({20, 3}, {2}), "block_table[1][0] = 4");
  fails(int32s({0, 1, 2, 4}, {2, 2}), int32s({3, 20}, {2}), "block_table[1][1] = 4");
  fails(int32s({0, 1, 2, -1}, {2, 2}), int32s({3, 16}, {2}), "block_table[1][1] = -1");
  fails(int32s({0, 1, 2, 3}, {2, 2}), int32s({3, 32}, {2}), "exceeds the cache's capacity of 32");
  fails(int32s({0, 1, 2}, {1, 3}), int32s({3, 3}, {2}), "block_table: expected an int32 tensor [B = 2");
  fails(int32s({0, 1, 2, 3}, {2, 2}).to(DType::kInt64), int32s({3, 3}, {2}),
        "block_table: expected an int32");
  // Only the pages a sequence uses are checked: entries past its length may be anything.
  o.block_table = int32s({0, 9, 2, -5}, {2, 2});
  EXPECT_NO_THROW((void)attention_with_kvcache(q, k_pool, v_pool, int32s({3, 5}, {2}), o));
}

TEST(PagedKvCache, AppendWithoutAttendingWritesOnlyItsRows) {
  const Tensor k = randn({2, 64, 2, 8}, 1, DType::kBFloat16);
  const Tensor v = randn({2, 64, 2, 6}, 2, DType::kBFloat16);
  const Paged paged = page(k, v, 16, 3);
  const Tensor k_new = randn({2, 20, 2, 8}, 4, DType::kBFloat16);
  const Tensor v_new = randn({2, 20, 2, 6}, 5, DType::kBFloat16);
  const Tensor positions = int32s({13, 44});  // both runs cross page boundaries
  append_paged_kv_cache(k_new, v_new, paged.k_pool, paged.v_pool, paged.table, positions);
  Tensor k_want = k.clone(), v_want = v.clone();
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t at = positions.data<int32_t>()[b];
    k_want.select(0, b).slice(0, at, at + 20).copy_(k_new.select(0, b));
    v_want.select(0, b).slice(0, at, at + 20).copy_(v_new.select(0, b));
  }
  EXPECT_EQ(max_abs_diff(gather(paged.k_pool, paged.table), k_want), 0.0);
  EXPECT_EQ(max_abs_diff(gather(paged.v_pool, paged.table), v_want), 0.0);
  const Tensor before = paged.k_pool.clone();
  try {
    append_paged_kv_cache(k_new, v_new, paged.k_pool, paged.v_pool, paged.table, int32s({13, 45}));
    ADD_FAILURE() << "expected an error naming positions";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("positions[1] = 45 with 20 new keys exceeds the cache's "
                                    "capacity of 64"));
  }
  EXPECT_THROW(append_paged_kv_cache(k_new, v_new, paged.k_pool, paged.v_pool, Tensor(), positions),
               Error);
  EXPECT_EQ(max_abs_diff(paged.k_pool, before), 0.0);
}

}  // namespace
}  // namespace sdpa
