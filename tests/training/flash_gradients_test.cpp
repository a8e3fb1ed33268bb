// FLASH forward + backward vs the float64 MATH golden over the size sweep (L, S in
// {1, 7, 63, 65, 257, 1000}, E in {8, 24, 64, 80, 128}, Ev != E), GQA, masks, causal with
// L != S, non-contiguous and misaligned inputs, 3-D inputs, float32/bfloat16/float16/float64
// and every SIMD capability this CPU supports. Tolerances: attention_test_util.h (golden =
// MATH float64 on the rounded inputs, tolerance from the dtype default and MATH's own
// error in the tested dtype).
//
// The (L, S) pairs are a curated subset of the 36 combinations, chosen to cover: 1 on
// either side, both sides of the 64-wide tiles (63, 65), L < S and L > S, and 1000 (many
// tiles, a partial last tile) against each other size at least once, within the ~60 s
// budget of one test executable.

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;

enum class MaskKind {
  kNone,
  kBool,           // random keep mask [B, 1, L, S]
  kBoolEmptyRows,  // random keep mask [B, Hq, L, S] with every 5th row fully masked
  kFloat,          // additive [1, Hq, L, S] of the query dtype
};

struct SweepCase {
  std::string name;
  int64_t batch = 1, heads_q = 2, heads_kv = 2, q_len = 1, kv_len = 1, dim_qk = 8, dim_vo = 8;
  bool causal = false;
  MaskKind mask = MaskKind::kNone;
  Layout layout = Layout::kBHSD;
  bool unbatched = false;
  DType dtype = DType::kFloat32;
  std::string capability;  // "" = the detected one
};

std::ostream& operator<<(std::ostream& os, const SweepCase& c) { return os << c.name; }

// Builder: name and sizes, then modifiers.
struct C {
  SweepCase c;
  C(int64_t L, int64_t S, int64_t E, int64_t Ev) {
    c.q_len = L;
    c.kv_len = S;
    c.dim_qk = E;
    c.dim_vo = Ev;
  }
  C& heads(int64_t b, int64_t hq, int64_t hkv) {
    c.batch = b;
    c.heads_q = hq;
    c.heads_kv = hkv;
    return *this;
  }
  C& causal() {
    c.causal = true;
    return *this;
  }
  C& mask(MaskKind m) {
    c.mask = m;
    return *this;
  }
  C& layout(Layout l) {
    c.layout = l;
    return *this;
  }
  C& unbatched() {
    c.unbatched = true;
    c.batch = 1;
    return *this;
  }
  C& dtype(DType d) {
    c.dtype = d;
    return *this;
  }
  C& capability(std::string cap) {
    c.capability = std::move(cap);
    return *this;
  }
  SweepCase named(std::string prefix) const {
    SweepCase r = c;
    std::string n = prefix + "_L" + std::to_string(c.q_len) + "_S" + std::to_string(c.kv_len) +
                    "_E" + std::to_string(c.dim_qk);
    if (c.dim_vo != c.dim_qk) n += "_Ev" + std::to_string(c.dim_vo);
    if (c.heads_q != c.heads_kv) {
      n += "_Gqa" + std::to_string(c.heads_q) + "x" + std::to_string(c.heads_kv);
    }
    if (c.causal) n += "_Causal";
    switch (c.mask) {
      case MaskKind::kNone:
        break;
      case MaskKind::kBool:
        n += "_BoolMask";
        break;
      case MaskKind::kBoolEmptyRows:
        n += "_BoolMaskEmptyRows";
        break;
      case MaskKind::kFloat:
        n += "_FloatMask";
        break;
    }
    if (c.layout == Layout::kBSHD) n += "_BSHD";
    if (c.layout == Layout::kOffset) n += "_Misaligned";
    if (c.unbatched) n += "_Unbatched";
    if (c.dtype != DType::kFloat32) n.append("_").append(sdpa::dtype_name(c.dtype));
    if (!c.capability.empty()) n.append("_").append(c.capability);
    r.name = n;
    return r;
  }
};

