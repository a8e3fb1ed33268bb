// Attention on CUDA tensors (MATH on CUDA and CUDNN_ATTENTION) against the float64 CPU
// MATH golden, with the tolerance of tests/training/attention_test_util.h (the naive CPU
// MATH run in the tested dtype sets it). Every test here needs a GPU and skips, with the
// reason, without one.

#include <cuda_runtime_api.h>

#include <tuple>

#include "sdpa/attn_bias.h"
#include "sdpa/cuda.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::Device;
using sdpa::DeviceType;
using sdpa::SDPAOptions;
using sdpa::SDPBackend;

const Device kCuda{DeviceType::kCUDA, 0};

#define SKIP_WITHOUT_GPU() \
  if (!sdpa::cuda::is_available()) GTEST_SKIP() << sdpa::cuda::unavailable_reason()

// `host` on the GPU in the same layout (a [B, N, H, D] storage viewed as [B, H, N, D]
// stays so); other layouts arrive contiguous.
Tensor to_cuda(const Tensor& host, sdpa::cuda::Stream stream = nullptr) {
  if (!host.defined()) return host;
  if (!host.is_contiguous() && host.dim() == 4 && host.transpose(1, 2).is_contiguous()) {
    return sdpa::cuda::to_device(host.transpose(1, 2), kCuda, stream).transpose(1, 2);
  }
  return sdpa::cuda::to_device(host, kCuda, stream);
}

Tensor to_cpu(const Tensor& t) {
  return t.defined() ? sdpa::cuda::to_device(t, Device{}) : t;
}

FwdBwd to_cpu(const FwdBwd& r) {
  FwdBwd h = r;
  h.fwd.out = to_cpu(r.fwd.out);
  h.fwd.lse = to_cpu(r.fwd.lse);
  h.grads.grad_q = to_cpu(r.grads.grad_q);
  h.grads.grad_k = to_cpu(r.grads.grad_k);
  h.grads.grad_v = to_cpu(r.grads.grad_v);
  h.grads.grad_attn_mask = to_cpu(r.grads.grad_attn_mask);
  return h;
}

enum class Mask { kNone, kCausal, kCausalLowerRight, kWindow, kFloat, kBool };

const char* mask_name(Mask m) {
  switch (m) {
    case Mask::kNone: return "none";
    case Mask::kCausal: return "causal";
    case Mask::kCausalLowerRight: return "causal_lower_right";
    case Mask::kWindow: return "window";
    case Mask::kFloat: return "float";
    case Mask::kBool: return "bool";
  }
  return "?";
}

struct GpuCase {
  int64_t batch, heads_q, heads_kv, q_len, kv_len, head_dim;
  DType dtype;
  Mask mask;
  Layout layout = Layout::kBHSD;
};

std::string describe(const GpuCase& c) {
  std::ostringstream os;
  os << "B" << c.batch << " Hq" << c.heads_q << " Hkv" << c.heads_kv << " L" << c.q_len << " S"
     << c.kv_len << " E" << c.head_dim << ' ' << sdpa::dtype_name(c.dtype) << " mask "
     << mask_name(c.mask) << (c.layout == Layout::kBSHD ? " BSHD" : "");
  return os.str();
}

// The mask of `c` for inputs in `dtype` (dense masks are [1, Hq, L, S], broadcast over B).
SDPAOptions options_for(const GpuCase& c, DType dtype, uint64_t seed) {
  SDPAOptions o;
  o.enable_gqa = c.heads_q != c.heads_kv;
  switch (c.mask) {
    case Mask::kNone: break;
    case Mask::kCausal: o.is_causal = true; break;
    case Mask::kCausalLowerRight: o.attn_mask = sdpa::causal_lower_right(c.q_len, c.kv_len); break;
    case Mask::kWindow:
      o.attn_mask = std::make_shared<sdpa::LocalAttentionBias>(
          17, 0, sdpa::DiagonalAlignment::kTopLeft);
      break;
    case Mask::kFloat: o.attn_mask = randn({1, c.heads_q, c.q_len, c.kv_len}, dtype, seed); break;
    case Mask::kBool:
      o.attn_mask = random_bool({1, c.heads_q, c.q_len, c.kv_len}, 0.7, seed);
      break;
  }
  return o;
}

