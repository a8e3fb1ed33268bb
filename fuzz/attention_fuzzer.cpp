// libFuzzer target over the public attention API: scaled_dot_product_attention (forward
// and backward) and flex_attention on shapes from 0 to near-overflow, every dtype,
// contiguous / permuted / zero-stride / overlapping inputs, every mask kind broadcast or
// not, edge scales and dropout rates, GQA ratios and the standard score_mods and
// BlockMasks. Every call must return or throw sdpa::Error; a valid call with finite,
// moderate inputs must give FLASH == MATH within the dtype's tolerance, forward and
// backward. Anything else aborts, which libFuzzer records as a crash.
//
// Build and run: scripts/fuzz.sh (docs/reliability.md).

#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "program_gen.h"  // tests/flex: seeded random score_mod / mask_mod programs
#include "sdpa/attn_bias.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"
#include "sdpa/sdpa.h"

namespace {

using namespace sdpa;

// Calls whose kernels would do more than this many multiply-adds only go through the
// checks (explain), so that every input finishes in milliseconds.
constexpr double kMaxWork = 4e6;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "attention_fuzzer finding: %s\n", what.c_str());
  std::abort();
}

int64_t pick_length(FuzzedDataProvider& in) {
  static constexpr int64_t kLengths[] = {0, 1, 2, 7, 15, 16, 17, 63, 64, 65, 130, 257};
  if (in.ConsumeIntegralInRange(0, 15) == 0) {
    // Near-overflow sizes: only the size checks and explain may see these.
    return int64_t{1} << in.ConsumeIntegralInRange(20, 62);
  }
  return in.PickValueInArray(kLengths);
}

DType pick_dtype(FuzzedDataProvider& in) {
  static constexpr DType kTypes[] = {DType::kFloat32, DType::kFloat32, DType::kBFloat16,
                                     DType::kFloat16, DType::kFloat64};
  return in.PickValueInArray(kTypes);
}

