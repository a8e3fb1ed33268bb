// Decode (L = 1, GQA, bf16 K/V) against this machine's copy bandwidth, timed interleaved
// in one run so the ratio is meaningful on a shared machine. Checks issue 8's target:
// K/V bytes read per second >= 80% of a threaded 256 MiB memcpy's read + write bytes per
// second (the copy measure of `sdpa bench --peak`: from memory to memory, not cache). The
// decode call starts with K/V out of cache and no dirty lines (see the sweep below).
//
// Usage: sdpa_decode_bandwidth [rounds=30]

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.h"

using namespace sdpa;

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 30;
  const int64_t Hq = 32, Hkv = 8, E = 128;
  std::printf(
      "FLASH_ATTENTION decode, B=1 Hq=%ld Hkv=%ld L=1 E=%ld bfloat16, %d threads, "
      "%d rounds\n",
      Hq, Hkv, E, omp_get_max_threads(), rounds);
  for (const int64_t S : {4096, 32768}) {
    const Tensor q = bench::randn({1, Hq, 1, E}, DType::kBFloat16, 1);
    const Tensor k = bench::randn({1, Hkv, S, E}, DType::kBFloat16, 2);
    const Tensor v = bench::randn({1, Hkv, S, E}, DType::kBFloat16, 3);
    SDPAOptions options;
    options.enable_gqa = true;
    const size_t bytes = static_cast<size_t>(2 * Hkv * S * E * 2);  // K and V, read once
    const size_t copy_bytes = size_t{256} << 20;
    std::vector<char> src(copy_bytes, 1), dst(copy_bytes, 0);
    // A read sweep of 64 MiB (twice the L3 of the machines we measure on) before the
    // decode call evicts K/V and leaves clean lines, as other layers' K/V reads do in
    // serving; right after the copy, the call would also write back the copy's dirty lines
    // (timed too, for comparison).
    const size_t sweep_bytes = size_t{64} << 20;
    long sink = 0;
    const auto copy = [&] {
#pragma omp parallel
      {
        const size_t n = static_cast<size_t>(omp_get_num_threads());
        const size_t i = static_cast<size_t>(omp_get_thread_num());
        std::memcpy(dst.data() + copy_bytes * i / n, src.data() + copy_bytes * i / n,
                    copy_bytes * (i + 1) / n - copy_bytes * i / n);
      }
    };
    const auto sweep = [&] {
      long sum = 0;
#pragma omp parallel for reduction(+ : sum)
      for (size_t j = 0; j < sweep_bytes; j += 64) sum += src[j];
      sink += sum;
    };
    const auto decode = [&] { scaled_dot_product_attention(q, k, v, options); };
    const auto t = bench::paired_median_ms({sweep, decode, copy, decode}, rounds);
    const double decode_gbps = static_cast<double>(bytes) / (t[1] * 1e6);
    const double copy_gbps = 2.0 * static_cast<double>(copy_bytes) / (t[2] * 1e6);
    const double ratio = decode_gbps / copy_gbps;
    std::printf(
        "S=%-6ld decode %.3f ms (%.1f GB/s K/V read; %.3f ms right after the copy), "
        "copy %.1f GB/s (read + write)  decode / copy %.2f  target >= 0.80  %s\n",
        S, t[1], decode_gbps, t[3], copy_gbps, ratio, ratio >= 0.8 ? "ok" : "MISS");
    if (sink == 42) std::printf("\n");  // keeps the sweep's loads
  }
  return 0;
}
