// Flex score_mods and BlockMasks of bands on CUDNN_ATTENTION (lowered to cuDNN's score_mod
// subgraph, the backward through the derived score_mod_bprop; a band natively) against the
// float64 CPU flex golden, with the tolerance the naive CPU MATH run in the tested dtype
// sets. Every test needs a GPU and
// skips, with the reason, without one.

#include <cmath>
#include <optional>
#include <utility>

#include "sdpa/attn_bias.h"
#include "sdpa/cuda.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"
#include "cuda/native_mask_cases.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::Device;
using sdpa::DeviceType;
using sdpa::SDPBackend;
using sdpa::flex::Expr;
using sdpa::flex::Program;

const Device kCuda{DeviceType::kCUDA, 0};

Tensor to_cpu(const Tensor& t) { return sdpa::cuda::to_device(t, Device{}); }

FwdBwd to_cpu(FwdBwd r) {
  for (Tensor* t : {&r.fwd.out, &r.fwd.lse, &r.grads.grad_q, &r.grads.grad_k, &r.grads.grad_v}) {
    *t = to_cpu(*t);
  }
  return r;
}

// Distinct positive ALiBi-like slopes, float32 [heads].
Tensor slopes(int64_t heads, uint64_t seed) {
  Tensor t = Tensor::empty({heads}, DType::kFloat32);
  const Tensor noise = randn({heads}, DType::kFloat64, seed);
  for (int64_t h = 0; h < heads; ++h) {
    t.data<float>()[h] = static_cast<float>(0.05 + 0.02 * std::fabs(noise.data<double>()[h]));
  }
  return t;
}

struct FlexCase {
  int64_t batch, heads_q, heads_kv, q_len, kv_len, head_dim;
  DType dtype;
};

FwdBwd run_flex(SDPBackend backend, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& grad_out, const Program& mod, bool gqa) {
  sdpa::sdpa_kernel only(backend);
  sdpa::SDPAOptions o;
  o.enable_gqa = gqa;
  FwdBwd r;
  r.fwd = sdpa::flex_attention(q, k, v, mod, nullptr, o);
  r.grads = sdpa::flex_attention_backward(grad_out, q, k, v, r.fwd.out, r.fwd.lse, mod, nullptr, o);
  return r;
}

// Runs `mod` on cuDNN (inputs copied to the GPU) and on the CPU's MATH in float64 (the
// golden) and in c.dtype (the naive run that sets the tolerance).
// `host_mod` is `mod` with its captured tensors on the CPU (the golden reads them there).
// Without `backward_on_cudnn`, only the forward is compared and the backward must be
// refused by CUDNN_ATTENTION's checks.
void check_mod(const std::string& name, const Program& mod, const Program& host_mod,
               const FlexCase& c, bool backward_on_cudnn) {
  SCOPED_TRACE(name + " L" + std::to_string(c.q_len) + " S" + std::to_string(c.kv_len) + " E" +
               std::to_string(c.head_dim) + " Hq/Hkv " + std::to_string(c.heads_q) + "/" +
               std::to_string(c.heads_kv) + " " + std::string(sdpa::dtype_name(c.dtype)));
  const Shape qs{c.batch, c.heads_q, c.q_len, c.head_dim};
  const Shape kvs{c.batch, c.heads_kv, c.kv_len, c.head_dim};
  const Tensor q = randn(qs, c.dtype, 11), k = randn(kvs, c.dtype, 12), v = randn(kvs, c.dtype, 13);
  const Tensor grad_out = randn(qs, c.dtype, 14);
  const bool gqa = c.heads_q != c.heads_kv;
  const FwdBwd golden =
      run_flex(SDPBackend::MATH, f64(q), f64(k), f64(v), f64(grad_out), host_mod, gqa);
  const FwdBwd naive = run_flex(SDPBackend::MATH, q, k, v, grad_out, host_mod, gqa);
  const auto gpu = [](const Tensor& t) { return sdpa::cuda::to_device(t, kCuda); };
  if (!backward_on_cudnn) {
    sdpa::sdpa_kernel only(SDPBackend::CUDNN_ATTENTION);
    sdpa::SDPAOptions o;
    o.enable_gqa = gqa;
    const sdpa::AttentionResult fwd = sdpa::flex_attention(gpu(q), gpu(k), gpu(v), mod, nullptr, o);
    EXPECT_TRUE(close_to_golden("out", to_cpu(fwd.out), golden.fwd.out, naive.fwd.out, c.dtype));
    EXPECT_TRUE(close_to_golden("lse", to_cpu(fwd.lse), golden.fwd.lse, naive.fwd.lse,
                                DType::kFloat32, kFudge, c.dtype));
    EXPECT_NE(error_message([&] {
                sdpa::flex_attention_backward(gpu(grad_out), gpu(q), gpu(k), gpu(v), fwd.out,
                                              fwd.lse, mod, nullptr, o);
              }).find("CUDNN_ATTENTION is not supported"),
              std::string::npos);
    return;
  }
  FwdBwd tested = run_flex(SDPBackend::CUDNN_ATTENTION, gpu(q), gpu(k), gpu(v), gpu(grad_out), mod, gqa);
  EXPECT_EQ(tested.fwd.backend, SDPBackend::CUDNN_ATTENTION);
  EXPECT_EQ(tested.grads.backend, SDPBackend::CUDNN_ATTENTION);
  tested = to_cpu(tested);
  expect_matches_golden(tested, golden, naive, c.dtype);
}

