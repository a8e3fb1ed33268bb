// The FLASH row evaluator (src/flex/eval_row-inl.h, row_buffers.h): instructions are
// evaluated per shape (scalar, per query row, per key, per diagonal kv_idx - q_idx, per
// element, per score row) over chunks of 16 query rows x one key tile. Checks every shape
// and their mixes against the float64 oracle on every SIMD target, with lengths that are
// not multiples of the chunk or tile; that failures (out-of-range reads, integer division
// by zero) at elements a chunk covers but no mask keeps are not reported, and that those
// at kept elements are, naming the position.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "flex/row_buffers.h"
#include "flex_test_util.h"
#include "sdpa/flex_mods.h"

namespace flex_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;
using sdpa::flex::Captured;
using sdpa::flex::Expr;
using sdpa::flex::Program;
using sdpa::flex::ScoreMod;

struct Case {
  std::string name;
  ScoreMod mod;
};

// Forward on FLASH (each capability) and MATH float32 against the float64 reference that
// applies the program's own float64 evaluation (Program::evaluate) to every kept element.
void check_against_oracle(const Program& sm, const SDPAOptions& opts, int64_t L, int64_t S) {
  const int64_t B = 1, H = 2, E = 16;
  const Tensor q = randn({B, H, L, E}, DType::kFloat32, 11, 1.5);
  const Tensor k = randn({B, H, S, E}, DType::kFloat32, 12, 1.5);
  const Tensor v = randn({B, H, S, E}, DType::kFloat32, 13);
  const double scale = 1.0 / std::sqrt(static_cast<double>(E));
  RefMods m;
  const bool causal = opts.is_causal;
  // The oracle runs only at kept elements (as MATH does): masked ones may fail.
  m.score = [sm, causal](double s, int64_t b, int64_t h, int64_t i, int64_t j) {
    return causal && j > i ? s : sm.evaluate(s, b, h, i, j);
  };
  if (causal) m.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; };
  const RefForward gold = reference_forward(q, k, v, scale, m);
  double naive = 0.0;
  {
    sdpa::sdpa_kernel guard(SDPBackend::MATH);
    naive = max_abs_diff(sdpa::flex_attention(q, k, v, sm, nullptr, opts).out, gold.out);
  }
  for (const std::string& cap : supported_capabilities()) {
    SCOPED_TRACE("capability " + cap);
    ScopedCapability cg(cap);
    sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
    const auto r = sdpa::flex_attention(q, k, v, sm, nullptr, opts);
    EXPECT_TRUE(
        all_close(r.out, gold.out, tolerance(DType::kFloat32, naive, kFudgeOut), "FLASH out"));
  }
}

