#pragma once
// `sdpa bench --peak`: this machine's limits, measured in the same run as the benchmark so
// every figure can be stated as a fraction of them.

#include <optional>
#include <string>

namespace sdpa::cli {

struct MachinePeak {
  int threads = 1;                ///< OpenMP threads that ran the probes
  std::string fp32_isa;           ///< "AVX-512", "AVX2" or "scalar"
  double fp32_gflops = 0.0;       ///< FMA throughput, 2 FLOPs per multiply-add
  /// vdpbf16ps throughput (2 FLOPs per bf16 pair) when the CPU has avx512_bf16.
  std::optional<double> bf16_gflops;
  /// AMX TDPBF16PS throughput (16384 FLOPs per tile product) when the kernels may use AMX
  /// (backends::cpu::amx_bf16_available(), AVX512 level).
  std::optional<double> amx_bf16_gflops;
  /// memcpy of a 256 MiB buffer split over the threads, counting bytes read plus bytes
  /// written (STREAM's Copy convention), in GB/s (1e9 bytes).
  double copy_gbps = 0.0;
};

/// Runs the probes on every OpenMP thread (best of 3 rounds each, under a second in all):
/// independent FMA chains (more than the FMA latency x ports, so the units never wait) of
/// the kernels' active level (get_cpu_capability(), which SDPA_CPU_CAPABILITY can lower),
/// independent vdpbf16ps chains at the AVX-512 level, four independent AMX tile products
/// where the kernels use AMX, and a parallel memcpy.
MachinePeak measure_peak();

}  // namespace sdpa::cli