// Runs `c` forward + backward on the GPU with `backend` and checks it against the CPU
// float64 golden. Returns false (no check) when the backend refuses the call.
bool check_on_gpu(const GpuCase& c, SDPBackend backend) {
  SCOPED_TRACE(describe(c) + " on " + std::string(sdpa::backend_name(backend)));
  const Shape qs{c.batch, c.heads_q, c.q_len, c.head_dim};
  const Shape kvs{c.batch, c.heads_kv, c.kv_len, c.head_dim};
  const Tensor q = randn_layout(qs, c.dtype, 1, c.layout);
  const Tensor k = randn_layout(kvs, c.dtype, 2, c.layout);
  const Tensor v = randn_layout(kvs, c.dtype, 3, c.layout);
  const Tensor grad_out = randn(qs, c.dtype, 4);
  const FwdBwd golden =
      run_fwd_bwd(SDPBackend::MATH, f64(q), f64(k), f64(v), f64(grad_out),
                  options_for(c, DType::kFloat64, 5));
  const FwdBwd naive = run_fwd_bwd(SDPBackend::MATH, q, k, v, grad_out, options_for(c, c.dtype, 5));

  SDPAOptions o = options_for(c, c.dtype, 5);
  if (o.attn_mask.tensor().defined()) o.attn_mask = to_cuda(o.attn_mask.tensor());
  const Tensor dq = to_cuda(q), dk = to_cuda(k), dv = to_cuda(v), dgo = to_cuda(grad_out);
  if (!sdpa::can_use(backend, sdpa::make_params(dq, dk, dv, o))) return false;
  {
    // cuDNN may take a forward and refuse its backward (s_q = s_kv = 1).
    sdpa::sdpa_kernel only(backend);
    const sdpa::AttentionResult fwd = sdpa::scaled_dot_product_attention_with_lse(dq, dk, dv, o);
    SDPAOptions replay = o;
    replay.dropout_state = fwd.philox;
    if (!sdpa::can_use(backend, sdpa::make_backward_params(dgo, dq, dk, dv, fwd.out, fwd.lse,
                                                           replay))) {
      return false;
    }
  }
  const FwdBwd tested = to_cpu(run_fwd_bwd(backend, dq, dk, dv, dgo, o));
  EXPECT_EQ(tested.fwd.backend, backend);
  EXPECT_EQ(tested.grads.backend, backend);
  expect_matches_golden(tested, golden, naive, c.dtype);
  return true;
}

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

TEST_F(CudaAttention, MathMatchesGoldenOnOddShapes) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (auto [l, s] : {std::pair<int64_t, int64_t>{1, 1}, {7, 129}, {127, 7}, {65, 257}}) {
      for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kFloat, Mask::kBool}) {
        EXPECT_TRUE(check_on_gpu({2, 4, 2, l, s, 72, dtype, m, Layout::kBSHD}, SDPBackend::MATH));
      }
    }
  }
}

TEST_F(CudaAttention, MathHandlesEveryHeadDimAndFloat64) {
  for (int64_t e : {1, 5, 64, 200}) {
    EXPECT_TRUE(check_on_gpu({1, 3, 3, 33, 47, e, DType::kFloat64, Mask::kCausal},
                             SDPBackend::MATH));
  }
}

TEST_F(CudaAttention, CudnnMatchesGolden) {
  // Every mask kind and odd size in bfloat16 with GQA; float16 on fewer combinations
  // (each distinct call builds two cuDNN graphs, about a second).
  const std::pair<int64_t, int64_t> sizes[] = {{1, 1}, {7, 7}, {127, 129}, {129, 127}};
  for (int64_t e : {64, 128}) {
    for (auto [l, s] : sizes) {
      for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kCausalLowerRight, Mask::kWindow,
                     Mask::kFloat}) {
        // Refused: rows without keys (bottom-right causal, L > S) and the sliding window
        // with L > S (sdpa's lowering), the backward of L = S = 1 (cuDNN).
        const bool refused = (l > s && (m == Mask::kCausalLowerRight || m == Mask::kWindow)) ||
                             (l == 1 && s == 1);
        EXPECT_EQ(check_on_gpu({2, 8, 2, l, s, e, DType::kBFloat16, m},
                               SDPBackend::CUDNN_ATTENTION),
                  !refused)
            << "L " << l << " S " << s << " mask " << mask_name(m);
      }
    }
  }
  for (auto [l, s] : {sizes[1], sizes[2]}) {
    for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kFloat}) {
      EXPECT_TRUE(check_on_gpu({2, 8, 8, l, s, 64, DType::kFloat16, m},
                               SDPBackend::CUDNN_ATTENTION));
    }
  }
}

// Long rows (the golden costs seconds on the CPU, so fewer combinations).
TEST_F(CudaAttention, CudnnMatchesGoldenOnLongRows) {
  for (Mask m : {Mask::kNone, Mask::kCausal, Mask::kWindow, Mask::kFloat}) {
    EXPECT_TRUE(check_on_gpu({1, 4, 2, 1000, 1000, 128, DType::kBFloat16, m},
                             SDPBackend::CUDNN_ATTENTION));
  }
  EXPECT_TRUE(check_on_gpu({1, 2, 1, 4097, 4097, 64, DType::kBFloat16, Mask::kCausal},
                           SDPBackend::CUDNN_ATTENTION));
}

