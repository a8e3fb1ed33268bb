// sdpa against llama.cpp's CPU flash attention (ggml_flash_attn_ext, as llama.cpp's graph
// calls it: float32 queries, float16 K/V, float32 accumulation) on the same shapes and
// threads, the two timed alternately in one process (issue 25's target: sdpa >= 2x on
// decode and prefill). Built only when CMake finds a ggml install (find_package(ggml),
// e.g. CMAKE_PREFIX_PATH=<ggml prefix>); ggml is not part of this repository.
//
// Cases (Hq=32 Hkv=8 E=128, one sequence, the Llama-3-8B attention shape):
//   decode   L=1 against S = 4096 and 32768 cached keys (no mask)
//   prefill  L=S=2048, causal
// sdpa runs q/k/v in float16 (the cache's dtype; the same bytes as ggml's K/V) and in
// bfloat16 (its fastest route on AVX512_BF16 hosts); ggml gets the float16 inputs.
// Reported: the median over rounds of the mean time per call, ggml / sdpa, and each
// float16 output's error against the float64 reference on the same inputs
// (max |difference| / max |reference|).
//
// Usage: sdpa_llama_cpp_attention [rounds = 7] [threads = 2]

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "common.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "host.h"

using namespace sdpa;

namespace {

constexpr int64_t kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128;

struct Case {
  const char* name;
  int64_t q_len, kv_len;
  bool causal;
  int calls;  // per round
};

// One ggml graph computing ggml_flash_attn_ext on the float16 inputs q/k/v ([1, H, N, E]
// contiguous, which is ggml's [E, N, H] order): q widened to float32, k/v copied as float16.
class GgmlAttention {
 public:
  GgmlAttention(const Case& c, const Tensor& q16, const Tensor& k16, const Tensor& v16, int threads)
      : threads_(threads) {
    const size_t bytes = static_cast<size_t>(c.q_len * kHeadsQ * kHeadDim) * 4 * 2 +
                         static_cast<size_t>(c.kv_len * kHeadsKv * kHeadDim) * 2 * 2 +
                         static_cast<size_t>(c.kv_len * c.q_len) * 2 + 16 * ggml_tensor_overhead() +
                         ggml_graph_overhead() + (1 << 20);
    ctx_ = ggml_init({bytes, nullptr, false});
    ggml_tensor* q = ggml_new_tensor_4d(ctx_, GGML_TYPE_F32, kHeadDim, c.q_len, kHeadsQ, 1);
    ggml_tensor* k = ggml_new_tensor_4d(ctx_, GGML_TYPE_F16, kHeadDim, c.kv_len, kHeadsKv, 1);
    ggml_tensor* v = ggml_new_tensor_4d(ctx_, GGML_TYPE_F16, kHeadDim, c.kv_len, kHeadsKv, 1);
    const Tensor q32 = q16.to(DType::kFloat32);
    std::memcpy(q->data, q32.data_ptr(), ggml_nbytes(q));
    std::memcpy(k->data, k16.data_ptr(), ggml_nbytes(k));
    std::memcpy(v->data, v16.data_ptr(), ggml_nbytes(v));
    ggml_tensor* mask = nullptr;
    if (c.causal) {  // key j visible to query i when j <= i + S - L (bottom-right)
      mask = ggml_new_tensor_4d(ctx_, GGML_TYPE_F16, c.kv_len, c.q_len, 1, 1);
      for (int64_t i = 0; i < c.q_len; ++i) {
        for (int64_t j = 0; j < c.kv_len; ++j) {
          static_cast<ggml_fp16_t*>(mask->data)[i * c.kv_len + j] =
              ggml_fp32_to_fp16(j <= i + c.kv_len - c.q_len ? 0.0f : -INFINITY);
        }
      }
    }
    out_ = ggml_flash_attn_ext(ctx_, q, k, v, mask, 1.0f / std::sqrt(static_cast<float>(kHeadDim)),
                               0, 0);
    ggml_prec_set_acc(out_, GGML_PREC_F32);
    graph_ = ggml_new_graph(ctx_);
    ggml_build_forward_expand(graph_, out_);
    plan_ = ggml_graph_plan(graph_, threads_, nullptr);
    work_.resize(plan_.work_size);
    plan_.work_data = work_.data();
  }
  ~GgmlAttention() { ggml_free(ctx_); }
  GgmlAttention(const GgmlAttention&) = delete;
  GgmlAttention& operator=(const GgmlAttention&) = delete;

  void run() {
    if (ggml_graph_compute(graph_, &plan_) != GGML_STATUS_SUCCESS) {
      std::fprintf(stderr, "ggml_graph_compute failed\n");
      std::exit(1);
    }
  }

