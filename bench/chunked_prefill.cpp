// Chunked prefill on a paged KV cache against the same call on contiguous caches, timed
// interleaved in one run (issue 25's target: within 1.15x of the contiguous work). One
// chunk of L new queries (and their keys and values, appended by the call) attends
// causally, bottom-right aligned, to a cached prefix plus itself, as vLLM and SGLang split
// a long prompt: B=1, Hq=32 Hkv=8 E=128 bfloat16, a 16k prefix, chunk 512, pages of 16
// shuffled through the pool by default.
//
// Usage: sdpa_chunked_prefill [rounds=7] [page_size=16] [--json FILE]

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "host.h"
#include "sdpa/kv_cache.h"

using namespace sdpa;

int main(int argc, char** argv) {
  const std::string command = bench::command_line(argc, argv);
  const std::string json_path = bench::take_json_path(argc, argv);
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int64_t page_size = argc > 2 ? std::atoll(argv[2]) : 16;
  const int64_t Hq = 32, Hkv = 8, E = 128, prefix = 16384, chunk = 512;
  const int64_t total = prefix + chunk;
  const DType dtype = DType::kBFloat16;
  const int64_t pages = (total + page_size - 1) / page_size;
  std::printf("chunked prefill, B=1 Hq=%ld Hkv=%ld E=%ld bfloat16, chunk %ld on a %ld-key "
              "prefix, page_size %ld, %d threads, %d rounds\n",
              Hq, Hkv, E, chunk, prefix, page_size, omp_get_max_threads(), rounds);

  // The contiguous caches hold the prefix; the pool holds the same rows in shuffled pages.
  Tensor k_cont = bench::randn({1, total, Hkv, E}, dtype, 1);
  Tensor v_cont = bench::randn({1, total, Hkv, E}, dtype, 2);
  Tensor k_pool = Tensor::empty({pages, page_size, Hkv, E}, dtype);
  Tensor v_pool = Tensor::empty({pages, page_size, Hkv, E}, dtype);
  std::vector<int32_t> ids(static_cast<size_t>(pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
  Tensor table = Tensor::empty({1, pages}, DType::kInt32);
  for (int64_t i = 0; i < pages; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)];
    table.data<int32_t>()[i] = id;
    const int64_t rows = std::min(page_size, total - i * page_size);
    k_pool.select(0, id).slice(0, 0, rows)
        .copy_(k_cont.select(0, 0).slice(0, i * page_size, i * page_size + rows));
    v_pool.select(0, id).slice(0, 0, rows)
        .copy_(v_cont.select(0, 0).slice(0, i * page_size, i * page_size + rows));
  }
  Tensor q = bench::randn({1, chunk, Hq, E}, dtype, 4);
  KvCacheOptions contiguous;
  contiguous.causal = true;
  contiguous.k_new = bench::randn({1, chunk, Hkv, E}, dtype, 5);
  contiguous.v_new = bench::randn({1, chunk, Hkv, E}, dtype, 6);
  KvCacheOptions paged = contiguous;
  paged.block_table = table;
  Tensor seqlens = Tensor::empty({1}, DType::kInt32);
  seqlens.data<int32_t>()[0] = static_cast<int32_t>(prefix);

  // Each call writes the chunk's rows at [prefix, total) again (the same values) and
  // attends over all `total` keys.
  const auto run_paged = [&] { attention_with_kvcache(q, k_pool, v_pool, seqlens, paged); };
  const auto run_contiguous = [&] {
    attention_with_kvcache(q, k_cont, v_cont, seqlens, contiguous);
  };
  const auto t = bench::paired_median_ms({run_paged, run_contiguous}, rounds);
  // Query i sees prefix + i + 1 keys: FlashAttention's 4·Hq·E flops per (query, key).
  const double pairs = static_cast<double>(chunk) * static_cast<double>(prefix) +
                       static_cast<double>(chunk) * static_cast<double>(chunk + 1) / 2;
  const double flops = 4.0 * static_cast<double>(Hq * E) * pairs;
  const double ratio = t[0] / t[1];
  std::printf("paged      %.2f ms  %.1f GFLOP/s\n", t[0], flops / (t[0] * 1e6));
  std::printf("contiguous %.2f ms  %.1f GFLOP/s\n", t[1], flops / (t[1] * 1e6));
  std::printf("paged / contiguous time %.3f  target <= 1.15  %s\n", ratio,
              ratio <= 1.15 ? "ok" : "MISS");
  if (json_path.empty()) return 0;
  const nlohmann::ordered_json config = {
      {"batch", 1},        {"heads_q", Hq},         {"heads_kv", Hkv},
      {"head_dim", E},     {"prefix_len", prefix},  {"chunk_len", chunk},
      {"page_size", page_size}, {"dtype", "bfloat16"}, {"rounds", rounds}};
  const nlohmann::ordered_json results = {
      {"paged_ms", t[0]},  {"contiguous_ms", t[1]},
      {"paged_gflops", flops / (t[0] * 1e6)}, {"contiguous_gflops", flops / (t[1] * 1e6)},
      {"paged_over_contiguous", ratio}};
  return bench::write_json(json_path, "chunked_prefill", command, config, results) ? 0 : 1;
}
