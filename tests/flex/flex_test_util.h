#pragma once
// Helpers shared by the flex tests: seeded inputs, a float64 reference attention that takes
// the score transform / mask as plain callbacks (so the oracle is independent of the
// library's kernels), and the dtype-scaled comparison of STYLE.md item 10.
//
// Tolerance rule (PyTorch test_transformers' get_tolerances, simplified):
//   golden  = float64 reference (this file's reference_forward/backward, or MATH float64),
//   naive   = the same call on MATH in the tested dtype (its own rounding error),
//   atol    = fudge * max(default_atol(dtype), max |naive - golden|),
//   rtol    = fudge * default_rtol(dtype),
//   pass   <=> |actual - golden| <= atol + rtol * |golden| for every element, with
//              infinities required to match exactly (fully masked rows: lse = -inf).
// Fudge factors (fixed up front, not tuned to pass): out 4, lse 4, grad_v 4, grad_k 8,
// grad_q 8, captured-tensor gradients 8 (the backward chains more roundings).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/capability.h"
#include "common/threads.h"
#include "sdpa/flex.h"
#include "sdpa/flex_attention.h"
#include "sdpa/sdpa.h"

namespace flex_test {

using sdpa::DType;
using sdpa::Shape;
using sdpa::Tensor;
using sdpa::test::ScopedCapability;
using sdpa::test::supported_capabilities;

inline constexpr double kFudgeOut = 4.0;
inline constexpr double kFudgeLse = 4.0;
inline constexpr double kFudgeGradV = 4.0;
inline constexpr double kFudgeGradK = 8.0;
inline constexpr double kFudgeGradQ = 8.0;
inline constexpr double kFudgeGradCaptured = 8.0;
/// float64 vs float64 (library MATH in float64 vs this file's reference): both exact up to
/// summation order, so a tight fixed bound.
inline constexpr double kFloat64Tol = 1e-9;

inline double default_atol(DType d) {
  switch (d) {
    case DType::kFloat64: return 1e-7;
    case DType::kFloat32: return 1e-5;
    case DType::kBFloat16: return 1e-5;
    case DType::kFloat16: return 1e-5;
    default: return 0.0;
  }
}
inline double default_rtol(DType d) {
  switch (d) {
    case DType::kFloat64: return 1e-7;
    case DType::kFloat32: return 1.3e-6;
    case DType::kBFloat16: return 1.6e-2;
    case DType::kFloat16: return 1e-3;
    default: return 0.0;
  }
}

struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
};

inline Tolerance tolerance(DType dtype, double naive_error, double fudge) {
  return {fudge * std::max(default_atol(dtype), naive_error), fudge * default_rtol(dtype)};
}
inline Tolerance float64_tolerance() { return {kFloat64Tol, kFloat64Tol}; }