// The mods of the list that cuDNN can express, and programs that exercise each
// lowering rule (operand swaps, logical ops on int32, selects, int-to-float casts).
struct NamedMod {
  std::string name;
  Program mod, host_mod;
  bool backward_on_cudnn = true;
  NamedMod(std::string n, const Program& p) : name(std::move(n)), mod(p), host_mod(p) {}
  NamedMod(std::string n, const Program& p, const Program& host, bool backward = true)
      : name(std::move(n)), mod(p), host_mod(host), backward_on_cudnn(backward) {}
};

std::vector<NamedMod> mods(int64_t heads) {
  using sdpa::flex::where;
  std::vector<NamedMod> m;
  m.emplace_back("soft_cap", Program::from_score_mod(sdpa::flex::mods::soft_cap(1.5)));
  // The backward of a score_mod reading captured tensors without a final mask select is
  // refused (cuDNN 9.19 on an H200 returned grad_v = 0 for these three).
  const Program host_alibi = Program::from_score_mod(sdpa::flex::mods::alibi(slopes(heads, 21)));
  m.emplace_back("alibi host slopes", host_alibi, host_alibi, false);
  const Tensor host_slopes = slopes(heads, 22);
  m.emplace_back("alibi device slopes",
                 Program::from_score_mod(sdpa::flex::mods::alibi(
                     sdpa::cuda::to_device(host_slopes, kCuda))),
                 Program::from_score_mod(sdpa::flex::mods::alibi(host_slopes)), false);
  m.emplace_back("causal as a score_mod", Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return where(q >= kv, s, Expr(-INFINITY));
      }));
  m.emplace_back("window with a logical and", Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return where((q >= kv) && (q - kv <= Expr(16)), s, Expr(-INFINITY));
      }));
  m.emplace_back("constants first", Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
        const Expr distance = sdpa::flex::to_float(q - kv);
        return where(Expr(5) < kv, Expr(0.5) * s, s) - Expr(0.02) * distance +
               Expr(1.0) / (Expr(2.0) + sdpa::flex::to_float(h));
      }));
  // cuDNN has no engine for this backward ("No valid engine configs"): refused by the
  // graph check.
  const Program gate = Program::from_score_mod(
      [](const Expr& s, const Expr& b, const Expr&, const Expr&, const Expr&) {
        return s * sdpa::flex::sigmoid(sdpa::flex::to_float(b) - Expr(0.5)) + sdpa::flex::abs(s) * Expr(0.1);
      });
  m.emplace_back("sigmoid gate per batch", gate, gate, false);
  const Tensor host_scale = slopes(heads, 23);
  const auto scaled = [](const Tensor& t) {
    const sdpa::flex::Captured c("scale", t);
    return Program::from_score_mod([c](const Expr& s, const Expr&, const Expr& h, const Expr&,
                                       const Expr&) { return s * Expr(c[h]) * Expr(8.0); });
  };
  m.emplace_back("captured tensor in the derivative",
                 scaled(sdpa::cuda::to_device(host_scale, kCuda)), scaled(host_scale), false);
  m.emplace_back("alibi under a causal select", Program::from_score_mod(
      [c = sdpa::flex::Captured("slopes", slopes(heads, 24))](
          const Expr& s, const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
        return sdpa::flex::where(q >= kv, s - Expr(c[h]) * sdpa::flex::to_float(q - kv),
                                 Expr(-INFINITY));
      }));
  m.emplace_back("additive, derivative 1", Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return s + Expr(0.05) * sdpa::flex::to_float(q - kv);
      }));
  return m;
}

constexpr int kMods = 10;

class CudnnFlex : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!sdpa::cuda::is_available()) GTEST_SKIP() << sdpa::cuda::unavailable_reason();
  }
};

// One test per mod (so one refused or wrong mod does not hide the others).
class CudnnFlexMod : public CudnnFlex, public ::testing::WithParamInterface<int> {};

