// Evaluation of a flex program over a row of keys kv0 .. kv0 + n - 1 of one
// (b, h, q_idx): the instruction switch runs once per row, each instruction loops over
// the lanes (auto-vectorized for the target; transcendentals through Highway), and
// instructions that do not depend on the key or score run once per row as scalars.
// Per-target code: include after foreach_target.h.

#if defined(SDPA_FLEX_EVAL_ROW_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_FLEX_EVAL_ROW_INL_H_
#undef SDPA_FLEX_EVAL_ROW_INL_H_
#else
#define SDPA_FLEX_EVAL_ROW_INL_H_
#endif

#include <cmath>
#include <cstdint>
#include <limits>

#include "flex/row_buffers.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::flex {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// dst[j] = f(src[j]) for a Highway math function; n padded to the vector width by the
/// caller's buffers (RowBuffers lanes are a multiple of 16).
template <class F>
HWY_INLINE void MapFloat(const float* HWY_RESTRICT src, float* HWY_RESTRICT dst, int64_t n,
                         F f) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t j = 0; j < n; j += lanes) hn::StoreU(f(d, hn::LoadU(d, src + j)), d, dst + j);
}

/// Runs the program for lanes j < n with kv_idx = kv0 + j and, for score_mods,
/// score = scores[j]. Returns the result instruction (read its floats() or ints()).
inline int32_t EvaluateRow(RowBuffers& buf, const float* scores, int64_t b, int64_t h,
                           int64_t q_idx, int64_t kv0, int64_t n) {
  const CompiledProgram& prog = *buf.program;
  const int64_t width = buf.lanes;  // full padded width, so vector loops need no tail
  buf.scalar.run_uniform(b, h, q_idx);
  for (size_t k = 0; k < prog.code.size(); ++k) {
    const Instr& in = prog.code[k];
    const auto id = static_cast<int32_t>(k);
    float* fo = buf.floats(id);
    int64_t* io = buf.ints(id);
    if (in.uniform) {  // broadcast the row-uniform value for varying consumers
      const double v = buf.scalar.value(id);
      if (in.type == ValueType::kFloat) {
        for (int64_t j = 0; j < width; ++j) fo[j] = static_cast<float>(v);
      } else {
        for (int64_t j = 0; j < width; ++j) io[j] = static_cast<int64_t>(v);
      }
      continue;
    }
    const bool is_float = in.type == ValueType::kFloat;
    auto fa = [&](int a) { return buf.floats(in.args[a]); };
    auto ia = [&](int a) { return buf.ints(in.args[a]); };
    // Operands of comparisons / where / min / max may be float or int.
    const bool float_args = !in.args.empty() &&
                            prog.code[in.args.back()].type == ValueType::kFloat;
    switch (in.op) {
      case Op::kScore:
        for (int64_t j = 0; j < width; ++j) fo[j] = j < n ? scores[j] : 0.0f;
        break;
      case Op::kKvIdx:
        for (int64_t j = 0; j < width; ++j) io[j] = kv0 + j;
        break;
      case Op::kRead: {
        const Captured& c = (*buf.captured)[in.slot];
        const Tensor& t = c.tensor();
        for (int64_t j = 0; j < n; ++j) {
          int64_t index[8];
          for (size_t d = 0; d < in.args.size(); ++d) {
            index[d] = buf.ints(in.args[d])[j];
            if (index[d] < 0 || index[d] >= t.size(static_cast<int64_t>(d))) {
              throw_out_of_range(c, static_cast<int64_t>(d), index[d], b, h, q_idx, kv0 + j);
            }
          }
          const double v = read_captured(c, index);
          if (is_float) {
            fo[j] = static_cast<float>(v);
          } else {
            io[j] = static_cast<int64_t>(v);
          }
        }
        for (int64_t j = n; j < width; ++j) {
          fo[j] = 0.0f;
          io[j] = 0;
        }
        break;
      }
#define SDPA_FLEX_BINARY(OP, EXPR)                                                \
  case OP:                                                                        \
    if (is_float) {                                                               \
      const float* x = fa(0);                                                     \
      const float* y = fa(1);                                                     \
      for (int64_t j = 0; j < width; ++j) fo[j] = EXPR;                           \
    } else {                                                                      \
      const int64_t* x = ia(0);                                                   \
      const int64_t* y = ia(1);                                                   \
      for (int64_t j = 0; j < width; ++j) io[j] = EXPR;                           \
    }                                                                             \
    break;
      SDPA_FLEX_BINARY(Op::kAdd, x[j] + y[j])
      SDPA_FLEX_BINARY(Op::kSub, x[j] - y[j])
      SDPA_FLEX_BINARY(Op::kMul, x[j] * y[j])
      SDPA_FLEX_BINARY(Op::kMin, x[j] < y[j] ? x[j] : y[j])
      SDPA_FLEX_BINARY(Op::kMax, x[j] > y[j] ? x[j] : y[j])
#undef SDPA_FLEX_BINARY
      case Op::kDiv: {
        const float* x = fa(0);
        const float* y = fa(1);
        for (int64_t j = 0; j < width; ++j) fo[j] = x[j] / y[j];
        break;
      }
      case Op::kMod: {
        const int64_t* x = ia(0);
        const int64_t* y = ia(1);
        for (int64_t j = 0; j < n; ++j) io[j] = floor_mod_int(x[j], y[j]);
        break;
      }
      case Op::kFloorDiv: {
        const int64_t* x = ia(0);
        const int64_t* y = ia(1);
        for (int64_t j = 0; j < n; ++j) io[j] = floor_div_int(x[j], y[j]);
        break;
      }
      case Op::kNeg:
        if (is_float) {
          for (int64_t j = 0; j < width; ++j) fo[j] = -fa(0)[j];
        } else {
          for (int64_t j = 0; j < width; ++j) io[j] = -ia(0)[j];
        }
        break;
      case Op::kAbs:
        if (is_float) {
          for (int64_t j = 0; j < width; ++j) fo[j] = std::fabs(fa(0)[j]);
        } else {
          for (int64_t j = 0; j < width; ++j) io[j] = ia(0)[j] < 0 ? -ia(0)[j] : ia(0)[j];
        }
        break;
      case Op::kExp:
        MapFloat(fa(0), fo, width, [](auto d, auto v) { return hn::Exp(d, v); });
        break;
      case Op::kLog:
        MapFloat(fa(0), fo, width, [](auto d, auto v) { return hn::Log(d, v); });
        break;
      case Op::kTanh:
        MapFloat(fa(0), fo, width, [](auto d, auto v) { return hn::Tanh(d, v); });
        break;
      case Op::kSigmoid:
        MapFloat(fa(0), fo, width, [](auto d, auto v) {
          const auto one = hn::Set(d, 1.0f);
          return hn::Div(one, hn::Add(one, hn::Exp(d, hn::Neg(v))));
        });
        break;
      case Op::kSqrt:
        MapFloat(fa(0), fo, width, [](auto, auto v) { return hn::Sqrt(v); });
        break;
      case Op::kToFloat:
        for (int64_t j = 0; j < width; ++j) fo[j] = static_cast<float>(ia(0)[j]);
        break;
#define SDPA_FLEX_COMPARE(OP, CMP)                                                 \
  case OP:                                                                         \
    if (float_args) {                                                              \
      const float* x = fa(0);                                                      \
      const float* y = fa(1);                                                      \
      for (int64_t j = 0; j < width; ++j) io[j] = x[j] CMP y[j];                   \
    } else {                                                                       \
      const int64_t* x = ia(0);                                                    \
      const int64_t* y = ia(1);                                                    \
      for (int64_t j = 0; j < width; ++j) io[j] = x[j] CMP y[j];                   \
    }                                                                              \
    break;
      SDPA_FLEX_COMPARE(Op::kLt, <)
      SDPA_FLEX_COMPARE(Op::kLe, <=)
      SDPA_FLEX_COMPARE(Op::kGt, >)
      SDPA_FLEX_COMPARE(Op::kGe, >=)
      SDPA_FLEX_COMPARE(Op::kEq, ==)
      SDPA_FLEX_COMPARE(Op::kNe, !=)
#undef SDPA_FLEX_COMPARE
      case Op::kAnd:
        for (int64_t j = 0; j < width; ++j) io[j] = ia(0)[j] & ia(1)[j];
        break;
      case Op::kOr:
        for (int64_t j = 0; j < width; ++j) io[j] = ia(0)[j] | ia(1)[j];
        break;
      case Op::kNot:
        for (int64_t j = 0; j < width; ++j) io[j] = ia(0)[j] ^ 1;
        break;
      case Op::kWhere: {
        const int64_t* c = ia(0);
        if (is_float) {
          for (int64_t j = 0; j < width; ++j) fo[j] = c[j] ? fa(1)[j] : fa(2)[j];
        } else {
          for (int64_t j = 0; j < width; ++j) io[j] = c[j] ? ia(1)[j] : ia(2)[j];
        }
        break;
      }
      case Op::kBatch:
      case Op::kHead:
      case Op::kQIdx:
      case Op::kConst:
        break;  // always uniform
    }
  }
  return prog.result;
}

