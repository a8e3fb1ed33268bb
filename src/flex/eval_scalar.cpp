#include "flex/eval_scalar.h"

#include <cmath>
#include <limits>

#include "core/element_access.h"
#include "sdpa/error.h"

namespace sdpa::flex {

double read_captured(const Captured& c, const int64_t* index) {
  const Tensor& t = c.tensor();
  int64_t off = 0;
  for (int64_t d = 0; d < t.dim(); ++d) off += index[d] * t.stride(d);
  return detail::load_element(t.data_ptr(), t.dtype(), off);
}

void throw_out_of_range(const Captured& c, int64_t dim, int64_t index, const ModIndex& at) {
  detail::throw_error("flex: captured tensor '", c.name(), "' ", shape_str(c.tensor().sizes()),
                      ": index ", index, " out of range for dimension ", dim, " (size ",
                      c.tensor().size(dim), ") at b=", at.b, ", h=", at.h, ", q_idx=", at.q_idx,
                      ", kv_idx=", at.kv_idx);
}

// Truncation to int64 as x86's cvttsd2si (what FLASH's row evaluator computes): NaN and
// values outside int64's range give INT64_MIN instead of undefined behaviour.
int64_t double_to_int64(double x) {
  if (!(x >= -0x1p63 && x < 0x1p63)) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(x);
}

int64_t floor_div_int(int64_t a, int64_t b) {
  SDPA_CHECK(b != 0, "flex: integer division by zero");
  // INT64_MIN / -1 traps (SIGFPE) on x86; it wraps to INT64_MIN, as in numpy and torch.
  if (b == -1) return a == std::numeric_limits<int64_t>::min() ? a : -a;
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod_int(int64_t a, int64_t b) {
  if (b == -1) return 0;  // without the quotient's wrap (floor_div_int) in the product
  // a - q * b lies in (-|b|, |b|) but q * b may not fit: wrapping arithmetic gives it.
  const uint64_t product = static_cast<uint64_t>(floor_div_int(a, b)) * static_cast<uint64_t>(b);
  return static_cast<int64_t>(static_cast<uint64_t>(a) - product);
}

double ScalarEvaluator::step(const Instr& in, double score, const ModIndex& at) const {
  auto arg = [&](int k) { return values_[in.args[k]]; };
  auto as_int = [&](int k) { return double_to_int64(values_[in.args[k]]); };
  switch (in.op) {
    case Op::kScore: return score;
    case Op::kBatch: return static_cast<double>(at.b);
    case Op::kHead: return static_cast<double>(at.h);
    case Op::kQIdx: return static_cast<double>(at.q_idx);
    case Op::kKvIdx: return static_cast<double>(at.kv_idx);
    case Op::kConst: return in.constant;
    case Op::kRead: {
      const Captured& c = captured_[in.slot];
      int64_t index[8];
      for (size_t d = 0; d < in.args.size(); ++d) {
        index[d] = as_int(static_cast<int>(d));
        if (index[d] < 0 || index[d] >= c.tensor().size(static_cast<int64_t>(d))) {
          throw_out_of_range(c, static_cast<int64_t>(d), index[d], at);
        }
      }
      return read_captured(c, index);
    }
    case Op::kAdd: return arg(0) + arg(1);
    case Op::kSub: return arg(0) - arg(1);
    case Op::kMul: return arg(0) * arg(1);
    case Op::kDiv: return arg(0) / arg(1);
    case Op::kMod: return static_cast<double>(floor_mod_int(as_int(0), as_int(1)));
    case Op::kFloorDiv: return static_cast<double>(floor_div_int(as_int(0), as_int(1)));
    case Op::kNeg: return -arg(0);
    case Op::kMin: return std::fmin(arg(0), arg(1));
    case Op::kMax: return std::fmax(arg(0), arg(1));
    case Op::kAbs: return std::fabs(arg(0));
    case Op::kExp: return std::exp(arg(0));
    case Op::kLog: return std::log(arg(0));
    case Op::kTanh: return std::tanh(arg(0));
    case Op::kSigmoid: return 1.0 / (1.0 + std::exp(-arg(0)));
    case Op::kSqrt: return std::sqrt(arg(0));
    case Op::kToFloat: return arg(0);
    case Op::kFloor: return std::floor(arg(0));
    case Op::kCeil: return std::ceil(arg(0));
    case Op::kSin: return std::sin(arg(0));
    case Op::kCos: return std::cos(arg(0));
    case Op::kBitAnd: return static_cast<double>(as_int(0) & as_int(1));
    case Op::kBitOr: return static_cast<double>(as_int(0) | as_int(1));
    case Op::kBitXor: return static_cast<double>(as_int(0) ^ as_int(1));
    case Op::kBitNot: return static_cast<double>(~as_int(0));
    case Op::kShl: return static_cast<double>(shift_left_int(as_int(0), as_int(1)));
    case Op::kShr: return static_cast<double>(shift_right_int(as_int(0), as_int(1)));
    case Op::kLt: return arg(0) < arg(1) ? 1.0 : 0.0;
    case Op::kLe: return arg(0) <= arg(1) ? 1.0 : 0.0;
    case Op::kGt: return arg(0) > arg(1) ? 1.0 : 0.0;
    case Op::kGe: return arg(0) >= arg(1) ? 1.0 : 0.0;
    case Op::kEq: return arg(0) == arg(1) ? 1.0 : 0.0;
    case Op::kNe: return arg(0) != arg(1) ? 1.0 : 0.0;
    case Op::kAnd: return arg(0) != 0.0 && arg(1) != 0.0 ? 1.0 : 0.0;
    case Op::kOr: return arg(0) != 0.0 || arg(1) != 0.0 ? 1.0 : 0.0;
    case Op::kNot: return arg(0) != 0.0 ? 0.0 : 1.0;
    case Op::kWhere: return arg(0) != 0.0 ? arg(1) : arg(2);
  }
  return 0.0;
}

double ScalarEvaluator::run(double score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx) {
  const auto& code = program_.code;
  const ModIndex at{b, h, q_idx, kv_idx};
  for (size_t i = 0; i < code.size(); ++i) values_[i] = step(code[i], score, at);
  return values_[program_.result];
}

void ScalarEvaluator::run_uniform(int64_t b, int64_t h, int64_t q_idx) {
  const auto& code = program_.code;
  const ModIndex at{b, h, q_idx, 0};
  for (size_t i = 0; i < code.size(); ++i) {
    if (code[i].uniform) values_[i] = step(code[i], 0.0, at);
  }
}

}  // namespace sdpa::flex
