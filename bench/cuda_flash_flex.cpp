// sdpa's CUDA FLASH forward with flex programs (issue 24 item 5) against the same kernel
// without one and against CUDNN_ATTENTION, in one process: bfloat16, B = 4, H = 16,
// L = S = 4096, E = 128 (bench/compare_flex_cuda.py's --quick shape). Rows: plain, the
// soft-cap and ALiBi score_mods, and a BlockMask of packed documents (random lengths,
// seed 5). For each backend, the median over 5 rounds of `calls` back-to-back calls of
//   - ms per call: the rounds' wall time, the stream synchronized at the end of each;
//   - host ms per call: the time until the last call of a round returns, before that
//     synchronization (equal to the first when the host waits for the kernel or is slower
//     than it; smaller when the GPU is the limit).
//
// Usage: sdpa_cuda_flash_flex [calls = 10]
// Without a usable GPU it prints why and exits 0.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "sdpa/cuda.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"

using namespace sdpa;

namespace {

struct Timing {
  double ms = 0, host_ms = 0;
};

template <class Call>
Timing time_calls(const Call& call, int calls) {
  for (int i = 0; i < 2; ++i) call();
  cuda::synchronize();
  std::vector<double> total, host;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const auto t1 = std::chrono::steady_clock::now();
    cuda::synchronize();
    const auto t2 = std::chrono::steady_clock::now();
    host.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / calls);
    total.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count() / calls);
  }
  std::sort(total.begin(), total.end());
  std::sort(host.begin(), host.end());
  return {total[total.size() / 2], host[host.size() / 2]};
}

// Document ids [L] of packed documents with random lengths in [64, 1024) (the last one cut
// at L).
Tensor document_ids(int64_t l) {
  Tensor ids = Tensor::zeros({l}, DType::kInt64);
  auto* out = ids.data<int64_t>();
  uint32_t state = 5;
  int64_t doc = 0, at = 0;
  while (at < l) {
    state = state * 1664525u + 1013904223u;
    const int64_t len = 64 + static_cast<int64_t>(state >> 8) % 960;
    for (int64_t i = 0; i < len && at < l; ++i) out[at++] = doc;
    ++doc;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 10;
  if (!cuda::is_available()) {
    std::printf("skipped: %s\n", cuda::unavailable_reason().c_str());
    return 0;
  }
  constexpr int64_t b = 4, h = 16, l = 4096, e = 128;
  std::printf("device: %s\nbfloat16 [%lld, %lld, %lld, %lld], %d calls x 5 rounds, median\n\n",
              cuda::device_description(0).c_str(), static_cast<long long>(b),
              static_cast<long long>(h), static_cast<long long>(l), static_cast<long long>(e),
              calls);
  const Device gpu{DeviceType::kCUDA, 0};
  const Tensor q = cuda::to_device(bench::randn({b, h, l, e}, DType::kBFloat16, 1), gpu);
  const Tensor k = cuda::to_device(bench::randn({b, h, l, e}, DType::kBFloat16, 2), gpu);
  const Tensor v = cuda::to_device(bench::randn({b, h, l, e}, DType::kBFloat16, 3), gpu);
  Tensor slopes = Tensor::zeros({h}, DType::kFloat32);
  for (int64_t i = 0; i < h; ++i) slopes.data<float>()[i] = std::exp2(-8.0f * (i + 1) / h);
  const Tensor device_slopes = cuda::to_device(slopes, gpu);
  const flex::BlockMask documents =
      flex::create_block_mask(flex::mods::document(document_ids(l)), 1, 1, l, l);

  struct Case {
    const char* name;
    std::optional<flex::Program> score_mod;
    const flex::BlockMask* block_mask;
  };
  const std::vector<Case> cases = {
      {"plain", std::nullopt, nullptr},
      {"soft-cap 30", flex::Program::from_score_mod(flex::mods::soft_cap(30.0)), nullptr},
      {"ALiBi (device slopes)", flex::Program::from_score_mod(flex::mods::alibi(device_slopes)),
       nullptr},
      {"documents BlockMask", std::nullopt, &documents},
  };
  std::printf("| case | FLASH ms | FLASH host ms | CUDNN ms | FLASH / CUDNN |\n");
  std::printf("|:---|---:|---:|---:|---:|\n");
  for (const Case& c : cases) {
    Timing t[2];
    int n = 0;
    for (SDPBackend backend : {SDPBackend::FLASH_ATTENTION, SDPBackend::CUDNN_ATTENTION}) {
      sdpa_kernel only(backend);
      try {
        t[n] = time_calls(
            [&] {
              if (c.score_mod || c.block_mask) {
                (void)flex_attention(q, k, v, c.score_mod, c.block_mask);
              } else {
                (void)scaled_dot_product_attention(q, k, v);
              }
            },
            calls);
      } catch (const Error& err) {
        std::fprintf(stderr, "%s %s: %.160s\n", c.name, std::string(backend_name(backend)).c_str(),
                     err.what());
      }
      ++n;
    }
    std::printf("| %s | %.3f | %.3f | %.3f | %.2f |\n", c.name, t[0].ms, t[0].host_ms, t[1].ms,
                t[0].ms > 0 && t[1].ms > 0 ? t[1].ms / t[0].ms : 0.0);
  }
  return 0;
}