// Inputs of one case: q, k, v, grad_out in the case's dtype and layout, plus the mask.
struct Inputs {
  Tensor q, k, v, grad_out, mask;
};

Inputs make_inputs(const SweepCase& c) {
  const uint64_t seed = std::hash<std::string>{}(c.name) & 0xffffff;
  Inputs in;
  auto make = [&](Shape shape, uint64_t s) {
    Tensor t = randn_layout(shape, c.dtype, seed * 8 + s, c.layout);
    return c.unbatched ? t.squeeze(0) : t;
  };
  in.q = make({c.batch, c.heads_q, c.q_len, c.dim_qk}, 1);
  in.k = make({c.batch, c.heads_kv, c.kv_len, c.dim_qk}, 2);
  in.v = make({c.batch, c.heads_kv, c.kv_len, c.dim_vo}, 3);
  in.grad_out = make({c.batch, c.heads_q, c.q_len, c.dim_vo}, 4);
  Shape lead = c.unbatched ? Shape{} : Shape{c.batch};
  auto with_lead = [&](Shape rest) {
    Shape s = lead;
    for (int64_t d : rest) s.push_back(d);
    return s;
  };
  switch (c.mask) {
    case MaskKind::kNone:
      break;
    case MaskKind::kBool:
      in.mask = random_bool(with_lead({1, c.q_len, c.kv_len}), 0.7, seed * 8 + 5);
      break;
    case MaskKind::kBoolEmptyRows: {
      in.mask = random_bool(with_lead({c.heads_q, c.q_len, c.kv_len}), 0.5, seed * 8 + 5);
      for_each_index(in.mask.sizes(), [&](const Shape& i) {
        if (i[i.size() - 2] % 5 == 0) in.mask.set_item(i, 0.0);
      });
      break;
    }
    case MaskKind::kFloat:
      in.mask = randn({1, c.heads_q, c.q_len, c.kv_len}, c.dtype, seed * 8 + 6);
      if (c.unbatched) in.mask = in.mask.squeeze(0);
      break;
  }
  return in;
}

SDPAOptions options_for(const SweepCase& c, const Tensor& mask) {
  SDPAOptions o;
  o.is_causal = c.causal;
  o.enable_gqa = c.heads_q != c.heads_kv;
  if (mask.defined()) o.attn_mask = mask;
  return o;
}

class FlashGradients : public ::testing::TestWithParam<SweepCase> {};

