#pragma once
// Seeded random flex programs for the fuzz tests: typed expression trees over
// b / h / q_idx / kv_idx / score, constants and captured-tensor reads, built only from
// operations that are defined everywhere (division by a nonzero constant or by c + |x|,
// exp of a bounded argument, captured indices reduced modulo the tensor size), with a
// conservative magnitude bound tracked per subexpression so ints stay exact in float64
// and in float32 after to_float, and scores stay in a range float32 represents well.
//
// Also a float32 evaluator of a compiled program mirroring what FLASH's row evaluator
// computes (ints int64, floats float32); the fuzz tests use it only to find the elements
// where float32 and float64 evaluation legitimately differ (comparisons at a tie), never
// as the oracle.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flex/eval_scalar.h"
#include "flex/node.h"
#include "flex_test_util.h"

namespace flex_test {

using sdpa::flex::Captured;
using sdpa::flex::Expr;

struct GenDims {
  int64_t B = 1, H = 1, L = 1, S = 1;
};

class ProgramGen {
 public:
  ProgramGen(uint64_t seed, GenDims dims, bool allow_score, bool tables_require_grad = false)
      : rng_(seed), dims_(dims), allow_score_(allow_score) {
    // Float tables are float64 so finite differences in them are exact enough.
    Tensor fv = randn({13}, DType::kFloat64, seed ^ 0x51, 0.8);
    Tensor fm = randn({dims.H, 11}, DType::kFloat64, seed ^ 0x52, 0.8);
    fvec_bound_ = max_abs(fv);
    fmat_bound_ = max_abs(fm);
    fvec_ = Captured("fz_vec", fv, tables_require_grad);
    fmat_ = Captured("fz_mat", fm, tables_require_grad);
    Tensor iv = Tensor::empty({9}, DType::kInt64);
    Tensor iw = Tensor::empty({7}, DType::kInt32);
    Tensor bv = Tensor::empty({5}, DType::kBool);
    std::uniform_int_distribution<int> small(-20, 20);
    for (int i = 0; i < 9; ++i) iv.data<int64_t>()[i] = small(rng_);
    for (int i = 0; i < 7; ++i) iw.data<int32_t>()[i] = small(rng_);
    for (int i = 0; i < 5; ++i) bv.data<bool>()[i] = coin(0.5);
    ivec_ = Captured("fz_ivec", iv);
    iw32_ = Captured("fz_i32", iw);
    bvec_ = Captured("fz_bool", bv);
  }

  /// A score_mod program: a random float expression of depth <= `depth`.
  sdpa::flex::Program score_mod(int depth) {
    return sdpa::flex::Program::from_score_mod(
        [&](const Expr& score, const Expr& b, const Expr& h, const Expr& q, const Expr& kv) {
          bind(score, b, h, q, kv);
          // Logits beyond ~64 saturate the softmax and leave float32 a coarse grid; scale
          // by an exact power of two.
          V r = gen_float(depth);
          while (r.bound > 64.0) r = {r.e * Expr(0.125), r.bound / 8.0};
          return r.e;
        });
  }
  /// A score_mod exercising the integer evaluator: score + 2^-k * float(random int
  /// expression of depth <= `depth`), k making the bias at most 16.
  sdpa::flex::Program int_score_mod(int depth) {
    return sdpa::flex::Program::from_score_mod(
        [&](const Expr& score, const Expr& b, const Expr& h, const Expr& q, const Expr& kv) {
          bind(score, b, h, q, kv);
          V i = gen_int(depth);
          double factor = 1.0;
          while (i.bound * factor > 16.0) factor /= 2.0;
          return score + sdpa::flex::to_float(i.e) * Expr(factor);
        });
  }
  /// A mask_mod program: a random bool expression of depth <= `depth`.
  sdpa::flex::Program mask_mod(int depth) {
    return sdpa::flex::Program::from_mask_mod(
        [&](const Expr& b, const Expr& h, const Expr& q, const Expr& kv) {
          bind(Expr(0.0), b, h, q, kv);
          return gen_bool(depth);
        });
  }

 private:
  void bind(const Expr& score, const Expr& b, const Expr& h, const Expr& q, const Expr& kv) {
    score_ = score;
    b_ = b;
    h_ = h;
    q_ = q;
    kv_ = kv;
  }

  struct V {
    Expr e;
    double bound;  // |value| <= bound for every input in range
  };

  static double max_abs(const Tensor& t) {
    double m = 0.0;
    for (double x : values(t)) m = std::max(m, std::fabs(x));
    return m;
  }

