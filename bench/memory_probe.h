#pragma once
// The memory-traffic companions of the decode benchmarks: a threaded 256 MiB memcpy (the
// copy measure of `sdpa bench --peak`: bytes read plus written, memory to memory) and a
// 64 MiB read sweep that evicts a call's K/V from the caches and leaves clean lines, as
// other layers' K/V reads do in serving. Needs OpenMP.

#include <omp.h>

#include <cstddef>
#include <cstring>
#include <vector>

namespace sdpa::bench {

class MemoryProbe {
 public:
  static constexpr size_t kCopyBytes = size_t{256} << 20;
  static constexpr size_t kSweepBytes = size_t{64} << 20;  // twice the L3 we measure on

  /// One memcpy of kCopyBytes split over the threads.
  void copy() {
#pragma omp parallel
    {
      const size_t n = static_cast<size_t>(omp_get_num_threads());
      const size_t i = static_cast<size_t>(omp_get_thread_num());
      std::memcpy(dst_.data() + kCopyBytes * i / n, src_.data() + kCopyBytes * i / n,
                  kCopyBytes * (i + 1) / n - kCopyBytes * i / n);
    }
  }

  /// Reads one byte per cache line of kSweepBytes.
  void sweep() {
    long sum = 0;
#pragma omp parallel for reduction(+ : sum)
    for (size_t j = 0; j < kSweepBytes; j += 64) sum += src_[j];
    sink_ += sum;
  }

  /// Copy bandwidth in GB/s (read + write) from a copy's milliseconds.
  static double copy_gbps(double ms) { return 2.0 * static_cast<double>(kCopyBytes) / (ms * 1e6); }

  /// Keeps the sweeps' loads (a value the caller prints under an impossible condition).
  long sink() const { return sink_; }

 private:
  std::vector<char> src_ = std::vector<char>(kCopyBytes, 1);
  std::vector<char> dst_ = std::vector<char>(kCopyBytes, 0);
  long sink_ = 0;
};

}  // namespace sdpa::bench