/// Contiguous float64 values of any tensor.
inline std::vector<double> values(const Tensor& t) {
  const Tensor c = t.to(DType::kFloat64);
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

/// Seeded N(0, stddev^2) values rounded to `dtype`.
inline Tensor randn(const Shape& shape, DType dtype, uint64_t seed, double stddev = 1.0) {
  Tensor t = Tensor::empty(shape, DType::kFloat64);
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> n(0.0, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = n(gen);
  return t.to(dtype);
}

inline Tensor to64(const Tensor& t) { return t.to(DType::kFloat64); }

/// max |a - b| over elements, infinities of equal sign counting as equal; NaN or an
/// infinity mismatch gives +inf. Rows listed in `skip_rows` (outer index = element /
/// row_size) are ignored.
inline double max_abs_diff(const Tensor& a, const Tensor& b, int64_t row_size = 0,
                           const std::vector<bool>* skip_rows = nullptr) {
  const std::vector<double> x = values(a), y = values(b);
  if (x.size() != y.size()) return std::numeric_limits<double>::infinity();
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (skip_rows && (*skip_rows)[i / row_size]) continue;
    if (std::isinf(x[i]) || std::isinf(y[i])) {
      if (x[i] != y[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double d = std::fabs(x[i] - y[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

/// Elementwise |actual - golden| <= atol + rtol |golden|; reports the worst element.
inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& golden,
                                            Tolerance tol, const std::string& what,
                                            int64_t row_size = 0,
                                            const std::vector<bool>* skip_rows = nullptr) {
  if (actual.sizes() != golden.sizes()) {
    return ::testing::AssertionFailure() << what << ": shape " << sdpa::shape_str(actual.sizes())
                                         << " vs golden " << sdpa::shape_str(golden.sizes());
  }
  const std::vector<double> x = values(actual), y = values(golden);
  double worst_excess = 0.0;
  int64_t worst = -1;
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (skip_rows && (*skip_rows)[i / row_size]) continue;
    bool ok;
    double excess = 0.0;
    if (std::isinf(x[i]) || std::isinf(y[i]) || std::isnan(x[i]) || std::isnan(y[i])) {
      ok = x[i] == y[i];
      excess = ok ? 0.0 : std::numeric_limits<double>::infinity();
    } else {
      const double limit = tol.atol + tol.rtol * std::fabs(y[i]);
      const double d = std::fabs(x[i] - y[i]);
      ok = d <= limit;
      excess = d / limit;
    }
    if (!ok) {
      ++bad;
      if (worst < 0 || excess > worst_excess) {
        worst_excess = excess;
        worst = static_cast<int64_t>(i);
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << x.size() << " elements outside atol=" << tol.atol
         << " rtol=" << tol.rtol << "; worst at flat index " << worst << ": actual "
         << x[worst] << " golden " << y[worst] << " (|diff| " << std::fabs(x[worst] - y[worst])
         << ")";
}

/// What the reference applies to the scaled scores s = scale * q.k of (b, h, i, j), in the
/// library's order: additive term, score transform, mask.
struct RefMods {
  std::function<double(int64_t b, int64_t h, int64_t i, int64_t j)> additive;  // may be -inf
  std::function<double(double s, int64_t b, int64_t h, int64_t i, int64_t j)> score;
  std::function<double(double s, int64_t b, int64_t h, int64_t i, int64_t j)> dscore;
  std::function<bool(int64_t b, int64_t h, int64_t i, int64_t j)> keep;
  /// Backward only: receives dL/d(score transform output) of every kept element, with the
  /// transform's input s (for captured-tensor gradients).
  std::function<void(int64_t b, int64_t h, int64_t i, int64_t j, double s, double dz)> on_dz;
};

struct RefForward {
  Tensor out;  // float64 [B, Hq, L, Ev]
  Tensor lse;  // float64 [B, Hq, L]
};
struct RefGrads {
  Tensor dq, dk, dv;  // float64, shaped like q, k, v
};

namespace detail {

struct Dims {
  int64_t B, Hq, Hkv, L, S, E, Ev, group;
};
inline Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), 0};
  d.group = d.Hq / d.Hkv;
  return d;
}

// Scores z[j] (after additive, transform and mask) and the transform inputs s_in[j] of
// one row; returns the row max.
inline double row_scores(const Dims& d, const std::vector<double>& q, const std::vector<double>& k,
                         double scale, const RefMods& mods, int64_t b, int64_t h, int64_t i,
                         std::vector<double>& z, std::vector<double>& s_in) {
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const int64_t hk = h / d.group;
  const double* qi = q.data() + ((b * d.Hq + h) * d.L + i) * d.E;
  double mx = neg_inf;
  for (int64_t j = 0; j < d.S; ++j) {
    const double* kj = k.data() + ((b * d.Hkv + hk) * d.S + j) * d.E;
    double dot = 0.0;
    for (int64_t e = 0; e < d.E; ++e) dot += qi[e] * kj[e];
    double s = dot * scale;
    if (mods.additive) s += mods.additive(b, h, i, j);
    s_in[j] = s;
    double t = mods.score ? mods.score(s, b, h, i, j) : s;
    if (mods.keep && !mods.keep(b, h, i, j)) t = neg_inf;
    z[j] = t;
    mx = std::max(mx, t);
  }
  return mx;
}

}  // namespace detail

/// Float64 attention with `mods`; q [B, Hq, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] of any
/// dtype (read exactly). Fully masked rows: out 0, lse -inf.
inline RefForward reference_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                    double scale, const RefMods& mods) {
  const detail::Dims d = detail::dims_of(q, k, v);
  const std::vector<double> qv = values(q), kv = values(k), vv = values(v);
  RefForward r{Tensor::zeros({d.B, d.Hq, d.L, d.Ev}, DType::kFloat64),
               Tensor::zeros({d.B, d.Hq, d.L}, DType::kFloat64)};
  std::vector<double> z(d.S), s_in(d.S);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / d.group;
      for (int64_t i = 0; i < d.L; ++i) {
        const int64_t row = (b * d.Hq + h) * d.L + i;
        const double mx = detail::row_scores(d, qv, kv, scale, mods, b, h, i, z, s_in);
        if (mx == -std::numeric_limits<double>::infinity()) {
          r.lse.data<double>()[row] = mx;
          continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < d.S; ++j) sum += std::exp(z[j] - mx);
        r.lse.data<double>()[row] = mx + std::log(sum);
        double* o = r.out.data<double>() + row * d.Ev;
        for (int64_t j = 0; j < d.S; ++j) {
          const double p = std::exp(z[j] - mx) / sum;
          const double* vj = vv.data() + ((b * d.Hkv + hk) * d.S + j) * d.Ev;
          for (int64_t e = 0; e < d.Ev; ++e) o[e] += p * vj[e];
        }
      }
    }
  }
  return r;
}

/// Float64 gradients of sum(out * dout) with respect to q, k, v (k and v summed over the
/// query heads of a group), using mods.dscore (1 when absent) for d(transform)/d(s).
/// With `saved_out`, D = rowsum(dout o saved_out) uses that (dtype-rounded) forward output,
/// as FlashAttention-2's backward documented in sdpa.h does with the `out` it is given:
/// the exact result of the documented algorithm for those inputs.
inline RefGrads reference_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                   const Tensor& v, double scale, const RefMods& mods,
                                   const Tensor* saved_out = nullptr) {
  const detail::Dims d = detail::dims_of(q, k, v);
  const RefForward fwd = reference_forward(q, k, v, scale, mods);
  const std::vector<double> qv = values(q), kv = values(k), vv = values(v), dov = values(dout);
  const std::vector<double> ov = values(saved_out ? *saved_out : fwd.out);
  RefGrads g{Tensor::zeros(q.sizes(), DType::kFloat64), Tensor::zeros(k.sizes(), DType::kFloat64),
             Tensor::zeros(v.sizes(), DType::kFloat64)};
  double* dq = g.dq.data<double>();
  double* dk = g.dk.data<double>();
  double* dv = g.dv.data<double>();
  std::vector<double> z(d.S), s_in(d.S);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.Hq; ++h) {
      const int64_t hk = h / d.group;
      for (int64_t i = 0; i < d.L; ++i) {
        const int64_t row = (b * d.Hq + h) * d.L + i;
        const double lse = fwd.lse.data<double>()[row];
        if (std::isinf(lse)) continue;
        detail::row_scores(d, qv, kv, scale, mods, b, h, i, z, s_in);
        const double* doi = dov.data() + row * d.Ev;
        const double* oi = ov.data() + row * d.Ev;
        double D = 0.0;
        for (int64_t e = 0; e < d.Ev; ++e) D += doi[e] * oi[e];
        const double* qi = qv.data() + row * d.E;
        for (int64_t j = 0; j < d.S; ++j) {
          if (z[j] == -std::numeric_limits<double>::infinity()) continue;
          const double p = std::exp(z[j] - lse);
          const int64_t kvrow = (b * d.Hkv + hk) * d.S + j;
          const double* vj = vv.data() + kvrow * d.Ev;
          const double* kj = kv.data() + kvrow * d.E;
          double dp = 0.0;
          for (int64_t e = 0; e < d.Ev; ++e) {
            dp += doi[e] * vj[e];
            dv[kvrow * d.Ev + e] += p * doi[e];
          }
          const double dz = p * (dp - D);
          if (mods.on_dz) mods.on_dz(b, h, i, j, s_in[j], dz);
          const double ds = dz * (mods.dscore ? mods.dscore(s_in[j], b, h, i, j) : 1.0);
          for (int64_t e = 0; e < d.E; ++e) {
            dq[row * d.E + e] += scale * ds * kj[e];
            dk[kvrow * d.E + e] += scale * ds * qi[e];
          }
        }
      }
    }
  }
  return g;
}

/// RAII: runs the library's OpenMP regions on `threads` threads (every region parallel),
/// restoring the previous setting after (common/threads.h).
using OmpThreadsGuard = sdpa::test::ScopedThreads;

/// A float32 [n] tensor from values.
inline Tensor float_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kFloat32);
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = v[i];
  return t;
}

/// An int64 [n] tensor from values.
inline Tensor int_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kInt64);
  for (size_t i = 0; i < v.size(); ++i) t.data<int64_t>()[i] = v[i];
  return t;
}

/// Expects `fn` to throw sdpa::Error whose message contains every string in `needles`.
template <typename F>
::testing::AssertionResult throws_error_containing(F&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const sdpa::Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) {
      if (msg.find(n) == std::string::npos) {
        return ::testing::AssertionFailure() << "message lacks '" << n << "': " << msg;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-sdpa exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace flex_test