  bool coin(double p) { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p; }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  int64_t nonzero_const(int lo, int hi) {
    for (;;) {
      const int64_t c = std::uniform_int_distribution<int>(lo, hi)(rng_);
      if (c != 0) return c;
    }
  }
  // Multiples of 1/8 in [-4, 4]: exact in float32 and float64, so int-derived float
  // arithmetic with them rounds identically in both.
  double dyadic() { return std::uniform_int_distribution<int>(-32, 32)(rng_) / 8.0; }

  V int_leaf() {
    switch (pick(5)) {
      case 0: return {b_, static_cast<double>(dims_.B - 1)};
      case 1: return {h_, static_cast<double>(dims_.H - 1)};
      case 2: return {q_, static_cast<double>(dims_.L - 1)};
      case 3: return {kv_, static_cast<double>(dims_.S - 1)};
      default: {
        const int64_t c = std::uniform_int_distribution<int>(-7, 9)(rng_);
        return {Expr(c), static_cast<double>(std::abs(c))};
      }
    }
  }

  V gen_int(int depth) {
    if (depth <= 0 || coin(0.25)) return int_leaf();
    V r = int_leaf();
    switch (pick(16)) {
      case 0: {
        V a = gen_int(depth - 1), b = gen_int(depth - 1);
        r = {a.e + b.e, a.bound + b.bound};
        break;
      }
      case 1: {
        V a = gen_int(depth - 1), b = gen_int(depth - 1);
        r = {a.e - b.e, a.bound + b.bound};
        break;
      }
      case 2: {
        V a = gen_int(depth - 1), b = gen_int(depth - 1);
        if (a.bound * b.bound <= 1e6) {
          r = {a.e * b.e, a.bound * b.bound};
        } else {
          r = {a.e - b.e, a.bound + b.bound};
        }
        break;
      }
      case 3: {
        V a = gen_int(depth - 1);
        const int64_t c = nonzero_const(-9, 9);
        r = {a.e % Expr(c), static_cast<double>(std::abs(c) - 1)};
        break;
      }
      case 4: {
        V a = gen_int(depth - 1);
        const int64_t c = nonzero_const(-9, 9);
        r = {sdpa::flex::floor_div(a.e, Expr(c)), a.bound / static_cast<double>(std::abs(c)) + 1};
        break;
      }
      case 5: {
        V a = gen_int(depth - 1), b = gen_int(depth - 1);
        r = {coin(0.5) ? sdpa::flex::minimum(a.e, b.e) : sdpa::flex::maximum(a.e, b.e),
             std::max(a.bound, b.bound)};
        break;
      }
      case 6: {
        V a = gen_int(depth - 1);
        r = {coin(0.5) ? sdpa::flex::abs(a.e) : -a.e, a.bound};
        break;
      }
      case 7: {
        Expr c = gen_bool(depth - 1);
        V a = gen_int(depth - 1), b = gen_int(depth - 1);
        r = {sdpa::flex::where(c, a.e, b.e), std::max(a.bound, b.bound)};
        break;
      }
      case 8: {
        V a = gen_int(depth - 1);
        r = {ivec_[sdpa::flex::abs(a.e) % Expr(9)], 20.0};
        break;
      }
      case 9: {
        V a = gen_int(depth - 1);
        r = {iw32_[a.e % Expr(7)], 20.0};  // floor modulo keeps negative a in range
        break;
      }
      case 10: {
        // Relative position, the shape real masks take (windows, bands): q - kv + c.
        const int64_t c = std::uniform_int_distribution<int>(-9, 9)(rng_);
        r = {q_ - kv_ + Expr(c), static_cast<double>(dims_.L + dims_.S + std::abs(c))};
        break;
      }
      case 11: {
        const int64_t c = std::uniform_int_distribution<int>(-9, 9)(rng_);
        r = {sdpa::flex::abs(kv_ - q_ + Expr(c)), static_cast<double>(dims_.L + dims_.S + std::abs(c))};
        break;
      }
      case 12: {
        // Two's complement bit operations stay within the next power of two of the bounds.
        V a = gen_int(depth - 1), b = gen_int(depth - 1);
        const int which = pick(3);
        r = {which == 0 ? (a.e & b.e) : which == 1 ? (a.e | b.e) : (a.e ^ b.e),
             2.0 * std::max(a.bound, b.bound) + 2.0};
        break;
      }
      case 13: {
        V a = gen_int(depth - 1);
        const int64_t c = std::uniform_int_distribution<int>(-1, 3)(rng_);  // -1: out of range
        r = coin(0.5) ? V{a.e << Expr(c), a.bound * 8.0} : V{a.e >> Expr(c), a.bound + 1.0};
        break;
      }
      case 14: {
        V a = gen_int(depth - 1);
        r = {~a.e, a.bound + 1.0};
        break;
      }
      default: {
        V a = gen_int(depth - 1), b = gen_int(depth - 1);
        r = {a.e + b.e, a.bound + b.bound};
        break;
      }
    }
    if (r.bound > 1e6) r = {r.e % Expr(1009), 1008.0};
    return r;
  }