  /// max |ggml - golden| / max |golden| over golden [1, Hq, L, E] (ggml's result is
  /// [E, Hq, L]).
  double relative_difference(const Tensor& out) const {
    const Tensor o = out.to(DType::kFloat64);
    const double* x = o.data<double>();
    const float* y = static_cast<const float*>(out_->data);
    const int64_t L = out.size(2);
    double diff = 0, scale = 0;
    for (int64_t h = 0; h < kHeadsQ; ++h) {
      for (int64_t i = 0; i < L; ++i) {
        for (int64_t e = 0; e < kHeadDim; ++e) {
          const double a = x[(h * L + i) * kHeadDim + e], b = y[(i * kHeadsQ + h) * kHeadDim + e];
          diff = std::max(diff, std::abs(a - b));
          scale = std::max(scale, std::abs(a));
        }
      }
    }
    return diff / scale;
  }

 private:
  int threads_;
  ggml_context* ctx_ = nullptr;
  ggml_cgraph* graph_ = nullptr;
  ggml_tensor* out_ = nullptr;
  ggml_cplan plan_{};
  std::vector<uint8_t> work_;
};

double mean_ms(const std::function<void()>& fn, int calls) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / calls;
}

/// max |x - golden| / max |golden|.
double relative_error(const Tensor& x, const Tensor& golden) {
  const Tensor a = x.to(DType::kFloat64), b = golden.to(DType::kFloat64);
  const double* pa = a.data<double>();
  const double* pb = b.data<double>();
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::abs(pa[i] - pb[i]));
    scale = std::max(scale, std::abs(pb[i]));
  }
  return diff / scale;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  omp_set_num_threads(threads);
  std::printf("host: %s, capability %s\n", bench::cpu_model_name().c_str(),
              backends::cpu::get_cpu_capability().c_str());
  std::printf("Hq=%lld Hkv=%lld E=%lld, %d threads, %d rounds (median of per-call means)\n\n",
              static_cast<long long>(kHeadsQ), static_cast<long long>(kHeadsKv),
              static_cast<long long>(kHeadDim), threads, rounds);
  std::printf(
      "| case | L | S | ggml ms | sdpa f16 ms | sdpa bf16 ms | ggml / sdpa f16 | "
      "ggml / sdpa bf16 | ggml error | sdpa f16 error |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  const Case cases[] = {{"decode", 1, 4096, false, 50},
                        {"decode", 1, 32768, false, 10},
                        {"prefill", 2048, 2048, true, 2}};
  for (const Case& c : cases) {
    SDPAOptions o;
    o.enable_gqa = true;
    o.is_causal = c.causal;
    if (c.causal && c.q_len != c.kv_len) {
      std::fprintf(stderr, "causal cases have L = S here\n");
      return 1;
    }
    Tensor in[2][3];
    for (int d = 0; d < 2; ++d) {
      const DType dtype = d == 0 ? DType::kFloat16 : DType::kBFloat16;
      in[d][0] = bench::randn({1, kHeadsQ, c.q_len, kHeadDim}, dtype, 1);
      in[d][1] = bench::randn({1, kHeadsKv, c.kv_len, kHeadDim}, dtype, 2);
      in[d][2] = bench::randn({1, kHeadsKv, c.kv_len, kHeadDim}, dtype, 3);
    }
    GgmlAttention ggml_call(c, in[0][0], in[0][1], in[0][2], threads);
    const auto sdpa_call = [&](int d) {
      return [&, d] { (void)scaled_dot_product_attention(in[d][0], in[d][1], in[d][2], o); };
    };
    ggml_call.run();
    // Both against the float64 reference on the same (float16) inputs.
    Tensor golden;
    {
      sdpa_kernel math(SDPBackend::MATH);
      golden =
          scaled_dot_product_attention(in[0][0].to(DType::kFloat64), in[0][1].to(DType::kFloat64),
                                       in[0][2].to(DType::kFloat64), o);
    }
    const double ggml_error = ggml_call.relative_difference(golden);
    const double sdpa_error =
        relative_error(scaled_dot_product_attention(in[0][0], in[0][1], in[0][2], o), golden);
    sdpa_call(1)();
    std::vector<double> g, s16, s32;
    for (int r = 0; r < rounds; ++r) {  // alternating, so drift hits all three alike
      g.push_back(mean_ms([&] { ggml_call.run(); }, c.calls));
      s16.push_back(mean_ms(sdpa_call(0), c.calls));
      s32.push_back(mean_ms(sdpa_call(1), c.calls));
    }
    const double gm = median(g), a = median(s16), b = median(s32);
    std::printf("| %s | %lld | %lld | %.3f | %.3f | %.3f | %.2fx | %.2fx | %.1e | %.1e |\n", c.name,
                static_cast<long long>(c.q_len), static_cast<long long>(c.kv_len), gm, a, b, gm / a,
                gm / b, ggml_error, sdpa_error);
  }
  return 0;
}