TEST(FlexRowEval, EveryShapeMatchesTheOracle) {
  const int64_t H = 2, L = 37, S = 150;  // 3 chunks (the last partial) x 3 tiles (partial)
  const Captured slopes("slopes", float_tensor({0.5f, 0.125f}));
  std::vector<float> rel(static_cast<size_t>(H * (L + S)));
  for (size_t n = 0; n < rel.size(); ++n) rel[n] = std::sin(0.37f * static_cast<float>(n));
  Tensor rel_t = Tensor::empty({H, L + S}, DType::kFloat32);
  std::copy(rel.begin(), rel.end(), rel_t.data<float>());
  const Captured table("rel_table", rel_t);
  std::vector<int64_t> ids(S);
  for (int64_t j = 0; j < S; ++j) ids[j] = (j * 7) % 5;
  const Captured doc("doc", int_tensor(ids));
  const std::vector<Case> cases = {
      // Diagonal through abs and a scalar product: score - X.
      {"alibi", [&](const Expr& s, const Expr&, const Expr& h, const Expr& q,
                    const Expr& kv) { return s - slopes[h] * sdpa::flex::abs(q - kv); }},
      // kv - q as a read index (diagonal read), X + score.
      {"relative table", [&](const Expr& s, const Expr&, const Expr& h, const Expr& q,
                             const Expr& kv) { return table[h][kv - q + Expr(L - 1)] + s; }},
      // Comparison of q_idx - c with kv_idx + c (diagonal) choosing per score lane.
      {"affine comparison",
       [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
         return sdpa::flex::where(kv + Expr(1) <= q - Expr(2), s, s * 0.5);
       }},
      // Per row, per key and per element (row x key) terms.
      {"row, key and element",
       [&](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
         return s * sdpa::flex::to_float(q % Expr(3) + Expr(1)) +
                sdpa::flex::to_float(doc[kv]) * 0.25 + sdpa::flex::to_float(q * kv % Expr(7)) * 0.1;
       }},
      // A diagonal combined with a row value: per element.
      {"diagonal x row",
       [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
         return s + sdpa::flex::to_float((q - kv) * q) * 0.001;
       }},
      // tanh on both sides of its polynomial / exponential split (|3 s| spans 0 to ~15).
      {"tanh", [](const Expr& s, const Expr&, const Expr&, const Expr&,
                  const Expr&) { return sdpa::flex::tanh(s * 3.0) * 2.0; }},
      // A score chain (row_buffers.h: evaluated per vector in registers) through every
      // element-wise op, with operands per call, per row and per key, on either side.
      {"chain of every op",
       [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
         using namespace sdpa::flex;
         const Expr row = to_float(q % Expr(5)) * 0.25 + 0.5;  // in [0.5, 1.5]
         const Expr key = to_float(kv % Expr(3)) + 1.0;        // in [1, 3]
         Expr x = maximum(Expr(-3.0), minimum(s, Expr(3.0)));
         x = (row - x * key) / row + 20.0;  // in [3, 41]
         x = -log(sqrt(Expr(8.0) / x));
         return tanh(abs(sigmoid(exp(x) - 1.0)) * 2.0) * 2.0;
       }},
      // A chain dividing by lanes, and one whose per-row divisor is 0 on some rows
      // (scores of +-inf there, capped by tanh).
      {"chain divisors",
       [](const Expr& s, const Expr&, const Expr&, const Expr&, const Expr& kv) {
         using namespace sdpa::flex;
         return exp(s / (to_float(kv) + 0.5) * -0.1);
       }},
      {"chain zero divisor",
       [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr&) {
         return sdpa::flex::tanh(s / sdpa::flex::to_float(q % Expr(3))) * 3.0;
       }},
      // Division by a per-row divisor (a reciprocal) and by per-key lanes.
      {"divisions",
       [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
         return s / sdpa::flex::to_float(q + Expr(1)) + s / (sdpa::flex::to_float(kv) + 0.5);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Program sm = Program::from_score_mod(c.mod);
    check_against_oracle(sm, {}, L, S);
    SDPAOptions causal;
    causal.is_causal = true;
    check_against_oracle(sm, causal, L, S);
  }
}

// Which programs take the score chain (every score-reading step element-wise on the
// previous one's value): the chain cases above do, so EveryShapeMatchesTheOracle tests the
// chain evaluator on them; programs reading score twice or through where do not.
TEST(FlexRowEval, ScoreChainsAreFoundExactlyForElementwiseChains) {
  using sdpa::flex::RowBuffers;
  auto chain_steps = [](const ScoreMod& mod) {
    const Program p = Program::from_score_mod(mod);
    const RowBuffers buf(*p.compiled(), p.captured(), 64);
    return buf.score_chain.size();
  };
  EXPECT_EQ(chain_steps(sdpa::flex::mods::soft_cap(20.0)), 3u);  // div, tanh, mul
  EXPECT_EQ(chain_steps([](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr&) {
              return Expr(1.0) - sdpa::flex::exp(s * sdpa::flex::to_float(q));
            }),
            3u);
  EXPECT_EQ(chain_steps([](const Expr& s, const Expr&, const Expr&, const Expr&, const Expr&) {
              return s * s;
            }),
            0u);
  EXPECT_EQ(chain_steps([](const Expr& s, const Expr&, const Expr&, const Expr&, const Expr&) {
              return sdpa::flex::where(s > 0.0, s, s * 0.5);
            }),
            0u);
  EXPECT_EQ(chain_steps([](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr&) {
              return s / sdpa::flex::to_float(q + Expr(1)) + s;
            }),
            0u);
}

// Chunks cover rows past q_len, keys past kv_len and keys the band masks: a read out of
// range or a division by zero there must not raise (MATH never evaluates those elements).
TEST(FlexRowEval, FailuresAtMaskedElementsAreNotReported) {
  const int64_t L = 37, S = 37;
  // Valid for q_idx >= kv_idx only; rows 37..47 of the last chunk read past the table too.
  const Captured causal_table("causal_table", randn({L}, DType::kFloat32, 21));
  const Program read =
      Program::from_score_mod([&](const Expr& s, const Expr&, const Expr&, const Expr& q,
                                  const Expr& kv) { return s + causal_table[q - kv]; });
  // kv_idx - q_idx - 1 is 0 only just above the diagonal (kv_idx = q_idx + 1).
  const Program divide = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return s + sdpa::flex::to_float(sdpa::flex::floor_div(Expr(7), kv - q - Expr(1)));
      });
  SDPAOptions causal;
  causal.is_causal = true;
  for (const Program* sm : {&read, &divide}) {
    check_against_oracle(*sm, causal, L, S);
  }
}