  V float_leaf(int depth) {
    // score_mods: about a third of the float leaves are the score.
    const int k = allow_score_ && coin(0.35) ? 5 : pick(5);
    switch (k) {
      case 0: {
        const double c = dyadic();
        return {Expr(c), std::fabs(c)};
      }
      case 1: {
        V i = depth > 0 ? gen_int(depth - 1) : int_leaf();
        return {sdpa::flex::to_float(i.e), i.bound};
      }
      case 2: {
        V i = depth > 0 ? gen_int(depth - 1) : int_leaf();
        return {fvec_[i.e % Expr(13)], fvec_bound_};
      }
      case 3: {
        V i = depth > 0 ? gen_int(depth - 1) : int_leaf();
        return {fmat_[h_][sdpa::flex::abs(i.e) % Expr(11)],
                fmat_bound_};
      }
      case 4: {
        // int / int is true division (float).
        V i = depth > 0 ? gen_int(depth - 1) : int_leaf();
        const int64_t c = nonzero_const(-5, 5);
        return {i.e / Expr(c), i.bound / static_cast<double>(std::abs(c))};
      }
      default:
        return {score_, kScoreBound};
    }
  }

  V gen_float(int depth) {
    if (depth <= 0 || coin(0.25)) return float_leaf(depth);
    V r = float_leaf(depth);
    switch (pick(14)) {
      case 0: {
        V a = gen_float(depth - 1), b = gen_float(depth - 1);
        r = {a.e + b.e, a.bound + b.bound};
        break;
      }
      case 1: {
        V a = gen_float(depth - 1), b = gen_float(depth - 1);
        r = {a.e - b.e, a.bound + b.bound};
        break;
      }
      case 2: {
        V a = gen_float(depth - 1), b = gen_float(depth - 1);
        if (a.bound * b.bound <= 1e4) {
          r = {a.e * b.e, a.bound * b.bound};
        } else {
          r = {a.e + b.e, a.bound + b.bound};
        }
        break;
      }
      case 3: {
        V a = gen_float(depth - 1), b = gen_float(depth - 1);
        const double c = (1 + pick(4)) * 0.5;
        r = {a.e / (Expr(c) + sdpa::flex::abs(b.e)), a.bound / c};
        break;
      }
      case 4: {
        V a = gen_float(depth - 1);
        if (a.bound <= 3.0) {
          r = {sdpa::flex::exp(a.e), std::exp(a.bound)};
        } else if (coin(0.5)) {
          r = {sdpa::flex::exp(-sdpa::flex::abs(a.e)), 1.0};
        } else {
          r = {sdpa::flex::exp(sdpa::flex::tanh(a.e)), std::exp(1.0)};
        }
        break;
      }
      case 5: {
        V a = gen_float(depth - 1);
        r = {sdpa::flex::tanh(a.e), 1.0};
        break;
      }
      case 6: {
        V a = gen_float(depth - 1);
        r = {sdpa::flex::sigmoid(a.e), 1.0};
        break;
      }
      case 7: {
        Expr c = gen_bool(depth - 1);
        V a = gen_float(depth - 1), b = gen_float(depth - 1);
        r = {sdpa::flex::where(c, a.e, b.e), std::max(a.bound, b.bound)};
        break;
      }
      case 8: {
        V a = gen_float(depth - 1), b = gen_float(depth - 1);
        r = {coin(0.5) ? sdpa::flex::minimum(a.e, b.e) : sdpa::flex::maximum(a.e, b.e),
             std::max(a.bound, b.bound)};
        break;
      }
      case 9: {
        V a = gen_float(depth - 1);
        r = {coin(0.5) ? sdpa::flex::abs(a.e) : -a.e, a.bound};
        break;
      }
      case 10: {
        V a = gen_float(depth - 1);
        r = {sdpa::flex::log(Expr(1.0) + sdpa::flex::abs(a.e)), std::log1p(a.bound)};
        break;
      }
      case 11: {
        V a = gen_float(depth - 1);
        r = {sdpa::flex::sqrt(Expr(0.25) + sdpa::flex::abs(a.e)), std::sqrt(0.25 + a.bound)};
        break;
      }
      case 12: {
        // Mixed int / float arithmetic promotes the int.
        V a = gen_float(depth - 1), i = gen_int(depth - 1);
        r = {a.e + i.e, a.bound + i.bound};
        break;
      }
      default: {
        V a = gen_float(depth - 1);
        const double c = dyadic();
        r = {a.e * Expr(c), a.bound * std::fabs(c)};
        break;
      }
    }
    // 2^-10 is exact: keeps int-derived floats exact while bounding magnitudes.
    if (r.bound > 1e4) r = {r.e * Expr(1.0 / 1024.0), r.bound / 1024.0};
    return r;
  }