TEST_P(FlashGradients, MatchFloat64Math) {
  const SweepCase& c = GetParam();
  const Inputs in = make_inputs(c);
  const Tensor mask64 =
      in.mask.defined() && in.mask.dtype() != DType::kBool ? f64(in.mask) : in.mask;
  const FwdBwd golden = run_fwd_bwd(SDPBackend::MATH, f64(in.q), f64(in.k), f64(in.v),
                                    f64(in.grad_out), options_for(c, mask64));
  const FwdBwd naive =
      run_fwd_bwd(SDPBackend::MATH, in.q, in.k, in.v, in.grad_out, options_for(c, in.mask));
  FwdBwd flash;
  {
    std::optional<ScopedCapability> cap;
    if (!c.capability.empty()) cap.emplace(c.capability);
    flash = run_fwd_bwd(SDPBackend::FLASH_ATTENTION, in.q, in.k, in.v, in.grad_out,
                        options_for(c, in.mask));
  }
  EXPECT_EQ(flash.fwd.backend, SDPBackend::FLASH_ATTENTION);
  EXPECT_EQ(flash.grads.backend, SDPBackend::FLASH_ATTENTION);
  EXPECT_EQ(flash.fwd.out.sizes(), golden.fwd.out.sizes());
  EXPECT_EQ(flash.grads.grad_q.sizes(), in.q.sizes());
  EXPECT_EQ(flash.grads.grad_k.sizes(), in.k.sizes());
  EXPECT_EQ(flash.grads.grad_v.sizes(), in.v.sizes());
  expect_matches_golden(flash, golden, naive, c.dtype);
  if (c.dtype == DType::kFloat64) {
    // Computed in float64: a float32 accumulation would sit near 1e-7, inside the
    // default tolerance above.
    for (const auto& [what, tested, want] :
         {std::tuple{"out", flash.fwd.out, golden.fwd.out},
          std::tuple{"grad_q", flash.grads.grad_q, golden.grads.grad_q},
          std::tuple{"grad_k", flash.grads.grad_k, golden.grads.grad_k},
          std::tuple{"grad_v", flash.grads.grad_v, golden.grads.grad_v}}) {
      EXPECT_LE(scaled_error(tested, want), 1e-12) << what;
    }
  }
  EXPECT_FALSE(has_nan(flash.grads.grad_q) || has_nan(flash.grads.grad_k) ||
               has_nan(flash.grads.grad_v) || has_nan(flash.fwd.out));

  if (c.mask == MaskKind::kBoolEmptyRows) {
    // Fully masked rows: exactly zero output and grad_q, lse = -inf.
    const Tensor out = c.unbatched ? flash.fwd.out.unsqueeze(0) : flash.fwd.out;
    const Tensor dq = c.unbatched ? flash.grads.grad_q.unsqueeze(0) : flash.grads.grad_q;
    const Tensor lse = c.unbatched ? flash.fwd.lse.unsqueeze(0) : flash.fwd.lse;
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t h = 0; h < c.heads_q; ++h) {
        for (int64_t i = 0; i < c.q_len; i += 5) {
          EXPECT_TRUE(all_zero(out.select(0, b).select(0, h).select(0, i)));
          EXPECT_TRUE(all_zero(dq.select(0, b).select(0, h).select(0, i)));
          EXPECT_EQ(lse.item({b, h, i}), -std::numeric_limits<double>::infinity());
        }
      }
    }
  }
}

