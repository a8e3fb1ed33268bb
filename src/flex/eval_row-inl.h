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

#include <algorithm>
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

/// An operand of a per-key instruction: its lanes, or one row-uniform value (no
/// broadcast buffer is written; the compiler unswitches the loop on `uniform`).
template <typename T>
struct Operand {
  const T* lanes;
  T value;
  bool uniform;
  T operator[](int64_t j) const { return uniform ? value : lanes[j]; }
};

/// out[j] = f(x[j], y[j]) with the uniform cases split into their own loops, so every
/// loop vectorizes (a select on `uniform` inside the loop would not).
template <typename T, typename R, typename F>
HWY_INLINE void Binary(const Operand<T>& x, const Operand<T>& y, R* HWY_RESTRICT out,
                       int64_t width, F f) {
  if (x.uniform) {
    for (int64_t j = 0; j < width; ++j) out[j] = f(x.value, y.lanes[j]);
  } else if (y.uniform) {
    for (int64_t j = 0; j < width; ++j) out[j] = f(x.lanes[j], y.value);
  } else {
    for (int64_t j = 0; j < width; ++j) out[j] = f(x.lanes[j], y.lanes[j]);
  }
}

/// Runs the program for lanes j < n with kv_idx = kv0 + j and, for score_mods,
/// score = scores[j]. Per-key instructions write their lanes (floats() or ints());
/// row-uniform ones are evaluated once as scalars (buf.scalar.value()). Returns the
/// result instruction.
inline int32_t EvaluateRow(RowBuffers& buf, const float* scores, int64_t b, int64_t h,
                           int64_t q_idx, int64_t kv0, int64_t n) {
  const CompiledProgram& prog = *buf.program;
  const int64_t width = buf.lanes;  // full padded width, so vector loops need no tail
  buf.scalar.run_uniform(b, h, q_idx);
  auto fop = [&](int32_t id) {
    const bool u = prog.code[id].uniform;
    return Operand<float>{buf.floats(id), u ? static_cast<float>(buf.scalar.value(id)) : 0.0f, u};
  };
  auto iop = [&](int32_t id) {
    const bool u = prog.code[id].uniform;
    return Operand<int64_t>{buf.ints(id), u ? static_cast<int64_t>(buf.scalar.value(id)) : 0, u};
  };
  for (size_t k = 0; k < prog.code.size(); ++k) {
    const Instr& in = prog.code[k];
    if (in.uniform) continue;
    const auto id = static_cast<int32_t>(k);
    float* fo = buf.floats(id);
    int64_t* io = buf.ints(id);
    const bool is_float = in.type == ValueType::kFloat;
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
        const int64_t dims = static_cast<int64_t>(in.args.size());
        for (int64_t j = 0; j < n; ++j) {
          int64_t index[8];
          for (int64_t d = 0; d < dims; ++d) {
            index[d] = iop(in.args[d])[j];
            if (index[d] < 0 || index[d] >= t.size(d)) {
              throw_out_of_range(c, d, index[d], b, h, q_idx, kv0 + j);
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
#define SDPA_FLEX_BINARY(OP, EXPR)                                                        \
  case OP:                                                                                \
    if (is_float) {                                                                       \
      Binary(fop(in.args[0]), fop(in.args[1]), fo, width, [](float a, float b) { return EXPR; }); \
    } else {                                                                              \
      Binary(iop(in.args[0]), iop(in.args[1]), io, width,                                 \
             [](int64_t a, int64_t b) { return EXPR; });                                  \
    }                                                                                     \
    break;
      SDPA_FLEX_BINARY(Op::kAdd, a + b)
      SDPA_FLEX_BINARY(Op::kSub, a - b)
      SDPA_FLEX_BINARY(Op::kMul, a * b)
      SDPA_FLEX_BINARY(Op::kMin, a < b ? a : b)
      SDPA_FLEX_BINARY(Op::kMax, a > b ? a : b)
#undef SDPA_FLEX_BINARY
      case Op::kDiv:
        Binary(fop(in.args[0]), fop(in.args[1]), fo, width, [](float a, float b) { return a / b; });
        break;
      case Op::kMod: {
        const auto x = iop(in.args[0]);
        const auto y = iop(in.args[1]);
        for (int64_t j = 0; j < n; ++j) io[j] = floor_mod_int(x[j], y[j]);
        break;
      }
      case Op::kFloorDiv: {
        const auto x = iop(in.args[0]);
        const auto y = iop(in.args[1]);
        for (int64_t j = 0; j < n; ++j) io[j] = floor_div_int(x[j], y[j]);
        break;
      }
      case Op::kNeg:
        if (is_float) {
          const float* x = buf.floats(in.args[0]);
          for (int64_t j = 0; j < width; ++j) fo[j] = -x[j];
        } else {
          const int64_t* x = buf.ints(in.args[0]);
          for (int64_t j = 0; j < width; ++j) io[j] = -x[j];
        }
        break;
      case Op::kAbs:
        if (is_float) {
          const float* x = buf.floats(in.args[0]);
          for (int64_t j = 0; j < width; ++j) fo[j] = std::fabs(x[j]);
        } else {
          const int64_t* x = buf.ints(in.args[0]);
          for (int64_t j = 0; j < width; ++j) io[j] = x[j] < 0 ? -x[j] : x[j];
        }
        break;
      case Op::kExp:
        MapFloat(buf.floats(in.args[0]), fo, width, [](auto d, auto v) { return hn::Exp(d, v); });
        break;
      case Op::kLog:
        MapFloat(buf.floats(in.args[0]), fo, width, [](auto d, auto v) { return hn::Log(d, v); });
        break;
      case Op::kTanh:
        MapFloat(buf.floats(in.args[0]), fo, width, [](auto d, auto v) { return hn::Tanh(d, v); });
        break;
      case Op::kSigmoid:
        MapFloat(buf.floats(in.args[0]), fo, width, [](auto d, auto v) {
          const auto one = hn::Set(d, 1.0f);
          return hn::Div(one, hn::Add(one, hn::Exp(d, hn::Neg(v))));
        });
        break;
      case Op::kSqrt:
        MapFloat(buf.floats(in.args[0]), fo, width, [](auto, auto v) { return hn::Sqrt(v); });
        break;
      case Op::kToFloat: {
        const int64_t* x = buf.ints(in.args[0]);
        for (int64_t j = 0; j < width; ++j) fo[j] = static_cast<float>(x[j]);
        break;
      }
#define SDPA_FLEX_COMPARE(OP, CMP)                                                       \
  case OP:                                                                               \
    if (float_args) {                                                                    \
      Binary(fop(in.args[0]), fop(in.args[1]), io, width,                                \
             [](float a, float b) { return static_cast<int64_t>(a CMP b); });            \
    } else {                                                                             \
      Binary(iop(in.args[0]), iop(in.args[1]), io, width,                                \
             [](int64_t a, int64_t b) { return static_cast<int64_t>(a CMP b); });        \
    }                                                                                    \
    break;
      SDPA_FLEX_COMPARE(Op::kLt, <)
      SDPA_FLEX_COMPARE(Op::kLe, <=)
      SDPA_FLEX_COMPARE(Op::kGt, >)
      SDPA_FLEX_COMPARE(Op::kGe, >=)
      SDPA_FLEX_COMPARE(Op::kEq, ==)
      SDPA_FLEX_COMPARE(Op::kNe, !=)
#undef SDPA_FLEX_COMPARE
      case Op::kAnd:
        Binary(iop(in.args[0]), iop(in.args[1]), io, width, [](int64_t a, int64_t b) { return a & b; });
        break;
      case Op::kOr:
        Binary(iop(in.args[0]), iop(in.args[1]), io, width, [](int64_t a, int64_t b) { return a | b; });
        break;
      case Op::kNot: {
        const int64_t* x = buf.ints(in.args[0]);
        for (int64_t j = 0; j < width; ++j) io[j] = x[j] ^ 1;
        break;
      }
      case Op::kWhere: {
        const auto c = iop(in.args[0]);
        if (is_float) {
          const auto x = fop(in.args[1]);
          const auto y = fop(in.args[2]);
          for (int64_t j = 0; j < width; ++j) fo[j] = c[j] ? x[j] : y[j];
        } else {
          const auto x = iop(in.args[1]);
          const auto y = iop(in.args[2]);
          for (int64_t j = 0; j < width; ++j) io[j] = c[j] ? x[j] : y[j];
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

/// Makes instruction `id`'s lanes valid after EvaluateRow (row-uniform instructions keep
/// only a scalar until asked).
inline void MaterializeLanes(RowBuffers& buf, int32_t id) {
  const Instr& in = buf.program->code[id];
  if (!in.uniform) return;
  const double v = buf.scalar.value(id);
  if (in.type == ValueType::kFloat) {
    std::fill(buf.floats(id), buf.floats(id) + buf.lanes, static_cast<float>(v));
  } else {
    std::fill(buf.ints(id), buf.ints(id) + buf.lanes, static_cast<int64_t>(v));
  }
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