// A [d0, d1, d2, d3] tensor of `dtype`, normal values times `magnitude`, laid out as
// chosen by the input: contiguous, BSHD-permuted, a zero-stride broadcast of one row, or
// a strided slice of a larger buffer. Sizes too large to hold become broadcasts of one
// element (zero strides), which the size checks must then handle.
Tensor make_input(FuzzedDataProvider& in, const Shape& shape, DType dtype, double magnitude,
                  std::mt19937& rng) {
  // Inputs past 2^20 elements are broadcast views: drawing and converting more took over
  // the 10 s per-input budget under the sanitizers (2^24 elements: 25 s).
  constexpr int64_t kMaxDrawn = int64_t{1} << 20;
  int64_t elements = 1;
  bool huge = false;
  for (int64_t s : shape) {
    if (s > kMaxDrawn || (s > 0 && elements > kMaxDrawn / s)) huge = true;
    elements *= huge ? 1 : s;
  }
  const int layout = in.ConsumeIntegralInRange(0, 3);
  if (huge || layout == 2) {
    const bool huge_rows = shape[3] > (int64_t{1} << 24);
    return Tensor::full({1, 1, 1, huge_rows ? 1 : shape[3]}, magnitude * 0.5, dtype).expand(shape);
  }
  std::normal_distribution<double> normal(0.0, magnitude);
  Shape alloc = shape;
  if (layout == 3) alloc[3] = shape[3] * 2 + 1;  // every other element of wider rows
  Tensor t = Tensor::empty(layout == 1 ? Shape{alloc[0], alloc[2], alloc[1], alloc[3]} : alloc,
                           DType::kFloat64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = normal(rng);
  t = t.to(dtype);
  if (layout == 1) return t.transpose(1, 2);
  if (layout == 3) return t.slice(3, 1, 1 + 2 * shape[3], 2);
  return t;
}

// An attn_mask of one of the kinds the library takes, or none.
AttnMask make_mask(FuzzedDataProvider& in, int64_t B, int64_t H, int64_t L, int64_t S, DType dtype,
                   std::mt19937& rng) {
  const int kind = in.ConsumeIntegralInRange(0, 9);
  switch (kind) {
    case 1:
    case 2: {
      // Dense bool (kind 1) or additive float (kind 2), broadcast over batch and heads
      // or full; some rows fully masked. At most 2^20 elements, each set one by one: a
      // [3, 64, 2^20, 1] mask took minutes under the sanitizers.
      const bool full = in.ConsumeBool();
      constexpr int64_t kMaxMask = int64_t{1} << 20;
      const int64_t slices = full ? B * H : 1;
      if (L > kMaxMask || S > kMaxMask || L * S > kMaxMask ||
          (slices > 0 && L * S > kMaxMask / slices)) {
        return {};
      }
      Tensor m = Tensor::empty({full ? B : 1, full ? H : 1, L, S},
                               kind == 1 ? DType::kBool : dtype);
      std::bernoulli_distribution keep(in.ConsumeProbability<double>());
      for (int64_t i = 0; i < m.numel(); ++i) {
        const bool k = keep(rng);
        const Shape index = {i / (m.size(1) * L * S), (i / (L * S)) % m.size(1), (i / S) % L,
                             i % S};
        m.set_item(index, kind == 1 ? (k ? 1.0 : 0.0)
                                    : (k ? std::ldexp(static_cast<double>(rng() % 64), -4)
                                         : -INFINITY));
      }
      return m;
    }
    case 3:
      return causal_lower_right(L, S);
    case 4:
      return std::make_shared<LocalAttentionBias>(
          in.ConsumeIntegralInRange<int64_t>(0, 300),
          in.ConsumeBool() ? std::optional<int64_t>{} : in.ConsumeIntegral<int64_t>());
    case 5:
      return std::make_shared<AlibiBias>(H);
    case 6: {
      std::vector<int64_t> kv_lengths;
      for (int64_t b = 0; b < std::min<int64_t>(B, 64); ++b) {
        kv_lengths.push_back(in.ConsumeIntegralInRange<int64_t>(-1, S + 1));
      }
      return std::make_shared<PaddedKeysBias>(kv_lengths, in.ConsumeBool());
    }
    case 7: {
      std::vector<int64_t> cu{0};
      while (cu.back() < L && cu.size() < 32) {
        cu.push_back(cu.back() + in.ConsumeIntegralInRange<int64_t>(0, 70));
      }
      return std::make_shared<BlockDiagonalBias>(cu, cu);
    }
    case 8: {
      // ALiBi's additive term composed with a mask: with a score_mod, the term goes into
      // it and the mask acts after it on every backend.
      AttnBiasPtr mask;
      switch (in.ConsumeIntegralInRange(0, 2)) {
        case 0: mask = causal_lower_right(L, S); break;
        case 1:
          mask = std::make_shared<LocalAttentionBias>(in.ConsumeIntegralInRange<int64_t>(0, 80),
                                                      in.ConsumeIntegralInRange<int64_t>(0, 5));
          break;
        default:
          mask = std::make_shared<PaddedKeysBias>(
              std::vector<int64_t>(static_cast<size_t>(std::min<int64_t>(B, 64)),
                                   in.ConsumeIntegralInRange<int64_t>(0, S)),
              true);
      }
      return compose({std::make_shared<AlibiBias>(H), mask});
    }
    default:
      return {};
  }
}

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return 4e-2;
    case DType::kFloat16:
      return 8e-3;
    default:
      return 5e-4;
  }
}

// Largest |a - b| over elements, NaN when exactly one side is NaN at some element.
double max_difference(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(DType::kFloat64).contiguous(), y = b.to(DType::kFloat64).contiguous();
  double worst = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double p = x.data<double>()[i], q = y.data<double>()[i];
    if (std::isnan(p) != std::isnan(q)) return NAN;
    if (!std::isnan(p) && !(std::isinf(p) && p == q)) worst = std::max(worst, std::abs(p - q));
  }
  return worst;
}