std::vector<SweepCase> sweep_cases() {
  using D = DType;
  using M = MaskKind;
  std::vector<SweepCase> v = {
      // float32, detected capability: the (L, S) x E sweep.
      C(1, 1, 8, 8).heads(2, 2, 2).named("F32"),
      C(1, 1000, 80, 24).named("F32"),
      C(1000, 1, 24, 24).named("F32"),
      C(7, 7, 8, 24).mask(M::kFloat).named("F32"),
      C(7, 63, 24, 24).causal().named("F32"),
      C(63, 7, 64, 64).causal().named("F32"),
      C(63, 65, 128, 128).heads(1, 8, 2).named("F32"),
      C(65, 63, 80, 8).mask(M::kBool).named("F32"),
      C(257, 257, 64, 64).heads(1, 6, 3).causal().named("F32"),
      C(257, 65, 128, 64).mask(M::kFloat).named("F32"),
      C(65, 1000, 64, 64).causal().named("F32"),
      C(1000, 257, 24, 80).heads(1, 6, 3).mask(M::kBool).named("F32"),
      C(1000, 1000, 64, 64).heads(1, 1, 1).causal().named("F32"),
      C(7, 1000, 8, 8).mask(M::kFloat).named("F32"),
      C(257, 7, 80, 80).heads(2, 8, 2).causal().named("F32"),
      // Fully masked rows among live ones.
      C(63, 65, 64, 64).mask(M::kBoolEmptyRows).named("F32"),
      C(257, 63, 24, 8).heads(1, 8, 2).mask(M::kBoolEmptyRows).named("F32"),
      // Layouts: BSHD through transpose (non-contiguous), misaligned base, 3-D inputs.
      C(63, 65, 64, 64).heads(2, 8, 2).layout(Layout::kBSHD).named("F32"),
      C(257, 63, 80, 24).layout(Layout::kBSHD).mask(M::kFloat).named("F32"),
      C(257, 63, 80, 24).heads(1, 4, 2).causal().layout(Layout::kBSHD).named("F32"),
      C(65, 257, 24, 24).layout(Layout::kOffset).named("F32"),
      C(63, 257, 80, 24).heads(1, 4, 2).unbatched().causal().named("F32"),
      C(65, 7, 8, 8).unbatched().mask(M::kFloat).named("F32"),
      // 16-bit types.
      C(257, 257, 64, 64).causal().dtype(D::kBFloat16).named("Half"),
      C(63, 1000, 128, 128).heads(1, 8, 2).dtype(D::kBFloat16).named("Half"),
      C(7, 65, 24, 80).mask(M::kBoolEmptyRows).dtype(D::kBFloat16).named("Half"),
      // Odd head dims and odd row/key tails: padded pairs of the vdpbf16ps backward.
      C(129, 67, 33, 17).heads(2, 6, 3).dtype(D::kBFloat16).named("Half"),
      C(1, 257, 7, 9).causal().layout(Layout::kOffset).dtype(D::kBFloat16).named("Half"),
      C(257, 65, 80, 24).mask(M::kBool).dtype(D::kFloat16).named("Half"),
      C(1000, 63, 64, 64).causal().dtype(D::kFloat16).named("Half"),
      C(65, 63, 8, 8).heads(1, 6, 3).mask(M::kFloat).dtype(D::kFloat16).named("Half"),
      // float64: FlashAttention-2 computed in float64 (as torch's CPU flash for double).
      C(1, 1, 8, 8).dtype(D::kFloat64).named("F64"),
      C(7, 1000, 5, 33).heads(2, 4, 2).dtype(D::kFloat64).named("F64"),
      C(1000, 63, 24, 8).causal().dtype(D::kFloat64).named("F64"),
      C(65, 257, 33, 33).heads(1, 6, 3).mask(M::kFloat).dtype(D::kFloat64).named("F64"),
      C(257, 65, 64, 24).mask(M::kBoolEmptyRows).dtype(D::kFloat64).named("F64"),
      C(63, 130, 80, 24).heads(1, 4, 2).causal().layout(Layout::kBSHD).dtype(D::kFloat64)
          .named("F64"),
      C(65, 7, 8, 8).unbatched().mask(M::kBool).layout(Layout::kOffset).dtype(D::kFloat64)
          .named("F64"),
  };
  // Every capability this CPU supports, forced.
  for (const std::string& cap : supported_capabilities()) {
    v.push_back(C(7, 63, 24, 24).capability(cap).named("Cap"));
    v.push_back(C(65, 257, 80, 24).heads(1, 6, 3).causal().capability(cap).named("Cap"));
    v.push_back(C(257, 63, 128, 128).mask(M::kFloat).capability(cap).named("Cap"));
    v.push_back(C(63, 65, 64, 64).mask(M::kBoolEmptyRows).capability(cap).named("Cap"));
    v.push_back(
        C(65, 130, 8, 8).layout(Layout::kBSHD).dtype(D::kBFloat16).capability(cap).named("Cap"));
    v.push_back(
        C(130, 65, 64, 24).heads(1, 4, 2).causal().dtype(D::kFloat16).capability(cap).named("Cap"));
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Sweep, FlashGradients, ::testing::ValuesIn(sweep_cases()),
                         [](const ::testing::TestParamInfo<SweepCase>& info) {
                           return info.param.name;
                         });

// ---- Degenerate shapes: S = 0, L = 0, every key masked. ------------------------------

class DegenerateShapes : public ::testing::TestWithParam<SDPBackend> {};

TEST_P(DegenerateShapes, NoKeysGiveZerosAndNoNaN) {
  const SDPBackend backend = GetParam();
  const Tensor q = randn({2, 3, 5, 8}, DType::kFloat32, 1);
  const Tensor k = randn({2, 3, 0, 8}, DType::kFloat32, 2);
  const Tensor v = randn({2, 3, 0, 6}, DType::kFloat32, 3);
  const Tensor go = randn({2, 3, 5, 6}, DType::kFloat32, 4);
  const FwdBwd r = run_fwd_bwd(backend, q, k, v, go, {});
  EXPECT_EQ(r.fwd.backend, backend);
  EXPECT_EQ(r.fwd.out.sizes(), (Shape{2, 3, 5, 6}));
  EXPECT_TRUE(all_zero(r.fwd.out));
  for (double x : values(r.fwd.lse)) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(r.grads.grad_q.sizes(), q.sizes());
  EXPECT_TRUE(all_zero(r.grads.grad_q));
  EXPECT_EQ(r.grads.grad_k.sizes(), k.sizes());
  EXPECT_EQ(r.grads.grad_v.sizes(), v.sizes());
}

TEST_P(DegenerateShapes, NoQueriesGiveEmptyOutputAndZeroKvGradients) {
  const SDPBackend backend = GetParam();
  const Tensor q = randn({2, 4, 0, 8}, DType::kFloat32, 1);
  const Tensor k = randn({2, 2, 70, 8}, DType::kFloat32, 2);
  const Tensor v = randn({2, 2, 70, 6}, DType::kFloat32, 3);
  const Tensor go = randn({2, 4, 0, 6}, DType::kFloat32, 4);
  SDPAOptions o;
  o.enable_gqa = true;
  const FwdBwd r = run_fwd_bwd(backend, q, k, v, go, o);
  EXPECT_EQ(r.fwd.out.sizes(), (Shape{2, 4, 0, 6}));
  EXPECT_EQ(r.fwd.lse.sizes(), (Shape{2, 4, 0}));
  EXPECT_EQ(r.grads.grad_q.sizes(), q.sizes());
  ASSERT_EQ(r.grads.grad_k.sizes(), k.sizes());
  ASSERT_EQ(r.grads.grad_v.sizes(), v.sizes());
  // No query depends on any key: the kv gradients are exactly zero (not uninitialized).
  EXPECT_TRUE(all_zero(r.grads.grad_k));
  EXPECT_TRUE(all_zero(r.grads.grad_v));
}

TEST_P(DegenerateShapes, AllKeysMaskedGiveZeroGradients) {
  const SDPBackend backend = GetParam();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor q = randn({1, 4, 70, 24}, dtype, 1);
    const Tensor k = randn({1, 2, 90, 24}, dtype, 2);
    const Tensor v = randn({1, 2, 90, 16}, dtype, 3);
    const Tensor go = randn({1, 4, 70, 16}, dtype, 4);
    SDPAOptions o;
    o.enable_gqa = true;
    o.attn_mask = Tensor::zeros({70, 90}, DType::kBool);
    const FwdBwd r = run_fwd_bwd(backend, q, k, v, go, o);
    EXPECT_EQ(r.grads.backend, backend);
    EXPECT_TRUE(all_zero(r.fwd.out)) << sdpa::dtype_name(dtype);
    for (double x : values(r.fwd.lse)) EXPECT_EQ(x, -std::numeric_limits<double>::infinity());
    EXPECT_TRUE(all_zero(r.grads.grad_q)) << sdpa::dtype_name(dtype);
    EXPECT_TRUE(all_zero(r.grads.grad_k)) << sdpa::dtype_name(dtype);
    EXPECT_TRUE(all_zero(r.grads.grad_v)) << sdpa::dtype_name(dtype);
  }
}