// INT64_MIN // -1 overflows, and x86's idiv traps on it (SIGFPE killed the process). It
// wraps to INT64_MIN, as in numpy and torch; INT64_MIN % -1 is 0.
TEST(FlexRowEval, Int64MinOverMinusOneWraps) {
  const Program sm = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr&, const Expr& kv) {
        const Expr min_int = Expr(std::numeric_limits<int64_t>::min()) + kv - kv;  // per element
        return s + sdpa::flex::to_float(sdpa::flex::floor_div(min_int, Expr(-1)) % Expr(7) +
                                        min_int % Expr(-1));
      });
  EXPECT_EQ(sm.evaluate(0.5, 0, 0, 3, 2), 0.5 + 6.0);  // Python: (-2**63) % 7 == 6
  check_against_oracle(sm, {}, 37, 41);
}

// NaN exactly where `golden` has NaN, infinities equal, finite elements within
// atol + rtol |golden|.
::testing::AssertionResult matches_with_nan(const Tensor& actual, const Tensor& golden,
                                            double atol, double rtol) {
  const std::vector<double> x = values(actual), y = values(golden);
  if (x.size() != y.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < x.size(); ++i) {
    const bool ok = std::isnan(y[i]) ? std::isnan(x[i])
                    : std::isinf(y[i]) ? x[i] == y[i]
                                       : std::fabs(x[i] - y[i]) <= atol + rtol * std::fabs(y[i]);
    if (!ok) return ::testing::AssertionFailure() << i << ": " << x[i] << " vs " << y[i];
  }
  return ::testing::AssertionSuccess();
}