TEST_F(CudaAttention, CudnnTakesStridedInputs) {
  EXPECT_TRUE(check_on_gpu({2, 8, 8, 129, 257, 64, DType::kBFloat16, Mask::kCausal, Layout::kBSHD},
                           SDPBackend::CUDNN_ATTENTION));
}

TEST_F(CudaAttention, DefaultSelectionPrefersCudnnForHalfTypes) {
  const Tensor q = to_cuda(randn({1, 4, 64, 64}, DType::kBFloat16, 1));
  EXPECT_EQ(sdpa::scaled_dot_product_attention_with_lse(q, q, q, {}).backend,
            sdpa::cuda::cudnn_is_built() ? SDPBackend::CUDNN_ATTENTION : SDPBackend::MATH);
  const Tensor q32 = to_cuda(randn({1, 4, 64, 64}, DType::kFloat32, 1));
  EXPECT_EQ(sdpa::scaled_dot_product_attention_with_lse(q32, q32, q32, {}).backend,
            SDPBackend::MATH);
}

TEST_F(CudaAttention, MathDropoutDropsTheSameElementsAsTheCpu) {
  const Tensor q = randn({2, 3, 37, 40}, DType::kFloat32, 1);
  const Tensor k = randn({2, 3, 53, 40}, DType::kFloat32, 2);
  const Tensor v = randn({2, 3, 53, 40}, DType::kFloat32, 3);
  const Tensor grad_out = randn({2, 3, 37, 40}, DType::kFloat32, 4);
  SDPAOptions o;
  o.dropout_p = 0.3;
  o.dropout_state = sdpa::PhiloxState{0x123456789abcull, 7};
  const FwdBwd cpu = run_fwd_bwd(SDPBackend::MATH, q, k, v, grad_out, o);
  const FwdBwd gpu = to_cpu(run_fwd_bwd(SDPBackend::MATH, to_cuda(q), to_cuda(k), to_cuda(v),
                                        to_cuda(grad_out), o));
  EXPECT_TRUE(close_to("out", gpu.fwd.out, cpu.fwd.out, DType::kFloat32));
  EXPECT_TRUE(close_to("grad_q", gpu.grads.grad_q, cpu.grads.grad_q, DType::kFloat32));
  EXPECT_TRUE(close_to("grad_k", gpu.grads.grad_k, cpu.grads.grad_k, DType::kFloat32));
  EXPECT_TRUE(close_to("grad_v", gpu.grads.grad_v, cpu.grads.grad_v, DType::kFloat32));
}

TEST_F(CudaAttention, MathMaskGradientMatchesTheCpu) {
  const Tensor q = randn({2, 3, 19, 24}, DType::kFloat32, 1);
  const Tensor k = randn({2, 3, 33, 24}, DType::kFloat32, 2);
  const Tensor v = randn({2, 3, 33, 24}, DType::kFloat32, 3);
  const Tensor grad_out = randn({2, 3, 19, 24}, DType::kFloat32, 4);
  const Tensor mask = randn({1, 3, 19, 33}, DType::kFloat32, 5);
  SDPAOptions o;
  o.attn_mask = mask;
  o.attn_mask_requires_grad = true;
  const FwdBwd cpu = run_fwd_bwd(SDPBackend::MATH, q, k, v, grad_out, o);
  o.attn_mask = to_cuda(mask);
  const FwdBwd gpu = to_cpu(run_fwd_bwd(SDPBackend::MATH, to_cuda(q), to_cuda(k), to_cuda(v),
                                        to_cuda(grad_out), o));
  ASSERT_TRUE(gpu.grads.grad_attn_mask.defined());
  EXPECT_EQ(gpu.grads.grad_attn_mask.sizes(), mask.sizes());
  EXPECT_TRUE(close_to("grad_attn_mask", gpu.grads.grad_attn_mask, cpu.grads.grad_attn_mask,
                       DType::kFloat32));
}

TEST_F(CudaAttention, CudnnDeterministicBackwardRepeatsBitForBit) {
  const bool was = sdpa::are_deterministic_algorithms_enabled();
  sdpa::use_deterministic_algorithms(true);
  const Tensor q = to_cuda(randn({2, 8, 300, 64}, DType::kBFloat16, 1));
  const Tensor g = to_cuda(randn({2, 8, 300, 64}, DType::kBFloat16, 2));
  const FwdBwd a = to_cpu(run_fwd_bwd(SDPBackend::CUDNN_ATTENTION, q, q, q, g, {}));
  const FwdBwd b = to_cpu(run_fwd_bwd(SDPBackend::CUDNN_ATTENTION, q, q, q, g, {}));
  sdpa::use_deterministic_algorithms(was);
  EXPECT_TRUE(bit_identical(a.grads.grad_q, b.grads.grad_q));
  EXPECT_TRUE(bit_identical(a.grads.grad_k, b.grads.grad_k));
  EXPECT_TRUE(bit_identical(a.grads.grad_v, b.grads.grad_v));
}