TEST_P(DegenerateShapes, FloatMaskOfMinusInfinityGivesZeroGradients) {
  const SDPBackend backend = GetParam();
  const Tensor q = randn({1, 2, 65, 8}, DType::kFloat32, 1);
  const Tensor k = randn({1, 2, 66, 8}, DType::kFloat32, 2);
  const Tensor v = randn({1, 2, 66, 8}, DType::kFloat32, 3);
  const Tensor go = randn({1, 2, 65, 8}, DType::kFloat32, 4);
  // Rows 0..64 of the first head are fully -inf; the second head is unmasked.
  Tensor mask = Tensor::zeros({1, 2, 65, 66}, DType::kFloat32);
  for_each_index({1, 1, 65, 66}, [&](const Shape& i) {
    mask.set_item(i, -std::numeric_limits<double>::infinity());
  });
  SDPAOptions o;
  o.attn_mask = mask;
  const FwdBwd r = run_fwd_bwd(backend, q, k, v, go, o);
  EXPECT_TRUE(all_zero(r.fwd.out.select(1, 0)));
  EXPECT_TRUE(all_zero(r.grads.grad_q.select(1, 0)));
  EXPECT_TRUE(all_zero(r.grads.grad_k.select(1, 0)));
  EXPECT_TRUE(all_zero(r.grads.grad_v.select(1, 0)));
  EXPECT_FALSE(all_zero(r.grads.grad_q.select(1, 1)));
  EXPECT_FALSE(has_nan(r.grads.grad_q) || has_nan(r.grads.grad_k) || has_nan(r.grads.grad_v));
}