struct Call {
  Tensor q, k, v;
  SDPAOptions options;
  std::optional<flex::Program> score_mod;
  std::shared_ptr<flex::BlockMask> block_mask;

  std::string describe() const {
    return "q " + q.describe() + ", k " + k.describe() + ", v " + v.describe() + ", mask " +
           options.attn_mask.describe() + (options.is_causal ? ", causal" : "") + ", scale " +
           (options.scale ? std::to_string(*options.scale) : "default") +
           (score_mod ? ", score_mod" : "") + (block_mask ? ", block_mask" : "");
  }
};

double max_magnitude(const Tensor& t) {
  const Tensor x = t.to(DType::kFloat64);
  double m = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::isfinite(x.data<double>()[i])) m = std::max(m, std::abs(x.data<double>()[i]));
  }
  return m;
}

// `extra`: an error term the algorithms differ by on top of the dtype's rounding.
void expect_close(const char* what, const Tensor& flash, const Tensor& math, DType dtype,
                  double magnitude, const Call& c, double extra = 0.0) {
  const double diff = max_difference(flash, math);
  // Errors scale with the largest value (a half-precision ulp there) and with the inputs.
  const double bound =
      tolerance(dtype) * std::max({1.0, magnitude, max_magnitude(math)}) + extra;
  if (!(diff <= bound)) {
    finding(std::string("FLASH and MATH differ in ") + what + ": " + std::to_string(diff) +
            " > " + std::to_string(bound) + " for " + c.describe());
  }
}

// FLASH's backward takes D_i = sum_e dO_ie O_ie from the output it is given, rounded to
// the dtype, as FlashAttention-2 does; MATH's does not depend on that rounding. One ulp
// of O moves D_i by up to u * sum_e |dO_ie O_ie|: `per_row` is the largest such shift,
// `total` their sum over rows. In a near one-hot row (large scores) this is most of
// grad_q's error: 13% of its largest value in a bfloat16 case with scores near 30.
struct DeltaShift {
  double per_row = 0.0, total = 0.0;
};

DeltaShift delta_shift(const Tensor& grad_out, const Tensor& out, DType dtype) {
  const double u = dtype == DType::kBFloat16 ? 0x1p-8 : dtype == DType::kFloat16 ? 0x1p-10
                                                                                 : 0x1p-23;
  const int64_t Ev = out.size(out.dim() - 1);
  DeltaShift d;
  if (Ev == 0) return d;
  const Tensor g = grad_out.to(DType::kFloat64).contiguous();
  const Tensor o = out.to(DType::kFloat64).contiguous();
  for (int64_t row = 0; row < o.numel() / Ev; ++row) {
    double s = 0.0;
    for (int64_t e = row * Ev; e < (row + 1) * Ev; ++e) {
      const double x = std::abs(g.data<double>()[e] * o.data<double>()[e]);
      if (std::isfinite(x)) s += x;
    }
    d.per_row = std::max(d.per_row, u * s);
    d.total += u * s;
  }
  return d;
}

AttentionResult forward(const Call& c) {
  if (c.score_mod || c.block_mask) {
    return flex_attention(c.q, c.k, c.v, c.score_mod, c.block_mask.get(), c.options);
  }
  return scaled_dot_product_attention_with_lse(c.q, c.k, c.v, c.options);
}

AttentionGradients backward(const Call& c, const Tensor& grad_out, const AttentionResult& r) {
  SDPAOptions o = c.options;
  o.dropout_state = r.philox;
  if (c.score_mod || c.block_mask) {
    return flex_attention_backward(grad_out, c.q, c.k, c.v, r.out, r.lse, c.score_mod,
                                   c.block_mask.get(), o);
  }
  return scaled_dot_product_attention_backward(grad_out, c.q, c.k, c.v, r.out, r.lse, o);
}