TEST_P(CudnnFlexMod, MatchesTheCpuGoldenForwardAndBackward) {
  for (const FlexCase& c : {FlexCase{2, 4, 2, 65, 129, 64, DType::kBFloat16},
                            FlexCase{1, 4, 4, 127, 127, 128, DType::kFloat16},
                            FlexCase{2, 8, 1, 7, 257, 64, DType::kBFloat16}}) {
    const NamedMod m = mods(c.heads_q).at(static_cast<size_t>(GetParam()));
    check_mod(m.name, m.mod, m.host_mod, c, m.backward_on_cudnn);
  }
}

INSTANTIATE_TEST_SUITE_P(Mods, CudnnFlexMod, ::testing::Range(0, kMods));

// ALiBi, packed documents and key padding given as AttnBiases (native_mask_cases.h) reach
// cuDNN as a score_mod. ALiBi alone has no cuDNN backward (refused, as for flex score_mods).
bool cudnn_takes_backward(const NativeMaskCase& c) { return c.name != "alibi"; }

class CudnnNativeMask : public CudnnFlex, public ::testing::WithParamInterface<int> {};

TEST_P(CudnnNativeMask, RunsOnCudnnAndMatchesTheCpuGolden) {
  const int64_t heads_q = 8, heads_kv = 2;
  const NativeMaskCase c = native_mask_cases(heads_q).at(static_cast<size_t>(GetParam()));
  SCOPED_TRACE(c.name + " L" + std::to_string(c.q_len) + " S" + std::to_string(c.kv_len));
  const Shape qs{2, heads_q, c.q_len, 64}, kvs{2, heads_kv, c.kv_len, 64};
  const Tensor q = randn(qs, DType::kBFloat16, 1), k = randn(kvs, DType::kBFloat16, 2);
  const Tensor v = randn(kvs, DType::kBFloat16, 3), grad_out = randn(qs, DType::kBFloat16, 4);
  sdpa::SDPAOptions o;
  o.enable_gqa = true;
  o.attn_mask = c.bias;
  const FwdBwd golden = run_fwd_bwd(SDPBackend::MATH, f64(q), f64(k), f64(v), f64(grad_out), o);
  const FwdBwd naive = run_fwd_bwd(SDPBackend::MATH, q, k, v, grad_out, o);
  const auto gpu = [](const Tensor& t) { return sdpa::cuda::to_device(t, kCuda); };
  if (!cudnn_takes_backward(c)) {
    sdpa::sdpa_kernel only(SDPBackend::CUDNN_ATTENTION);
    const sdpa::AttentionResult fwd = sdpa::scaled_dot_product_attention_with_lse(gpu(q), gpu(k), gpu(v), o);
    EXPECT_TRUE(close_to_golden("out", to_cpu(fwd.out), golden.fwd.out, naive.fwd.out, DType::kBFloat16));
    sdpa::Reasons reasons;
    EXPECT_FALSE(sdpa::can_use(SDPBackend::CUDNN_ATTENTION,
                               sdpa::make_backward_params(gpu(grad_out), gpu(q), gpu(k), gpu(v),
                                                          fwd.out, fwd.lse, o),
                               &reasons));
    return;
  }
  FwdBwd tested = run_fwd_bwd(SDPBackend::CUDNN_ATTENTION, gpu(q), gpu(k), gpu(v), gpu(grad_out), o);
  EXPECT_EQ(tested.fwd.backend, SDPBackend::CUDNN_ATTENTION);
  tested = to_cpu(tested);
  expect_matches_golden(tested, golden, naive, DType::kBFloat16);
}

INSTANTIATE_TEST_SUITE_P(Masks, CudnnNativeMask, ::testing::Range(0, 7));

TEST_F(CudnnFlex, ReTracedModsHitTheGraphCache) {
  const FlexCase c{1, 2, 2, 33, 40, 64, DType::kBFloat16};
  const Tensor q = sdpa::cuda::to_device(randn({1, 2, 33, 64}, c.dtype, 1), kCuda);
  const Tensor kv = sdpa::cuda::to_device(randn({1, 2, 40, 64}, c.dtype, 2), kCuda);
  sdpa::sdpa_kernel only(SDPBackend::CUDNN_ATTENTION);
  (void)sdpa::flex_attention(q, kv, kv, sdpa::flex::mods::soft_cap(7.0));
  const auto before = sdpa::cuda::cudnn_graph_cache_stats();
  (void)sdpa::flex_attention(q, kv, kv, sdpa::flex::mods::soft_cap(7.0));  // traced again
  const auto after = sdpa::cuda::cudnn_graph_cache_stats();
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_GT(after.hits, before.hits);
  (void)sdpa::flex_attention(q, kv, kv, sdpa::flex::mods::soft_cap(9.0));  // another constant
  EXPECT_EQ(sdpa::cuda::cudnn_graph_cache_stats().misses, after.misses + 1);
}

