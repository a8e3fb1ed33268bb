// sdpa's own CUDA FLASH forward against CUDNN_ATTENTION on the same GPU, in one process
// (issue 24; bench/compare_torch_cuda.py compares both with torch when torch is there).
// bfloat16, B*L = 16384 tokens and H*E = 2048 (compare_torch_cuda.py's shapes), L in 1024
// and 4096 (or the lengths given), E 64 and 128, causal and not. Each contender runs
// `calls` forwards back to back between two stream synchronizations (the GPU time
// dominates: a call is milliseconds, its host share microseconds); the median of 5 rounds
// is reported. TFLOP/s count 4*B*H*L*S*E, halved when causal.
//
// Usage: sdpa_cuda_flash_forward [calls = 10] [L ...]
// Without a usable GPU it prints why and exits 0.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.h"
#include "sdpa/cuda.h"

using namespace sdpa;

namespace {

double median_ms_per_call(const Tensor& q, const Tensor& k, const Tensor& v,
                          const SDPAOptions& options, int calls) {
  for (int i = 0; i < 2; ++i) (void)scaled_dot_product_attention(q, k, v, options);
  cuda::synchronize();
  std::vector<double> per_call;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) (void)scaled_dot_product_attention(q, k, v, options);
    cuda::synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    per_call.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / calls);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 10;
  std::vector<int64_t> lengths;
  for (int i = 2; i < argc; ++i) lengths.push_back(std::atoll(argv[i]));
  if (lengths.empty()) lengths = {1024, 4096};
  if (!cuda::is_available()) {
    std::printf("skipped: %s\n", cuda::unavailable_reason().c_str());
    return 0;
  }
  std::printf("device: %s\nbfloat16, B*L = 16384, H*E = 2048, %d calls x 5 rounds, median\n\n",
              cuda::device_description(0).c_str(), calls);
  std::printf(
      "| L | B | H | E | causal | FLASH ms | FLASH TFLOP/s | CUDNN TFLOP/s | FLASH / CUDNN |\n");
  std::printf("|---:|---:|---:|---:|:---:|---:|---:|---:|---:|\n");
  const Device gpu{DeviceType::kCUDA, 0};
  for (int64_t l : lengths) {
    for (int64_t e : {64, 128}) {
      const int64_t b = 16384 / l, h = 2048 / e;
      const Tensor q = cuda::to_device(bench::randn({b, h, l, e}, DType::kBFloat16, 1), gpu);
      const Tensor k = cuda::to_device(bench::randn({b, h, l, e}, DType::kBFloat16, 2), gpu);
      const Tensor v = cuda::to_device(bench::randn({b, h, l, e}, DType::kBFloat16, 3), gpu);
      for (bool causal : {false, true}) {
        SDPAOptions o;
        o.is_causal = causal;
        const double flops = 4.0 * b * h * l * l * e / (causal ? 2.0 : 1.0);
        double ms[2] = {0, 0};
        int n = 0;
        for (SDPBackend backend : {SDPBackend::FLASH_ATTENTION, SDPBackend::CUDNN_ATTENTION}) {
          sdpa_kernel only(backend);
          try {
            ms[n] = median_ms_per_call(q, k, v, o, calls);
          } catch (const Error& err) {
            std::fprintf(stderr, "%s: %.120s\n", std::string(backend_name(backend)).c_str(),
                         err.what());
          }
          ++n;
        }
        const auto tflops = [&](double t) { return t > 0 ? flops / t / 1e9 : 0.0; };
        std::printf("| %lld | %lld | %lld | %lld | %s | %.3f | %.0f | %.0f | %.2f |\n",
                    static_cast<long long>(l), static_cast<long long>(b), static_cast<long long>(h),
                    static_cast<long long>(e), causal ? "yes" : "no", ms[0], tflops(ms[0]),
                    tflops(ms[1]), ms[0] > 0 && ms[1] > 0 ? ms[1] / ms[0] : 0.0);
      }
    }
  }
  return 0;
}
