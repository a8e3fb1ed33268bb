#include "flex/interval.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/element_access.h"
#include "flex/eval_scalar.h"

namespace sdpa::flex {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr Interval kAll{-kInf, kInf};
constexpr Interval kUnknownBool{0.0, 1.0};
Interval point(double v) { return {v, v}; }

Interval hull(std::initializer_list<double> values) {
  double lo = kInf, hi = -kInf;
  for (double v : values) {
    if (std::isnan(v)) return kAll;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return {lo, hi};
}

Interval from_bool(bool surely_true, bool surely_false) {
  if (surely_true) return point(1.0);
  if (surely_false) return point(0.0);
  return kUnknownBool;
}

// Margin for deciding float comparisons: float32 rounding in the kernels stays inside it.
double margin(const Interval& a, const Interval& b, bool is_float) {
  if (!is_float) return 0.0;
  const double scale = std::max({std::fabs(a.lo), std::fabs(a.hi), std::fabs(b.lo),
                                 std::fabs(b.hi), 1.0});
  return scale * 1e-5;
}

Interval monotone(double (*f)(double), const Interval& a) { return hull({f(a.lo), f(a.hi)}); }

// Value range of captured tensor `c` over the index box `box`, or kAll when the box can
// leave the tensor (the elementwise evaluation will then report the bad index) or holds
// more than `max_scan` elements.
Interval read_range(const Captured& c, const std::vector<Interval>& box, int64_t max_scan) {
  const Tensor& t = c.tensor();
  // A device tensor's values are not read from the host: unbounded.
  if (t.device().type != DeviceType::kCPU) return kAll;
  int64_t count = 1;
  std::vector<int64_t> lo(box.size()), hi(box.size());
  for (size_t d = 0; d < box.size(); ++d) {
    if (!std::isfinite(box[d].lo) || !std::isfinite(box[d].hi)) return kAll;
    lo[d] = static_cast<int64_t>(box[d].lo);
    hi[d] = static_cast<int64_t>(box[d].hi);
    if (lo[d] < 0 || hi[d] >= t.size(static_cast<int64_t>(d))) return kAll;
    count *= hi[d] - lo[d] + 1;
    if (count > max_scan) return kAll;
  }
  // The element offset follows the index as it advances (create_block_mask scans regions
  // of several blocks).
  std::vector<int64_t> index = lo, stride(box.size());
  int64_t offset = 0;
  for (size_t d = 0; d < box.size(); ++d) {
    stride[d] = t.stride(static_cast<int64_t>(d));
    offset += lo[d] * stride[d];
  }
  const void* data = t.data_ptr();
  const DType dtype = t.dtype();
  double vmin = kInf, vmax = -kInf;
  for (int64_t n = 0; n < count; ++n) {
    const double v = detail::load_element(data, dtype, offset);
    if (std::isnan(v)) return kAll;
    vmin = std::min(vmin, v);
    vmax = std::max(vmax, v);
    for (size_t d = box.size(); d-- > 0;) {
      if (++index[d] <= hi[d]) {
        offset += stride[d];
        break;
      }
      offset -= (hi[d] - lo[d]) * stride[d];
      index[d] = lo[d];
    }
  }
  return {vmin, vmax};
}

}  // namespace

BlockVerdict classify_block(const CompiledProgram& program, const std::vector<Captured>& captured,
                            const IndexBlock& block, bool* reads_in_bounds, int64_t max_scan) {
  std::vector<Interval> v(program.code.size());
  bool in_bounds = true;
  for (size_t k = 0; k < program.code.size(); ++k) {
    const Instr& in = program.code[k];
    auto A = [&](int i) { return v[in.args[i]]; };
    const bool float_args = !in.args.empty() &&
                            program.code[in.args.back()].type == ValueType::kFloat;
    Interval r = kAll;
    switch (in.op) {
      case Op::kScore: r = kAll; break;
      case Op::kBatch: r = point(static_cast<double>(block.b)); break;
      case Op::kHead: r = point(static_cast<double>(block.h)); break;
      case Op::kQIdx: r = {static_cast<double>(block.q_lo), static_cast<double>(block.q_hi)}; break;
      case Op::kKvIdx:
        r = {static_cast<double>(block.kv_lo), static_cast<double>(block.kv_hi)};
        break;
      case Op::kConst: r = point(in.constant); break;
      case Op::kRead: {
        std::vector<Interval> box;
        for (size_t d = 0; d < in.args.size(); ++d) box.push_back(A(static_cast<int>(d)));
        const Tensor& t = captured[in.slot].tensor();
        for (size_t d = 0; d < box.size(); ++d) {
          in_bounds = in_bounds && box[d].lo >= 0.0 &&
                      box[d].hi < static_cast<double>(t.size(static_cast<int64_t>(d)));
        }
        r = read_range(captured[in.slot], box, max_scan);
        break;
      }
      case Op::kAdd: r = hull({A(0).lo + A(1).lo, A(0).hi + A(1).hi}); break;
      case Op::kSub: r = hull({A(0).lo - A(1).hi, A(0).hi - A(1).lo}); break;
      case Op::kMul:
        r = hull({A(0).lo * A(1).lo, A(0).lo * A(1).hi, A(0).hi * A(1).lo, A(0).hi * A(1).hi});
        break;
      case Op::kDiv:
        if (A(1).lo > 0 || A(1).hi < 0) {
          r = hull({A(0).lo / A(1).lo, A(0).lo / A(1).hi, A(0).hi / A(1).lo, A(0).hi / A(1).hi});
        }
        break;
      case Op::kFloorDiv:
        if (A(1).lo == A(1).hi && A(1).lo > 0 && std::isfinite(A(0).lo) &&
            std::isfinite(A(0).hi)) {
          r = {std::floor(A(0).lo / A(1).lo), std::floor(A(0).hi / A(1).lo)};
        }
        break;
      case Op::kMod:
        if (A(1).lo == A(1).hi && A(1).lo > 0) {
          const double m = A(1).lo;
          if (std::isfinite(A(0).lo) && std::isfinite(A(0).hi) &&
              std::floor(A(0).lo / m) == std::floor(A(0).hi / m)) {
            r = {A(0).lo - std::floor(A(0).lo / m) * m, A(0).hi - std::floor(A(0).hi / m) * m};
          } else {
            r = {0.0, m - 1.0};
          }
        }
        break;
      case Op::kNeg: r = {-A(0).hi, -A(0).lo}; break;
      case Op::kMin: r = {std::min(A(0).lo, A(1).lo), std::min(A(0).hi, A(1).hi)}; break;
      case Op::kMax: r = {std::max(A(0).lo, A(1).lo), std::max(A(0).hi, A(1).hi)}; break;
      case Op::kAbs:
        if (A(0).lo >= 0) {
          r = A(0);
        } else if (A(0).hi <= 0) {
          r = {-A(0).hi, -A(0).lo};
        } else {
          r = {0.0, std::max(-A(0).lo, A(0).hi)};
        }
        break;
      case Op::kExp: r = monotone([](double x) { return std::exp(x); }, A(0)); break;
      case Op::kLog:
        if (A(0).lo > 0) r = monotone([](double x) { return std::log(x); }, A(0));
        break;
      case Op::kTanh: r = monotone([](double x) { return std::tanh(x); }, A(0)); break;
      case Op::kSigmoid:
        r = monotone([](double x) { return 1.0 / (1.0 + std::exp(-x)); }, A(0));
        break;
      case Op::kSqrt:
        if (A(0).lo >= 0) r = monotone([](double x) { return std::sqrt(x); }, A(0));
        break;
      case Op::kToFloat: r = A(0); break;
      case Op::kFloor: r = monotone([](double x) { return std::floor(x); }, A(0)); break;
      case Op::kCeil: r = monotone([](double x) { return std::ceil(x); }, A(0)); break;
      case Op::kSin:
      case Op::kCos:
        if (std::isfinite(A(0).lo) && std::isfinite(A(0).hi)) r = {-1.0, 1.0};
        break;
      case Op::kBitAnd:  // non-negative operands: the result is at most either
        if (A(0).lo >= 0 && A(1).lo >= 0) r = {0.0, std::min(A(0).hi, A(1).hi)};
        break;
      case Op::kBitNot: r = {-A(0).hi - 1.0, -A(0).lo - 1.0}; break;
      case Op::kBitOr:
      case Op::kBitXor:
      case Op::kShl:
      case Op::kShr:
        break;
      case Op::kLt: {
        const double e = margin(A(0), A(1), float_args);
        r = from_bool(A(0).hi + e < A(1).lo, A(0).lo >= A(1).hi + e);
        break;
      }
      case Op::kLe: {
        const double e = margin(A(0), A(1), float_args);
        r = from_bool(A(0).hi + e <= A(1).lo, A(0).lo > A(1).hi + e);
        break;
      }
      case Op::kGt: {
        const double e = margin(A(0), A(1), float_args);
        r = from_bool(A(0).lo > A(1).hi + e, A(0).hi + e <= A(1).lo);
        break;
      }
      case Op::kGe: {
        const double e = margin(A(0), A(1), float_args);
        r = from_bool(A(0).lo >= A(1).hi + e, A(0).hi + e < A(1).lo);
        break;
      }
      case Op::kEq:
      case Op::kNe: {
        const double e = margin(A(0), A(1), float_args);
        const bool equal = !float_args && A(0).lo == A(0).hi && A(1).lo == A(1).hi &&
                           A(0).lo == A(1).lo;
        const bool disjoint = A(0).hi + e < A(1).lo || A(1).hi + e < A(0).lo;
        r = in.op == Op::kEq ? from_bool(equal, disjoint) : from_bool(disjoint, equal);
        break;
      }
      case Op::kAnd:
        r = from_bool(A(0).lo == 1.0 && A(1).lo == 1.0, A(0).hi == 0.0 || A(1).hi == 0.0);
        break;
      case Op::kOr:
        r = from_bool(A(0).lo == 1.0 || A(1).lo == 1.0, A(0).hi == 0.0 && A(1).hi == 0.0);
        break;
      case Op::kNot: r = {1.0 - A(0).hi, 1.0 - A(0).lo}; break;
      case Op::kWhere:
        if (A(0).lo == 1.0) {
          r = A(1);
        } else if (A(0).hi == 0.0) {
          r = A(2);
        } else {
          r = {std::min(A(1).lo, A(2).lo), std::max(A(1).hi, A(2).hi)};
        }
        break;
    }
    if (in.type == ValueType::kBool && !(r.lo >= 0.0 && r.hi <= 1.0)) r = kUnknownBool;
    v[k] = r;
  }
  if (reads_in_bounds) *reads_in_bounds = in_bounds;
  const Interval out = v[program.result];
  if (out.lo == 1.0) return BlockVerdict::kFull;
  if (out.hi == 0.0) return BlockVerdict::kEmpty;
  return BlockVerdict::kUnknown;
}

}  // namespace sdpa::flex