  Expr compare(int op, const Expr& a, const Expr& b) {
    switch (op) {
      case 0: return a < b;
      case 1: return a <= b;
      case 2: return a > b;
      case 3: return a >= b;
      case 4: return a == b;
      default: return a != b;
    }
  }

  Expr gen_bool(int depth) {
    if (depth <= 0 || coin(0.3)) {
      switch (pick(10)) {
        case 0: return Expr(coin(0.5));
        case 1: {
          V a = depth > 0 ? gen_int(depth - 1) : int_leaf();
          return bvec_[a.e % Expr(5)];
        }
        case 2:
        case 3: {
          V a = depth > 0 ? gen_float(depth - 1) : float_leaf(0);
          V b = depth > 0 ? gen_float(depth - 1) : float_leaf(0);
          return compare(pick(4), a.e, b.e);  // no float ==: ties only
        }
        case 4:
        case 5: {
          // An int expression against a small constant (windows, prefixes, bands).
          V a = depth > 0 ? gen_int(depth - 1) : int_leaf();
          return compare(pick(6), a.e, Expr(static_cast<int64_t>(std::uniform_int_distribution<int>(-4, 24)(rng_))));
        }
        default: {
          V a = depth > 0 ? gen_int(depth - 1) : int_leaf();
          V b = depth > 0 ? gen_int(depth - 1) : int_leaf();
          return compare(pick(6), a.e, b.e);
        }
      }
    }
    switch (pick(7)) {
      case 0: return gen_bool(depth - 1) & gen_bool(depth - 1);
      case 1: return gen_bool(depth - 1) | gen_bool(depth - 1);
      case 2: return !gen_bool(depth - 1);
      case 3: return coin(0.5) ? (gen_bool(depth - 1) == gen_bool(depth - 1))
                               : (gen_bool(depth - 1) != gen_bool(depth - 1));
      case 4: return sdpa::flex::where(gen_bool(depth - 1), gen_bool(depth - 1), gen_bool(depth - 1));
      case 5: return gen_bool(depth - 1) && gen_bool(depth - 1);
      default: {
        V a = gen_int(depth - 1), b = gen_int(depth - 1);
        return compare(pick(6), a.e, b.e);
      }
    }
  }