TEST_F(CudaAttention, CudnnDropoutReplaysItsMask) {
  const Tensor q = to_cuda(randn({2, 4, 128, 64}, DType::kBFloat16, 1));
  SDPAOptions o;
  o.dropout_p = 0.25;
  o.dropout_state = sdpa::PhiloxState{99, 3};
  sdpa::sdpa_kernel only(SDPBackend::CUDNN_ATTENTION);
  sdpa::Reasons reasons;
  if (!sdpa::can_use(SDPBackend::CUDNN_ATTENTION, sdpa::make_params(q, q, q, o), &reasons)) {
    GTEST_SKIP() << "cuDNN refuses dropout here: " << reasons.items.front();
  }
  const Tensor a = to_cpu(sdpa::scaled_dot_product_attention(q, q, q, o));
  const Tensor b = to_cpu(sdpa::scaled_dot_product_attention(q, q, q, o));
  EXPECT_TRUE(bit_identical(a, b));
  o.dropout_state = sdpa::PhiloxState{99, 4};
  EXPECT_FALSE(bit_identical(a, to_cpu(sdpa::scaled_dot_product_attention(q, q, q, o))));
}

TEST_F(CudaAttention, WorkRunsOnTheCallersStream) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const Tensor q = randn({2, 8, 257, 64}, DType::kBFloat16, 1);
  const FwdBwd golden =
      run_fwd_bwd(SDPBackend::MATH, f64(q), f64(q), f64(q), f64(q), SDPAOptions{});
  const FwdBwd naive = run_fwd_bwd(SDPBackend::MATH, q, q, q, q, SDPAOptions{});
  {
    // Device tensors are freed on the stream they were allocated on: before it goes.
    const Tensor dq = to_cuda(q, stream);
    SDPAOptions o;
    o.stream = stream;
    const FwdBwd tested = run_fwd_bwd(SDPBackend::CUDNN_ATTENTION, dq, dq, dq, dq, o);
    sdpa::cuda::synchronize(stream);
    const FwdBwd host = to_cpu(tested);
    EXPECT_TRUE(close_to_golden("out", host.fwd.out, golden.fwd.out, naive.fwd.out,
                                DType::kBFloat16));
    EXPECT_TRUE(close_to_golden("grad_q", host.grads.grad_q, golden.grads.grad_q,
                                naive.grads.grad_q, DType::kBFloat16));
  }
  sdpa::cuda::synchronize(stream);
  cudaStreamDestroy(stream);
}

TEST_F(CudaAttention, GraphCacheHitsOnRepeatedCalls) {
  if (!sdpa::cuda::cudnn_is_built()) GTEST_SKIP() << "built without cuDNN";
  const Tensor q = to_cuda(randn({1, 2, 96, 64}, DType::kFloat16, 1));
  sdpa::sdpa_kernel only(SDPBackend::CUDNN_ATTENTION);
  sdpa::scaled_dot_product_attention(q, q, q, {});
  const auto before = sdpa::cuda::cudnn_graph_cache_stats();
  for (int i = 0; i < 5; ++i) sdpa::scaled_dot_product_attention(q, q, q, {});
  const auto after = sdpa::cuda::cudnn_graph_cache_stats();
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_GE(after.hits - before.hits, 5);
}

TEST_F(CudaAttention, MixedDevicesAreErrors) {
  const Tensor host = randn({1, 2, 8, 64}, DType::kFloat16, 1);
  const Tensor dev = to_cuda(host);
  EXPECT_NE(error_message([&] { sdpa::scaled_dot_product_attention(dev, host, dev, {}); })
                .find("key: expected device cuda:0"),
            std::string::npos);
}

TEST_F(CudaAttention, MemoryStatsCountDeviceTensors) {
  const int64_t before = sdpa::cuda::memory_stats(0).current_bytes;
  {
    const Tensor t = sdpa::cuda::empty({1024, 1024}, DType::kFloat32);
    sdpa::cuda::synchronize();
    EXPECT_EQ(sdpa::cuda::memory_stats(0).current_bytes - before, 4 << 20);
  }
  EXPECT_EQ(sdpa::cuda::memory_stats(0).current_bytes, before);
}

}  // namespace
}  // namespace sdpa_test