// Runs `c` on `backend`; nullopt when the call was refused with an sdpa::Error.
std::optional<AttentionResult> try_forward(const Call& c, SDPBackend backend) {
  try {
    const sdpa_kernel only(backend);
    return forward(c);
  } catch (const Error&) {
    return std::nullopt;
  }
}

void run(FuzzedDataProvider& in) {
  std::mt19937 rng(in.ConsumeIntegral<uint32_t>());
  const DType dtype = pick_dtype(in);
  const int64_t B = in.ConsumeIntegralInRange(0, 3), Hkv = in.ConsumeIntegralInRange(1, 3);
  const int64_t Hq = Hkv * in.ConsumeIntegralInRange(1, 3) + (in.ConsumeIntegralInRange(0, 7) == 0);
  const int64_t L = pick_length(in), S = pick_length(in);
  const int64_t E = in.ConsumeIntegralInRange(0, 9) == 0 ? in.ConsumeIntegralInRange(0, 300)
                                                         : in.ConsumeIntegralInRange(1, 80);
  const int64_t Ev = in.ConsumeBool() ? E : in.ConsumeIntegralInRange(1, 70);
  const double magnitude = in.PickValueInArray({1.0, 1.0, 0.1, 3.0, 1e3});

  Call c;
  c.q = make_input(in, {B, Hq, L, E}, dtype, magnitude, rng);
  c.k = make_input(in, {B, Hkv, S, E}, dtype, magnitude, rng);
  c.v = make_input(in, {B, Hkv, S, Ev}, dtype, magnitude, rng);
  c.options.enable_gqa = in.ConsumeBool();
  c.options.is_causal = in.ConsumeIntegralInRange(0, 4) == 0;
  if (!c.options.is_causal) c.options.attn_mask = make_mask(in, B, Hq, L, S, dtype, rng);
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 1: c.options.scale = 0.0; break;
    case 2: c.options.scale = -0.3; break;
    case 3: c.options.scale = in.PickValueInArray<double>({INFINITY, NAN, 1e30, -1e-30}); break;
    case 4: c.options.scale = 2.0; break;
    default: break;
  }
  if (in.ConsumeIntegralInRange(0, 5) == 0) {
    c.options.dropout_p = in.PickValueInArray<double>({0.3, 1.0, -0.1, 1.5, NAN});
  }
  // Random programs (tests/flex/program_gen.h) exercise the compiler and both evaluators
  // under the sanitizers; FLASH == MATH for them is the flex fuzz test's job, which
  // excludes rows at float32 ties, so they are not compared here.
  bool random_program = false;
  if (in.ConsumeIntegralInRange(0, 5) == 0 && Hq <= 64 && L <= 4096 && S <= 4096) {
    flex_test::ProgramGen gen(in.ConsumeIntegral<uint64_t>(), {std::max<int64_t>(B, 1), Hq, L, S},
                              true);
    c.score_mod = gen.score_mod(in.ConsumeIntegralInRange(1, 5));
    if (in.ConsumeBool()) {
      try {
        c.block_mask = std::make_shared<flex::BlockMask>(flex::create_block_mask(
            gen.mask_mod(in.ConsumeIntegralInRange(1, 4)), std::max<int64_t>(B, 1), Hq, L, S,
            in.PickValueInArray<int64_t>({16, 64, 128})));
      } catch (const Error&) {
      }
    }
    random_program = true;
  } else if (in.ConsumeIntegralInRange(0, 3) == 0 && Hq <= 64) {
    std::vector<float> slopes(static_cast<size_t>(Hq));
    for (float& s : slopes) s = std::ldexp(1.0f, -static_cast<int>(rng() % 9));
    const Tensor slope_tensor = Tensor::from_blob(slopes.data(), {Hq}, {1}, DType::kFloat32)
                                    .clone();
    c.score_mod = flex::Program::from_score_mod(
        in.ConsumeBool() ? flex::mods::soft_cap(in.PickValueInArray({20.0, 1.0, 0.0, -3.0}))
                         : flex::mods::alibi(slope_tensor));
  }
  if (!c.block_mask && in.ConsumeIntegralInRange(0, 4) == 0 && L <= 4096 && S <= 4096) {
    try {
      const int64_t window = in.ConsumeIntegralInRange<int64_t>(-1, 200);
      c.block_mask = std::make_shared<flex::BlockMask>(flex::create_block_mask(
          in.ConsumeBool() ? flex::mods::causal() : flex::mods::sliding_window(window),
          in.ConsumeBool() ? B : 1, in.ConsumeBool() ? Hq : 1, L, S,
          in.PickValueInArray<int64_t>({16, 64, 128, 7})));
    } catch (const Error&) {
      c.block_mask.reset();
    }
  }

  // Outputs count as work too: the backward writes S key rows even when B * L = 0, and
  // the forward L rows even when S = 0.
  const double work = static_cast<double>(std::max<int64_t>(B, 1)) * static_cast<double>(Hq) *
                      static_cast<double>(std::max<int64_t>(L, 1)) *
                      static_cast<double>(std::max<int64_t>(S, 1)) *
                      static_cast<double>(E + Ev + 1);
  if (!(work <= kMaxWork)) {
    try {
      (void)explain(make_params(c.q, c.k, c.v, c.options));
    } catch (const Error&) {
    }
    return;
  }
  const std::optional<AttentionResult> flash = try_forward(c, SDPBackend::FLASH_ATTENTION);
  const std::optional<AttentionResult> math = try_forward(c, SDPBackend::MATH);
  const bool comparable = flash && math && !random_program && !(c.options.dropout_p > 0.0) &&
                          magnitude <= 3.0 &&
                          c.options.scale.value_or(1.0) <= 2.0 && dtype != DType::kFloat64;
  if (!comparable) return;
  expect_close("out", flash->out, math->out, dtype, magnitude, c);
  expect_close("lse", flash->lse, math->lse, DType::kFloat32,
               std::abs(c.options.scale.value_or(1.0)) * magnitude * magnitude * E, c);
  if (!in.ConsumeBool()) return;
  const Tensor grad_out = make_input(in, flash->out.sizes(), dtype, 1.0, rng);
  std::optional<AttentionGradients> g[2];
  const SDPBackend backends[2] = {SDPBackend::FLASH_ATTENTION, SDPBackend::MATH};
  const AttentionResult* results[2] = {&*flash, &*math};
  for (int i = 0; i < 2; ++i) {
    try {
      const sdpa_kernel only(backends[i]);
      g[i] = backward(c, grad_out, *results[i]);
    } catch (const Error&) {
    }
  }
  if (!g[0] || !g[1]) return;
  const double grad_scale = std::max(1.0, static_cast<double>(std::max(L, S)) * 0.05);
  // The D shift reaches grad_q_i through scale * sum_j P_ij k_j and grad_k_j through
  // scale * sum_i P_ij q_i (the score_mods compared have |derivative| <= 1).
  const DeltaShift shift = delta_shift(grad_out, math->out, dtype);
  const double scale =
      std::abs(c.options.scale.value_or(1.0 / std::sqrt(std::max<int64_t>(E, 1))));
  expect_close("grad_q", g[0]->grad_q, g[1]->grad_q, dtype, grad_scale, c,
               scale * shift.per_row * max_magnitude(c.k));
  expect_close("grad_k", g[0]->grad_k, g[1]->grad_k, dtype, grad_scale, c,
               scale * shift.total * max_magnitude(c.q));
  expect_close("grad_v", g[0]->grad_v, g[1]->grad_v, dtype, grad_scale, c);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  try {
    run(in);
  } catch (const sdpa::Error&) {
    // Refused input: the expected outcome for most random calls.
  } catch (const std::exception& e) {
    finding(std::string("an exception other than sdpa::Error escaped: ") + e.what());
  }
  return 0;
}