  static constexpr double kScoreBound = 8.0;
  std::mt19937_64 rng_;
  GenDims dims_;
  Expr score_ = Expr(0.0), b_ = Expr(0), h_ = Expr(0), q_ = Expr(0), kv_ = Expr(0);
  bool allow_score_;
  Captured fvec_{"unset", Tensor::zeros({1}, DType::kFloat32)};
  Captured fmat_{"unset", Tensor::zeros({1}, DType::kFloat32)};
  Captured ivec_{"unset", Tensor::zeros({1}, DType::kInt64)};
  Captured iw32_{"unset", Tensor::zeros({1}, DType::kInt32)};
  Captured bvec_{"unset", Tensor::zeros({1}, DType::kBool)};
  double fvec_bound_ = 0.0, fmat_bound_ = 0.0;
};

/// Evaluates `program` as FLASH's row evaluator does: ints in int64, bools 0/1, floats in
/// float32 (each float instruction rounded to float). Out-of-range reads give NaN.
inline double evaluate_float32(const sdpa::flex::Program& program, float score, int64_t b,
                               int64_t h, int64_t q_idx, int64_t kv_idx) {
  using sdpa::flex::Op;
  using sdpa::flex::ValueType;
  const auto& code = program.compiled()->code;
  std::vector<double> v(code.size());
  for (size_t n = 0; n < code.size(); ++n) {
    const auto& in = code[n];
    auto A = [&](int i) { return v[in.args[i]]; };
    auto F = [&](int i) { return static_cast<float>(v[in.args[i]]); };
    auto I = [&](int i) { return static_cast<int64_t>(v[in.args[i]]); };
    const bool fl = in.type == ValueType::kFloat;
    double r = 0.0;
    switch (in.op) {
      case Op::kScore: r = score; break;
      case Op::kBatch: r = static_cast<double>(b); break;
      case Op::kHead: r = static_cast<double>(h); break;
      case Op::kQIdx: r = static_cast<double>(q_idx); break;
      case Op::kKvIdx: r = static_cast<double>(kv_idx); break;
      case Op::kConst: r = fl ? static_cast<float>(in.constant) : in.constant; break;
      case Op::kRead: {
        const Captured& c = program.captured()[in.slot];
        int64_t index[8];
        for (size_t d = 0; d < in.args.size(); ++d) {
          index[d] = I(static_cast<int>(d));
          if (index[d] < 0 || index[d] >= c.tensor().size(static_cast<int64_t>(d))) return NAN;
        }
        r = sdpa::flex::read_captured(c, index);
        if (fl) r = static_cast<float>(r);
        break;
      }
      case Op::kAdd: r = fl ? static_cast<double>(F(0) + F(1)) : A(0) + A(1); break;
      case Op::kSub: r = fl ? static_cast<double>(F(0) - F(1)) : A(0) - A(1); break;
      case Op::kMul: r = fl ? static_cast<double>(F(0) * F(1)) : A(0) * A(1); break;
      case Op::kDiv: r = F(0) / F(1); break;
      case Op::kMod: r = static_cast<double>(sdpa::flex::floor_mod_int(I(0), I(1))); break;
      case Op::kFloorDiv: r = static_cast<double>(sdpa::flex::floor_div_int(I(0), I(1))); break;
      case Op::kNeg: r = -A(0); break;
      case Op::kMin: r = std::min(A(0), A(1)); break;
      case Op::kMax: r = std::max(A(0), A(1)); break;
      case Op::kAbs: r = std::fabs(A(0)); break;
      case Op::kExp: r = std::exp(F(0)); break;
      case Op::kLog: r = std::log(F(0)); break;
      case Op::kTanh: r = std::tanh(F(0)); break;
      case Op::kSigmoid: r = 1.0f / (1.0f + std::exp(-F(0))); break;
      case Op::kSqrt: r = std::sqrt(F(0)); break;
      case Op::kToFloat: r = static_cast<float>(A(0)); break;
      case Op::kFloor: r = std::floor(F(0)); break;
      case Op::kCeil: r = std::ceil(F(0)); break;
      case Op::kSin: r = std::sin(F(0)); break;
      case Op::kCos: r = std::cos(F(0)); break;
      case Op::kBitAnd: r = static_cast<double>(I(0) & I(1)); break;
      case Op::kBitOr: r = static_cast<double>(I(0) | I(1)); break;
      case Op::kBitXor: r = static_cast<double>(I(0) ^ I(1)); break;
      case Op::kBitNot: r = static_cast<double>(~I(0)); break;
      case Op::kShl:
        r = I(1) < 0 || I(1) > 63 ? 0.0 : A(0) * std::ldexp(1.0, static_cast<int>(I(1)));
        break;
      case Op::kShr:
        r = I(1) < 0 || I(1) > 63 ? (A(0) < 0 ? -1.0 : 0.0)
                                  : std::floor(A(0) / std::ldexp(1.0, static_cast<int>(I(1))));
        break;
      case Op::kLt: r = A(0) < A(1); break;
      case Op::kLe: r = A(0) <= A(1); break;
      case Op::kGt: r = A(0) > A(1); break;
      case Op::kGe: r = A(0) >= A(1); break;
      case Op::kEq: r = A(0) == A(1); break;
      case Op::kNe: r = A(0) != A(1); break;
      case Op::kAnd: r = A(0) != 0.0 && A(1) != 0.0; break;
      case Op::kOr: r = A(0) != 0.0 || A(1) != 0.0; break;
      case Op::kNot: r = A(0) == 0.0; break;
      case Op::kWhere: r = A(0) != 0.0 ? A(1) : A(2); break;
    }
    if (fl) r = static_cast<float>(r);
    v[n] = r;
  }
  return v[program.compiled()->result];
}

}  // namespace flex_test
