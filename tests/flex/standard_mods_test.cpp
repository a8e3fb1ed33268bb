// Each standard mod (flex_mods.h) equals its AttnBias / materialized equivalent and a
// float64 reference computed here: output, logsumexp and grad_q/k/v (and the captured
// table's gradient for relative_position), on MATH (float64, tight) and FLASH (float32 on
// every attainable SIMD target, bfloat16/float16 on a subset), over odd sizes, L != S,
// GQA and BlockMask block sizes 16 / 64 / 128.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flex_test_util.h"
#include "sdpa/attn_bias.h"
#include "sdpa/flex_mods.h"

namespace flex_test {
namespace {

using sdpa::AttnMask;
using sdpa::SDPAOptions;
using sdpa::SDPBackend;
using sdpa::flex::BlockMask;
using sdpa::flex::MaskMod;
using sdpa::flex::Program;
namespace mods = sdpa::flex::mods;

struct CaseShape {
  int64_t B, Hq, Hkv, L, S, E, Ev, block;
};

// L, S in {1, 7, 63, 65, 257}, L != S where the mod allows, GQA (Hq != Hkv) in about half,
// E != Ev and E not a multiple of the vector width, every BlockMask block size.
const std::vector<CaseShape> kShapes = {
    {1, 2, 2, 1, 1, 16, 16, 16},     {2, 4, 2, 1, 65, 32, 24, 64},
    {1, 2, 1, 7, 7, 17, 17, 128},    {2, 2, 2, 7, 63, 32, 24, 16},
    {1, 4, 2, 63, 65, 32, 24, 64},   {2, 2, 2, 65, 63, 16, 16, 128},
    {1, 4, 2, 257, 257, 32, 24, 64}, {1, 2, 2, 65, 257, 32, 24, 16},
    {1, 2, 1, 257, 7, 16, 16, 128},  {2, 2, 1, 63, 63, 24, 8, 16},
    {1, 2, 2, 65, 65, 16, 16, 64},
};
// Shapes also run in bfloat16 (and the first in float16), at the default capability.
const std::vector<size_t> kLowPrecisionShapes = {1, 4, 7};
// Shapes for a mod's secondary parameter values (small, odd, L != S, GQA).
const std::vector<size_t> kReducedShapes = {0, 3, 5, 9};

std::string describe(const CaseShape& s) {
  std::ostringstream os;
  os << "B=" << s.B << " Hq=" << s.Hq << " Hkv=" << s.Hkv << " L=" << s.L << " S=" << s.S
     << " E=" << s.E << " Ev=" << s.Ev << " block=" << s.block;
  return os.str();
}

struct ModSpec {
  std::optional<Program> score_mod;
  std::optional<MaskMod> mask_mod;
  /// The AttnBias / dense equivalent for scaled_dot_product_attention in the call's dtype;
  /// null when the mod has none (soft_cap): the naive reference is then flex on MATH.
  std::function<AttnMask(DType)> equivalent;
  RefMods ref;
  /// relative_position: the reference's table gradient (filled through ref.on_dz) and the
  /// table's shape; null otherwise.
  std::shared_ptr<std::vector<double>> captured_grad;
  Shape captured_shape;
};

using SpecFactory = std::function<std::optional<ModSpec>(const CaseShape&)>;

// Lse (and the gradient of a float32 captured table) is stored as float32 even by MATH
// float64: allow that rounding (half an ulp is 2^-24 relative; 1.2e-7 is one ulp).
const Tolerance kLse64Tol{kFloat64Tol, 1.2e-7};

struct Naive {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0, dcap = 0;
};

void check_mod(const ModSpec& spec, const CaseShape& sh, DType dtype,
               const std::vector<std::string>& capabilities, uint64_t seed) {
  SCOPED_TRACE(describe(sh) + " dtype=" + std::string(sdpa::dtype_name(dtype)));
  const Tensor q = randn({sh.B, sh.Hq, sh.L, sh.E}, dtype, seed, 1.5);
  const Tensor k = randn({sh.B, sh.Hkv, sh.S, sh.E}, dtype, seed + 1, 1.5);
  const Tensor v = randn({sh.B, sh.Hkv, sh.S, sh.Ev}, dtype, seed + 2);
  const Tensor dout = randn({sh.B, sh.Hq, sh.L, sh.Ev}, dtype, seed + 3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(sh.E));
  SDPAOptions opts;
  opts.enable_gqa = sh.Hq != sh.Hkv;
  std::optional<BlockMask> bm;
  if (spec.mask_mod) bm = sdpa::flex::create_block_mask(*spec.mask_mod, sh.B, sh.Hq, sh.L, sh.S, sh.block);
  const BlockMask* bmp = bm ? &*bm : nullptr;

  if (spec.captured_grad) std::fill(spec.captured_grad->begin(), spec.captured_grad->end(), 0.0);
  const RefForward gold = reference_forward(q, k, v, scale, spec.ref);
  const RefGrads ggold = reference_backward(dout, q, k, v, scale, spec.ref);
  Tensor gold_cap;
  if (spec.captured_grad) {
    gold_cap = Tensor::empty(spec.captured_shape, DType::kFloat64);
    std::copy(spec.captured_grad->begin(), spec.captured_grad->end(), gold_cap.data<double>());
  }
  const Tensor q64 = to64(q), k64 = to64(k), v64 = to64(v), dout64 = to64(dout);

  Naive naive;
  {
    sdpa::sdpa_kernel guard(SDPBackend::MATH);
    // flex on MATH float64 equals the reference.
    const auto r = sdpa::flex_attention(q64, k64, v64, spec.score_mod, bmp, opts);
    EXPECT_EQ(r.backend, SDPBackend::MATH);
    EXPECT_TRUE(all_close(r.out, gold.out, float64_tolerance(), "MATH f64 flex out"));
    EXPECT_TRUE(all_close(r.lse, gold.lse, kLse64Tol, "MATH f64 flex lse"));
    const auto g = sdpa::flex_attention_backward(dout64, q64, k64, v64, r.out, r.lse,
                                                 spec.score_mod, bmp, opts);
    EXPECT_TRUE(all_close(g.grad_q, ggold.dq, float64_tolerance(), "MATH f64 flex grad_q"));
    EXPECT_TRUE(all_close(g.grad_k, ggold.dk, float64_tolerance(), "MATH f64 flex grad_k"));
    EXPECT_TRUE(all_close(g.grad_v, ggold.dv, float64_tolerance(), "MATH f64 flex grad_v"));
    if (spec.captured_grad) {
      EXPECT_EQ(g.grad_captured.size(), spec.score_mod->captured().size());
      EXPECT_TRUE(!g.grad_captured.empty() && g.grad_captured[0].defined());
      if (!g.grad_captured.empty() && g.grad_captured[0].defined()) {
        EXPECT_TRUE(all_close(g.grad_captured[0], gold_cap, kLse64Tol, "MATH f64 grad_captured"));
      }
    }
    // The AttnBias / dense equivalent on MATH float64 equals the same reference.
    if (spec.equivalent) {
      SDPAOptions bo = opts;
      bo.attn_mask = spec.equivalent(DType::kFloat64);
      const auto rb = sdpa::scaled_dot_product_attention_with_lse(q64, k64, v64, bo);
      EXPECT_TRUE(all_close(rb.out, gold.out, float64_tolerance(), "MATH f64 equivalent out"));
      EXPECT_TRUE(all_close(rb.lse, gold.lse, kLse64Tol, "MATH f64 equivalent lse"));
      const auto gb = sdpa::scaled_dot_product_attention_backward(dout64, q64, k64, v64, rb.out,
                                                                  rb.lse, bo);
      EXPECT_TRUE(all_close(gb.grad_q, ggold.dq, float64_tolerance(), "MATH f64 equivalent dq"));
      EXPECT_TRUE(all_close(gb.grad_k, ggold.dk, float64_tolerance(), "MATH f64 equivalent dk"));
      EXPECT_TRUE(all_close(gb.grad_v, ggold.dv, float64_tolerance(), "MATH f64 equivalent dv"));
    }
    // Naive reference in the tested dtype: the equivalent on MATH (flex when none), whose
    // error against the golden sets the tolerance scale.
    sdpa::AttentionResult rn;
    sdpa::AttentionGradients gn;
    if (spec.equivalent) {
      SDPAOptions bo = opts;
      bo.attn_mask = spec.equivalent(dtype);
      rn = sdpa::scaled_dot_product_attention_with_lse(q, k, v, bo);
      gn = sdpa::scaled_dot_product_attention_backward(dout, q, k, v, rn.out, rn.lse, bo);
    } else {
      rn = sdpa::flex_attention(q, k, v, spec.score_mod, bmp, opts);
      gn = sdpa::flex_attention_backward(dout, q, k, v, rn.out, rn.lse, spec.score_mod, bmp, opts);
    }
    naive.out = max_abs_diff(rn.out, gold.out);
    naive.lse = max_abs_diff(rn.lse, gold.lse);
    naive.dq = max_abs_diff(gn.grad_q, ggold.dq);
    naive.dk = max_abs_diff(gn.grad_k, ggold.dk);
    naive.dv = max_abs_diff(gn.grad_v, ggold.dv);
    if (spec.captured_grad) {
      const auto rf = sdpa::flex_attention(q, k, v, spec.score_mod, bmp, opts);
      const auto gf = sdpa::flex_attention_backward(dout, q, k, v, rf.out, rf.lse, spec.score_mod,
                                                    bmp, opts);
      naive.dcap = max_abs_diff(gf.grad_captured.at(0), gold_cap);
    }
  }

  for (const std::string& cap : capabilities) {
    SCOPED_TRACE("capability " + cap);
    ScopedCapability cg(cap);
    sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
    const auto r = sdpa::flex_attention(q, k, v, spec.score_mod, bmp, opts);
    EXPECT_EQ(r.backend, SDPBackend::FLASH_ATTENTION);
    EXPECT_TRUE(all_close(r.out, gold.out, tolerance(dtype, naive.out, kFudgeOut), "FLASH flex out"));
    EXPECT_TRUE(all_close(r.lse, gold.lse, tolerance(DType::kFloat32, naive.lse, kFudgeLse),
                          "FLASH flex lse"));
    const auto g = sdpa::flex_attention_backward(dout, q, k, v, r.out, r.lse, spec.score_mod, bmp, opts);
    EXPECT_EQ(g.backend, SDPBackend::FLASH_ATTENTION);
    EXPECT_TRUE(all_close(g.grad_q, ggold.dq, tolerance(dtype, naive.dq, kFudgeGradQ), "FLASH flex grad_q"));
    EXPECT_TRUE(all_close(g.grad_k, ggold.dk, tolerance(dtype, naive.dk, kFudgeGradK), "FLASH flex grad_k"));
    EXPECT_TRUE(all_close(g.grad_v, ggold.dv, tolerance(dtype, naive.dv, kFudgeGradV), "FLASH flex grad_v"));
    if (spec.captured_grad) {
      ASSERT_FALSE(g.grad_captured.empty());
      ASSERT_TRUE(g.grad_captured[0].defined());
      // FLASH's backward takes D = rowsum(dO o out) from the `out` it is given (sdpa.h), which
      // in bfloat16/float16 is rounded; the golden is the documented algorithm evaluated
      // exactly on those inputs. The table gradient sums many dS terms that nearly cancel,
      // so against the exact gradient the half-precision `out` alone would dominate.
      std::fill(spec.captured_grad->begin(), spec.captured_grad->end(), 0.0);
      reference_backward(dout, q, k, v, scale, spec.ref, &r.out);
      Tensor gold_cap_given_out = Tensor::empty(spec.captured_shape, DType::kFloat64);
      std::copy(spec.captured_grad->begin(), spec.captured_grad->end(),
                gold_cap_given_out.data<double>());
      EXPECT_TRUE(all_close(g.grad_captured[0], gold_cap_given_out,
                            tolerance(dtype, naive.dcap, kFudgeGradCaptured),
                            "FLASH grad_captured"));
    }
    if (spec.equivalent) {
      // The equivalent on FLASH agrees with the same golden (flex == AttnBias on FLASH).
      SDPAOptions bo = opts;
      bo.attn_mask = spec.equivalent(dtype);
      const auto rb = sdpa::scaled_dot_product_attention_with_lse(q, k, v, bo);
      EXPECT_TRUE(all_close(rb.out, gold.out, tolerance(dtype, naive.out, kFudgeOut),
                            "FLASH equivalent out"));
      EXPECT_TRUE(all_close(rb.lse, gold.lse, tolerance(DType::kFloat32, naive.lse, kFudgeLse),
                            "FLASH equivalent lse"));
    }
  }
}

// Runs `factory`'s mod over every shape (float32 on every attainable SIMD target, plus the
// low-precision shapes), or with `reduced` over kReducedShapes in float32 only (for a mod's
// secondary parameter values, keeping the executable's runtime down).
void run_all(const SpecFactory& factory, uint64_t seed, bool reduced = false) {
  const std::vector<std::string> caps = supported_capabilities();
  const std::string default_cap = sdpa::backends::cpu::get_cpu_capability();
  int ran = 0;
  for (size_t s = 0; s < kShapes.size(); ++s) {
    if (reduced && std::find(kReducedShapes.begin(), kReducedShapes.end(), s) == kReducedShapes.end()) continue;
    const std::optional<ModSpec> spec = factory(kShapes[s]);
    if (!spec) continue;
    ++ran;
    check_mod(*spec, kShapes[s], DType::kFloat32, caps, seed + 100 * s);
    if (reduced) continue;
    const auto low = std::find(kLowPrecisionShapes.begin(), kLowPrecisionShapes.end(), s);
    if (low != kLowPrecisionShapes.end()) {
      check_mod(*spec, kShapes[s], DType::kBFloat16, {default_cap}, seed + 100 * s + 50);
      if (low == kLowPrecisionShapes.begin()) {
        check_mod(*spec, kShapes[s], DType::kFloat16, {default_cap}, seed + 100 * s + 70);
      }
    }
  }
  EXPECT_GE(ran, reduced ? 2 : 4) << "too few shapes apply to this mod";
}

bool causal_keep(int64_t, int64_t, int64_t i, int64_t j) { return j <= i; }

TEST(FlexStandardMods, CausalEqualsCausalUpperLeft) {
  run_all(
      [](const CaseShape& sh) -> std::optional<ModSpec> {
        ModSpec m;
        m.mask_mod = mods::causal();
        m.equivalent = [sh](DType) { return AttnMask(sdpa::causal_upper_left(sh.L, sh.S)); };
        m.ref.keep = causal_keep;
        return m;
      },
      1000);
}

TEST(FlexStandardMods, SlidingWindowEqualsLocalAttentionTopLeft) {
  for (int64_t window : {0, 5, 40}) {
    SCOPED_TRACE("window " + std::to_string(window));
    run_all(
        [window](const CaseShape&) -> std::optional<ModSpec> {
          ModSpec m;
          m.mask_mod = mods::sliding_window(window);
          m.equivalent = [window](DType) {
            return AttnMask(std::make_shared<sdpa::LocalAttentionBias>(
                window, 0, sdpa::DiagonalAlignment::kTopLeft));
          };
          m.ref.keep = [window](int64_t, int64_t, int64_t i, int64_t j) {
            return j <= i && i - j <= window;
          };
          return m;
        },
        2000 + static_cast<uint64_t>(window), /*reduced=*/window != 5);
  }
}

// Document lengths cycling through 1, 5, 17, 40, ... until L (the last one truncated).
std::vector<int64_t> document_lengths(int64_t L) {
  const int64_t pattern[] = {1, 5, 17, 40, 3, 64};
  std::vector<int64_t> lengths;
  int64_t used = 0;
  for (size_t i = 0; used < L; ++i) {
    const int64_t n = std::min(pattern[i % 6], L - used);
    lengths.push_back(n);
    used += n;
  }
  return lengths;
}

TEST(FlexStandardMods, DocumentEqualsBlockDiagonal) {
  for (DType id_dtype : {DType::kInt64, DType::kInt32}) {
    run_all(
        [id_dtype](const CaseShape& sh) -> std::optional<ModSpec> {
          if (sh.L != sh.S) return std::nullopt;  // document ids index both q and kv
          const std::vector<int64_t> lengths = document_lengths(sh.L);
          auto ids = std::make_shared<std::vector<int64_t>>();
          for (size_t d = 0; d < lengths.size(); ++d) ids->insert(ids->end(), lengths[d], static_cast<int64_t>(d));
          ModSpec m;
          m.mask_mod = mods::document(int_tensor(*ids).to(id_dtype));
          m.equivalent = [lengths](DType) {
            return AttnMask(sdpa::BlockDiagonalBias::from_seqlens(lengths));
          };
          m.ref.keep = [ids](int64_t, int64_t, int64_t i, int64_t j) { return (*ids)[i] == (*ids)[j]; };
          return m;
        },
        3000, /*reduced=*/id_dtype != DType::kInt64);
  }
}

TEST(FlexStandardMods, PrefixLmEqualsMaterializedBoolMask) {
  for (int64_t prefix : {0, 10, 100}) {
    SCOPED_TRACE("prefix " + std::to_string(prefix));
    run_all(
        [prefix](const CaseShape& sh) -> std::optional<ModSpec> {
          ModSpec m;
          m.mask_mod = mods::prefix_lm(prefix);
          m.equivalent = [sh, prefix](DType) {
            Tensor mask = Tensor::empty({sh.L, sh.S}, DType::kBool);
            for (int64_t i = 0; i < sh.L; ++i) {
              for (int64_t j = 0; j < sh.S; ++j) mask.data<bool>()[i * sh.S + j] = j < prefix || j <= i;
            }
            return AttnMask(mask);
          };
          m.ref.keep = [prefix](int64_t, int64_t, int64_t i, int64_t j) { return j < prefix || j <= i; };
          return m;
        },
        4000 + static_cast<uint64_t>(prefix), /*reduced=*/prefix != 10);
  }
}

Tensor slopes_tensor(int64_t heads, std::vector<float>* out = nullptr) {
  const std::vector<float> s = sdpa::alibi_slopes(heads);
  if (out) *out = s;
  return float_tensor(s);
}

TEST(FlexStandardMods, AlibiEqualsAlibiBiasTopLeft) {
  run_all(
      [](const CaseShape& sh) -> std::optional<ModSpec> {
        std::vector<float> slopes;
        const Tensor t = slopes_tensor(sh.Hq, &slopes);
        ModSpec m;
        m.score_mod = Program::from_score_mod(mods::alibi(t));
        m.equivalent = [slopes](DType) {
          return AttnMask(std::make_shared<sdpa::AlibiBias>(slopes, sdpa::DiagonalAlignment::kTopLeft));
        };
        m.ref.score = [slopes](double s, int64_t, int64_t h, int64_t i, int64_t j) {
          return s - static_cast<double>(slopes[h]) * static_cast<double>(std::abs(i - j));
        };
        return m;
      },
      5000);
}

TEST(FlexStandardMods, AlibiWithCausalBlockMaskEqualsComposedBias) {
  run_all(
      [](const CaseShape& sh) -> std::optional<ModSpec> {
        std::vector<float> slopes;
        const Tensor t = slopes_tensor(sh.Hq, &slopes);
        ModSpec m;
        m.score_mod = Program::from_score_mod(mods::alibi(t));
        m.mask_mod = mods::causal();
        m.equivalent = [slopes, sh](DType) {
          return AttnMask(sdpa::compose(
              {sdpa::causal_upper_left(sh.L, sh.S),
               std::make_shared<sdpa::AlibiBias>(slopes, sdpa::DiagonalAlignment::kTopLeft)}));
        };
        m.ref.score = [slopes](double s, int64_t, int64_t h, int64_t i, int64_t j) {
          return s - static_cast<double>(slopes[h]) * static_cast<double>(std::abs(i - j));
        };
        m.ref.keep = causal_keep;
        return m;
      },
      5500);
}

ModSpec relative_position_spec(const CaseShape& sh, uint64_t seed) {
  const int64_t max_distance = std::max(sh.L, sh.S);
  const int64_t width = 2 * max_distance + 1;
  const Tensor table = randn({sh.Hq, width}, DType::kFloat32, seed, 0.7);
  const std::vector<double> tv = values(table);
  ModSpec m;
  m.score_mod = Program::from_score_mod(mods::relative_position(table, max_distance, true));
  m.equivalent = [sh, tv, width, max_distance](DType dt) {
    Tensor bias = Tensor::empty({1, sh.Hq, sh.L, sh.S}, DType::kFloat64);
    for (int64_t h = 0; h < sh.Hq; ++h) {
      for (int64_t i = 0; i < sh.L; ++i) {
        for (int64_t j = 0; j < sh.S; ++j) {
          bias.data<double>()[(h * sh.L + i) * sh.S + j] = tv[h * width + i - j + max_distance];
        }
      }
    }
    return AttnMask(bias.to(dt));
  };
  m.ref.score = [tv, width, max_distance](double s, int64_t, int64_t h, int64_t i, int64_t j) {
    return s + tv[h * width + i - j + max_distance];
  };
  m.captured_grad = std::make_shared<std::vector<double>>(tv.size());
  m.captured_shape = {sh.Hq, width};
  auto acc = m.captured_grad;
  m.ref.on_dz = [acc, width, max_distance](int64_t, int64_t h, int64_t i, int64_t j, double,
                                            double dz) {
    (*acc)[h * width + i - j + max_distance] += dz;
  };
  return m;
}

TEST(FlexStandardMods, RelativePositionEqualsAdditiveTensor) {
  run_all([](const CaseShape& sh) -> std::optional<ModSpec> { return relative_position_spec(sh, 6000); },
          6100);
}

TEST(FlexStandardMods, RelativePositionWithPrefixLmBlockMask) {
  run_all(
      [](const CaseShape& sh) -> std::optional<ModSpec> {
        ModSpec m = relative_position_spec(sh, 6500);
        const int64_t prefix = 9;
        m.mask_mod = mods::prefix_lm(prefix);
        auto inner = m.equivalent;
        m.ref.keep = [prefix](int64_t, int64_t, int64_t i, int64_t j) { return j < prefix || j <= i; };
        // The equivalent: the relative bias tensor with -inf outside the prefix-LM mask.
        m.equivalent = [inner, sh, prefix](DType dt) {
          Tensor bias = inner(DType::kFloat64).tensor().contiguous();
          for (int64_t h = 0; h < sh.Hq; ++h) {
            for (int64_t i = 0; i < sh.L; ++i) {
              for (int64_t j = 0; j < sh.S; ++j) {
                if (!(j < prefix || j <= i)) {
                  bias.data<double>()[(h * sh.L + i) * sh.S + j] = -std::numeric_limits<double>::infinity();
                }
              }
            }
          }
          return AttnMask(bias.to(dt));
        };
        return m;
      },
      6600);
}

TEST(FlexStandardMods, SoftCapEqualsReference) {
  for (double cap : {2.5, 1.0, 30.0}) {
    SCOPED_TRACE("cap " + std::to_string(cap));
    run_all(
        [cap](const CaseShape&) -> std::optional<ModSpec> {
          ModSpec m;
          m.score_mod = Program::from_score_mod(mods::soft_cap(cap));
          m.ref.score = [cap](double s, int64_t, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); };
          m.ref.dscore = [cap](double s, int64_t, int64_t, int64_t, int64_t) {
            const double t = std::tanh(s / cap);
            return 1.0 - t * t;
          };
          return m;
        },
        7000 + static_cast<uint64_t>(cap * 10), /*reduced=*/cap != 2.5);
  }
}

TEST(FlexStandardMods, SoftCapWithSlidingWindowBlockMask) {
  run_all(
      [](const CaseShape&) -> std::optional<ModSpec> {
        const double cap = 1.5;
        ModSpec m;
        m.score_mod = Program::from_score_mod(mods::soft_cap(cap));
        m.mask_mod = mods::sliding_window(20);
        m.ref.score = [cap](double s, int64_t, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); };
        m.ref.dscore = [cap](double s, int64_t, int64_t, int64_t, int64_t) {
          const double t = std::tanh(s / cap);
          return 1.0 - t * t;
        };
        m.ref.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i && i - j <= 20; };
        return m;
      },
      7500);
}

// Documents whose ids repeat non-contiguously (no BlockDiagonalBias equivalent): against
// the reference only, with a causal mask combined by and_masks.
TEST(FlexStandardMods, InterleavedDocumentsAndCausal) {
  run_all(
      [](const CaseShape& sh) -> std::optional<ModSpec> {
        if (sh.L != sh.S) return std::nullopt;
        auto ids = std::make_shared<std::vector<int64_t>>();
        for (int64_t i = 0; i < sh.L; ++i) ids->push_back((i / 3 + i % 2) % 4);
        ModSpec m;
        m.mask_mod = sdpa::flex::and_masks({mods::document(int_tensor(*ids)), mods::causal()});
        m.ref.keep = [ids](int64_t, int64_t, int64_t i, int64_t j) {
          return (*ids)[i] == (*ids)[j] && j <= i;
        };
        return m;
      },
      8000);
}

}  // namespace
}  // namespace flex_test