// exp, log and sigmoid over their whole domains, as MATH computes them: the SIMD
// functions are valid on part of it only (log of a negative score gave FLASH a finite
// lse where MATH gives NaN, log(0) -102 instead of -inf, exp past 88.7 finite values
// where MATH overflows). NaN and infinities must land on the same elements.
TEST(FlexRowEval, MathFunctionsOverTheirWholeDomainMatchMath) {
  namespace fx = sdpa::flex;
  const std::vector<std::pair<std::string, Program>> programs = {
      {"log(s)", Program::from_score_mod([](const Expr& s, const Expr&, const Expr&, const Expr&,
                                            const Expr&) { return fx::log(s); })},
      {"log(max(s, 0))",
       Program::from_score_mod([](const Expr& s, const Expr&, const Expr&, const Expr&,
                                  const Expr&) { return fx::log(fx::maximum(s, Expr(0.0))); })},
      // Rows 0-9 overflow at every key (MATH: all scores +inf, a NaN row), the rest not.
      {"exp(s + 100 [q < 10])", Program::from_score_mod([](const Expr& s, const Expr&,
                                                           const Expr&, const Expr& q,
                                                           const Expr&) {
         return fx::exp(s + fx::where(q < Expr(10), Expr(100.0), Expr(0.0)));
       })},
      {"s + sigmoid(-100 s)", Program::from_score_mod([](const Expr& s, const Expr&, const Expr&,
                                                         const Expr&, const Expr&) {
         return s + fx::sigmoid(s * Expr(-100.0));
       })},
      {"s + |INT64_MIN + kv - kv|", Program::from_score_mod([](const Expr& s, const Expr&,
                                                               const Expr&, const Expr&,
                                                               const Expr& kv) {
         const Expr min_int = Expr(std::numeric_limits<int64_t>::min()) + kv - kv;
         return s + fx::to_float(fx::abs(min_int) % Expr(5));  // |INT64_MIN| wraps: 2
       })},
  };
  const int64_t B = 1, H = 2, L = 37, S = 45, E = 8;
  const Tensor q = randn({B, H, L, E}, DType::kFloat32, 41);
  const Tensor k = randn({B, H, S, E}, DType::kFloat32, 42);
  const Tensor v = randn({B, H, S, E}, DType::kFloat32, 43);
  for (const auto& [name, sm] : programs) {
    SCOPED_TRACE(name);
    sdpa::AttentionResult math;
    {
      sdpa::sdpa_kernel guard(SDPBackend::MATH);
      math = sdpa::flex_attention(q, k, v, sm);
    }
    for (const std::string& cap : supported_capabilities()) {
      SCOPED_TRACE("capability " + cap);
      ScopedCapability cg(cap);
      sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
      const sdpa::AttentionResult flash = sdpa::flex_attention(q, k, v, sm);
      EXPECT_TRUE(matches_with_nan(flash.out, math.out, 1e-5, 1e-4));
      EXPECT_TRUE(matches_with_nan(flash.lse, math.lse, 1e-5, 1e-5));
    }
  }
}

TEST(FlexRowEval, FailuresAtKeptElementsAreReported) {
  const int64_t B = 1, H = 1, L = 37, S = 41, E = 8;
  const Tensor q = randn({B, H, L, E}, DType::kFloat32, 31),
               k = randn({B, H, S, E}, DType::kFloat32, 32);
  const Tensor v = randn({B, H, S, E}, DType::kFloat32, 33);
  // q_idx - kv_idx + 40 spans [0, 76]: with a table of 76 the only bad element is
  // (q_idx, kv_idx) = (36, 0) (rows 37..47 of the last chunk, past L, read further out).
  const Captured diag_table("diag_table", randn({76}, DType::kFloat32, 34));
  const Program read =
      Program::from_score_mod([&](const Expr& s, const Expr&, const Expr&, const Expr& qi,
                                  const Expr& kv) { return s + diag_table[qi - kv + Expr(40)]; });
  const Program divide = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& qi, const Expr& kv) {
        return s + sdpa::flex::to_float(sdpa::flex::floor_div(Expr(7), kv - qi - Expr(1)));
      });
  for (const std::string& cap : supported_capabilities()) {
    SCOPED_TRACE("capability " + cap);
    ScopedCapability cg(cap);
    for (SDPBackend backend : {SDPBackend::FLASH_ATTENTION, SDPBackend::MATH}) {
      SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
      sdpa::sdpa_kernel guard(backend);
      EXPECT_TRUE(
          throws_error_containing([&] { sdpa::flex_attention(q, k, v, read); },
                                  {"diag_table", "index 76", "size 76", "q_idx=36", "kv_idx=0"}));
      EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(q, k, v, divide); },
                                          {"integer division by zero"}));
    }
  }
}

}  // namespace
}  // namespace flex_test