// Saturated softmax at huge scales (|scale * q.k| up to ~1e8): the float32 lse is a few
// units off the backward's recomputed scores, which once made P = exp(s - lse) exceed 1
// and grad_v reach thousands where the float64 golden is ~4. grad_v must stay within
// the lse's rounding and bounded by P <= 1; grad_q and grad_k carry the forward's rounding times the scale
// (delta = rowsum(dO o O) is float32), so they are bounded by scale * eps * |k| |v| |dO|.
TEST_P(DegenerateShapes, HugeScoresKeepGradientsBounded) {
  const SDPBackend backend = GetParam();
  const Tensor q = randn({1, 2, 33, 16}, DType::kFloat32, 11);
  const Tensor k = randn({1, 2, 47, 16}, DType::kFloat32, 12);
  const Tensor v = randn({1, 2, 47, 16}, DType::kFloat32, 13);
  const Tensor go = randn({1, 2, 33, 16}, DType::kFloat32, 14);
  for (const double scale : {1e4, 1e6, 1e7}) {
    SDPAOptions o;
    o.scale = scale;
    const FwdBwd r = run_fwd_bwd(backend, q, k, v, go, o);
    const FwdBwd golden = run_fwd_bwd(SDPBackend::MATH, f64(q), f64(k), f64(v), f64(go), o);
    // FLASH recomputes P = exp(s - lse) from the float32 lse, whose rounding (ulp 0.004
    // at 4e4, 2 at 3e7) becomes P's relative error; MATH recomputes the softmax itself.
    const double lse_ulp = max_abs(r.fwd.lse) * 0x1p-23;
    const double p_error = backend == SDPBackend::MATH ? 0.0 : 2.0 * lse_ulp;
    EXPECT_LE(scaled_error(r.grads.grad_v, golden.grads.grad_v),
              kFudge * std::max(default_tolerance(DType::kFloat32), p_error))
        << "scale " << scale;
    // Whatever the rounding, P <= 1 bounds |grad_v[h, j, e]| by sum_i |grad_out[h, i, e]|.
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t e = 0; e < 16; ++e) {
        double column = 0.0, worst = 0.0;
        for (int64_t i = 0; i < 33; ++i) column += std::abs(go.item({0, h, i, e}));
        for (int64_t j = 0; j < 47; ++j) {
          worst = std::max(worst, std::abs(r.grads.grad_v.item({0, h, j, e})));
        }
        EXPECT_LE(worst, column) << "scale " << scale << " head " << h << " e " << e;
      }
    }
    const double bound = 16.0 * scale * 0x1p-24 * max_abs(k) * max_abs(v) * max_abs(go) * 16.0;
    EXPECT_LE(max_abs(r.grads.grad_q), bound) << "scale " << scale;
    EXPECT_LE(max_abs(r.grads.grad_k), bound) << "scale " << scale;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DegenerateShapes,
                         ::testing::Values(SDPBackend::MATH, SDPBackend::FLASH_ATTENTION),
                         [](const ::testing::TestParamInfo<SDPBackend>& info) {
                           return std::string(sdpa::backend_name(info.param));
                         });

}  // namespace
}  // namespace sdpa_test
