// Microseconds per call of the small calls real inference makes (issue 27): a tiny
// decode, the all-MiniLM-L6-v2 layer and a Llama-7B-shaped decode step, float32, each
// call timed on its own. Small calls are where threading overhead and OpenMP's
// spin-waiting against other processes show, so the spread is printed with the median.
//
// Usage: sdpa_small_calls [seconds per case = 1] [case name = all]
// Prints: case, calls, then p10 / median / p90 microseconds per call.
//
// `sdpa_small_calls grain [rounds = 15]` measures the work grain (docs/design.md,
// "Threading"): float32 forwards of growing size on 1 and on every thread, interleaved;
// run it with SDPA_GRAIN_FLOPS=0 so that every region takes every thread.

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.h"

using namespace sdpa;

namespace {

std::atomic<int> bench_sink{0};

struct SmallCase {
  const char* name;
  Shape q, kv;
};

// The shapes of issue 27's benchmark section.
const SmallCase kCases[] = {
    {"tiny", {1, 1, 1, 8}, {1, 1, 1, 8}},
    {"minilm", {5, 12, 27, 32}, {5, 12, 27, 32}},
    {"llama7b_decode", {1, 32, 1, 128}, {1, 32, 128, 128}},
};

void time_case(const SmallCase& c, double seconds) {
  const Tensor q = bench::randn(c.q, DType::kFloat32, 1);
  const Tensor k = bench::randn(c.kv, DType::kFloat32, 2);
  const Tensor v = bench::randn(c.kv, DType::kFloat32, 3);
  for (int i = 0; i < 20; ++i) scaled_dot_product_attention(q, k, v);  // warm up
  std::vector<double> us;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
         seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    scaled_dot_product_attention(q, k, v);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  const auto at = [&](double f) { return us[static_cast<size_t>(f * (us.size() - 1))]; };
  std::printf("%-16s %8zu calls  p10 %9.1f  median %9.1f  p90 %9.1f us\n", c.name, us.size(),
              at(0.1), at(0.5), at(0.9));
}

// Microseconds per call of q [1, H, L, E], k/v [1, H, S, E] float32 on 1 thread and on
// all of them (interleaved), with the call's FLOPs (4 L S E per head) and k/v bytes.
void time_threads(int64_t heads, int64_t q_len, int64_t kv_len, int64_t head_dim, int rounds) {
  const int threads = omp_get_max_threads();
  const Tensor q = bench::randn({1, heads, q_len, head_dim}, DType::kFloat32, 1);
  const Tensor k = bench::randn({1, heads, kv_len, head_dim}, DType::kFloat32, 2);
  const Tensor v = bench::randn({1, heads, kv_len, head_dim}, DType::kFloat32, 3);
  constexpr int kCalls = 50;
  const auto calls_on = [&](int t) {
    return [&, t] {
      omp_set_num_threads(t);
      for (int i = 0; i < kCalls; ++i) scaled_dot_product_attention(q, k, v);
    };
  };
  const std::vector<double> ms = bench::paired_median_ms({calls_on(1), calls_on(threads)}, rounds);
  omp_set_num_threads(threads);
  const double us1 = 1e3 * ms[0] / kCalls, us_all = 1e3 * ms[1] / kCalls;
  const double flops = 4.0 * heads * q_len * kv_len * head_dim;
  const double bytes = 2.0 * heads * kv_len * head_dim * 4;
  std::printf("[1,%lld,%lld|%lld,%lld] %10.3g %10.3g %9.2f %9.2f %7.2f\n",
              static_cast<long long>(heads), static_cast<long long>(q_len),
              static_cast<long long>(kv_len), static_cast<long long>(head_dim), flops, bytes, us1,
              us_all, us_all / us1);
}

// The work grain: self-attention [1, 4, n, 32] (MiniLM's head size, the tile path, sized
// by FLOPs), then decode steps [1, 8, 1, 128] over S keys (the decode path, sized by
// bytes). The grain is about where the all-thread time drops below the one-thread time.
void grain_sweep(int rounds) {
  // The fork/join cost: an empty region on every thread, back to back (median of rounds).
  const std::vector<double> fork_join_ms =
      bench::paired_median_ms({[] {
                                for (int i = 0; i < 1000; ++i) {
#pragma omp parallel
                                  bench_sink.fetch_add(1, std::memory_order_relaxed);
                                }
                              }},
                              rounds);
  std::printf("fork/join of an empty region: %.2f us\n", fork_join_ms[0]);
  std::printf("%-20s %10s %10s %9s %9s %7s  (%d threads)\n", "[B,H,L|S,E]", "flops", "kv bytes",
              "1 thr us", "all us", "all/1", omp_get_max_threads());
  for (int64_t n : {8, 16, 24, 32, 48, 64, 96, 128, 192}) time_threads(4, n, n, 32, rounds);
  for (int64_t s : {16, 32, 64, 128, 256, 512, 1024}) time_threads(8, 1, s, 128, rounds);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "grain") {
    grain_sweep(argc > 2 ? std::atoi(argv[2]) : 15);
    return 0;
  }
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  const std::string only = argc > 2 ? argv[2] : "";
  for (const SmallCase& c : kCases) {
    if (only.empty() || only == c.name) time_case(c, seconds);
  }
  return 0;
}