// BlockMasks whose mask_mod is a band (causal, sliding window) run on cuDNN's native band,
// or inside the score_mod subgraph beside a score_mod; odd sizes, GQA, L < S and (causal:
// cuDNN's window needs L <= S) L > S.
TEST_F(CudnnFlex, BlockMasksOfBandsMatchTheCpuGolden) {
  using sdpa::flex::create_block_mask;
  const std::optional<Program> no_mod;
  const Program cap = Program::from_score_mod(sdpa::flex::mods::soft_cap(1.5));
  for (const FlexCase& c : {FlexCase{2, 4, 2, 65, 129, 64, DType::kBFloat16},
                            FlexCase{1, 4, 4, 200, 257, 128, DType::kFloat16},
                            FlexCase{1, 2, 1, 150, 97, 64, DType::kBFloat16}}) {
    for (const auto& [name, mask] :
         {std::pair<const char*, Program>{"causal", Program::from_mask_mod(sdpa::flex::mods::causal())},
          {"window 40", Program::from_mask_mod(sdpa::flex::mods::sliding_window(40))}}) {
      if (std::string(name) != "causal" && c.q_len > c.kv_len) continue;
      for (const std::optional<Program>& mod : {no_mod, std::optional<Program>(cap)}) {
        SCOPED_TRACE(std::string(name) + (mod ? " soft-cap" : "") + " L" + std::to_string(c.q_len) +
                     " S" + std::to_string(c.kv_len));
        const sdpa::flex::BlockMask blocks = create_block_mask(mask, 1, 1, c.q_len, c.kv_len, 64);
        const Shape qs{c.batch, c.heads_q, c.q_len, c.head_dim};
        const Shape kvs{c.batch, c.heads_kv, c.kv_len, c.head_dim};
        const Tensor q = randn(qs, c.dtype, 31), k = randn(kvs, c.dtype, 32);
        const Tensor v = randn(kvs, c.dtype, 33), grad_out = randn(qs, c.dtype, 34);
        sdpa::SDPAOptions o;
        o.enable_gqa = c.heads_q != c.heads_kv;
        const auto run = [&](SDPBackend backend, const Tensor& q_, const Tensor& k_,
                             const Tensor& v_, const Tensor& g_) {
          sdpa::sdpa_kernel only(backend);
          FwdBwd r;
          r.fwd = sdpa::flex_attention(q_, k_, v_, mod, &blocks, o);
          r.grads = sdpa::flex_attention_backward(g_, q_, k_, v_, r.fwd.out, r.fwd.lse, mod,
                                                  &blocks, o);
          return r;
        };
        const FwdBwd golden = run(SDPBackend::MATH, f64(q), f64(k), f64(v), f64(grad_out));
        const FwdBwd naive = run(SDPBackend::MATH, q, k, v, grad_out);
        const auto gpu = [](const Tensor& t) { return sdpa::cuda::to_device(t, kCuda); };
        FwdBwd tested = run(SDPBackend::CUDNN_ATTENTION, gpu(q), gpu(k), gpu(v), gpu(grad_out));
        EXPECT_EQ(tested.fwd.backend, SDPBackend::CUDNN_ATTENTION);
        EXPECT_EQ(tested.grads.backend, SDPBackend::CUDNN_ATTENTION);
        expect_matches_golden(to_cpu(tested), golden, naive, c.dtype);
      }
    }
  }
}

TEST_F(CudnnFlex, ProgramsCudnnCannotExpressAreRefusedByName) {
  const Tensor q = sdpa::cuda::to_device(randn({1, 2, 16, 64}, DType::kBFloat16, 1), kCuda);
  const Tensor table = randn({2, 2 * 16 + 1}, DType::kFloat32, 3);
  const Program gather = Program::from_score_mod(sdpa::flex::mods::relative_position(table, 16));
  sdpa::AttentionParams p = sdpa::make_params(q, q, q, {});
  p.mask.score_mod = std::make_shared<const Program>(gather);
  sdpa::Reasons reasons;
  EXPECT_FALSE(sdpa::can_use(SDPBackend::CUDNN_ATTENTION, p, &reasons));
  std::string all;
  for (const std::string& r : reasons.items) all += r + "\n";
  EXPECT_NE(all.find("no gather"), std::string::npos) << all;
}

}  // namespace
}  // namespace sdpa_test
