#include "peak.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "sdpa/backend.h"

namespace sdpa::cli {
namespace {

// Each probe issues exactly one instruction kind, so it is written with intrinsics for the
// instruction it measures (a portable SIMD layer would be free to pick others).
constexpr int kChains = 12;  // > 4-cycle latency x 2 FMA ports: the pipes never stall
constexpr long kIters = 1 << 24;

// Results land in a volatile so the chains cannot be optimized away.
volatile float g_sink;

__attribute__((target("avx512f"))) void sink(__m512 sum) {
  float lanes[16];
  _mm512_storeu_ps(lanes, sum);
  g_sink = lanes[0] + lanes[15];
}

__attribute__((target("avx512f"))) long fma_avx512() {
  __m512 acc[kChains];
  const __m512 a = _mm512_set1_ps(g_sink * 0.0f + 0.999f), b = _mm512_set1_ps(1e-7f);
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  for (long i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  sink(sum);
  return kIters * kChains * 16 * 2;
}

__attribute__((target("avx2,fma"))) long fma_avx2() {
  __m256 acc[kChains];
  const __m256 a = _mm256_set1_ps(g_sink * 0.0f + 0.999f), b = _mm256_set1_ps(1e-7f);
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  for (long i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  float lanes[8];
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  _mm256_storeu_ps(lanes, sum);
  g_sink = lanes[0];
  return kIters * kChains * 8 * 2;
}

long fma_scalar() {
  float acc[kChains];
  const float a = g_sink * 0.0f + 0.999f, b = 1e-7f;
  for (int c = 0; c < kChains; ++c) acc[c] = static_cast<float>(c);
  for (long i = 0; i < kIters / 16; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * a + b;
  }
  g_sink = acc[0] + acc[kChains - 1];
  return kIters / 16 * kChains * 2;
}

__attribute__((target("avx512f,avx512bf16"))) long dot_bf16() {
  __m512 acc[kChains];
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3400);  // bf16 2^-23
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(g_sink * 0.0f + c);
  for (long i = 0; i < kIters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  sink(sum);
  return kIters * kChains * 32 * 2;  // 32 bf16 pairs per instruction
}

// Four accumulator tiles, each multiplied by its own A and B pair, so consecutive
// TDPBF16PS never wait on one another; the tiles are released at the end.
__attribute__((target("amx-tile,amx-bf16"))) long dot_amx() {
  struct alignas(64) {
    uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } config;
  std::vector<uint16_t> a(512, 0x3f80), b(512, 0x3400);  // bf16 1.0 and 2^-23
  float out[256];
  _tile_loadconfig(&config);
  _tile_loadd(4, a.data(), 64);
  _tile_loadd(5, a.data(), 64);
  _tile_loadd(6, b.data(), 64);
  _tile_loadd(7, b.data(), 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  constexpr long kProducts = kIters / 16;
  for (long i = 0; i < kProducts; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(3, out, 64);
  _tile_release();
  g_sink = out[0];
  return kProducts * 4 * 16 * 16 * 32 * 2;  // a 16 x 32 by 32 x 16 product per instruction
}

// FLOP/s of `probe` run on every thread at once, best of 3 rounds.
double parallel_rate(const std::function<long()>& probe) {
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {
    long total = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : total)
    total += probe();
    const std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
    best = std::max(best, static_cast<double>(total) / s.count());
  }
  return best;
}

double copy_bandwidth() {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double best = 0.0;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    {
      const size_t n = static_cast<size_t>(omp_get_num_threads());
      const size_t t = static_cast<size_t>(omp_get_thread_num());
      const size_t begin = bytes * t / n, end = bytes * (t + 1) / n;
      std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
    }
    const std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
    best = std::max(best, 2.0 * static_cast<double>(bytes) / s.count());
  }
  g_sink = dst[bytes / 2];
  return best;
}

}  // namespace

MachinePeak measure_peak() {
  MachinePeak peak;
  peak.threads = omp_get_max_threads();
  // The probe runs at the level the kernels run at (SDPA_CPU_CAPABILITY may lower it), so
  // "% of peak" compares each kernel with the instructions it was allowed to use.
  const std::string level = backends::cpu::get_cpu_capability();
  if (level == "AVX512") {
    peak.fp32_isa = "AVX-512";
    peak.fp32_gflops = parallel_rate(fma_avx512) / 1e9;
  } else if (level == "AVX2") {
    peak.fp32_isa = "AVX2";
    peak.fp32_gflops = parallel_rate(fma_avx2) / 1e9;
  } else {
    peak.fp32_isa = "scalar";
    peak.fp32_gflops = parallel_rate(fma_scalar) / 1e9;
  }
  // The vdpbf16ps kernels run only at the AVX-512 level.
  if (level == "AVX512" && __builtin_cpu_supports("avx512bf16")) {
    peak.bf16_gflops = parallel_rate(dot_bf16) / 1e9;
  }
  if (level == "AVX512" && backends::cpu::amx_bf16_available()) {
    peak.amx_bf16_gflops = parallel_rate(dot_amx) / 1e9;
  }
  peak.copy_gbps = copy_bandwidth() / 1e9;
  return peak;
}

}  // namespace sdpa::cli