/// Replaces s[j] (j < n) by score_mod(s[j]) for keys kv0 + j of row (b, h, q_idx).
inline void ApplyScoreMod(RowBuffers& buf, float* s, int64_t b, int64_t h, int64_t q_idx,
                          int64_t kv0, int64_t n) {
  const int32_t r = EvaluateRow(buf, s, b, h, q_idx, kv0, n);
  if (buf.program->code[r].uniform) {
    const float v = static_cast<float>(buf.scalar.value(r));
    for (int64_t j = 0; j < n; ++j) s[j] = v;
    return;
  }
  const float* out = buf.floats(r);
  for (int64_t j = 0; j < n; ++j) s[j] = out[j];
}

/// Sets s[j] = -inf where mask_mod is false, for keys kv0 + j (j < n).
inline void ApplyMaskMod(RowBuffers& buf, float* s, int64_t b, int64_t h, int64_t q_idx,
                         int64_t kv0, int64_t n) {
  const int32_t r = EvaluateRow(buf, s, b, h, q_idx, kv0, n);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (buf.program->code[r].uniform) {
    if (buf.scalar.value(r) == 0.0) {
      for (int64_t j = 0; j < n; ++j) s[j] = kNegInf;
    }
    return;
  }
  const int64_t* keep = buf.ints(r);
  for (int64_t j = 0; j < n; ++j) s[j] = keep[j] ? s[j] : kNegInf;
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::flex
HWY_AFTER_NAMESPACE();

#endif  // SDPA_FLEX_EVAL_ROW_INL_H_
