// The instruction evaluator of flex programs in the FLASH kernels (row_buffers.h): one
// instruction over one pass (a shape's extent of a chunk, or score rows), with the
// instruction switch outside the lane loops. Lane loops are auto-vectorized for the target;
// transcendentals are in eval_math-inl.h. The chunk scheduling that runs it is in
// eval_row-inl.h. Per-target code: include after foreach_target.h.

#if defined(SDPA_FLEX_EVAL_INSTR_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_FLEX_EVAL_INSTR_INL_H_
#undef SDPA_FLEX_EVAL_INSTR_INL_H_
#else
#define SDPA_FLEX_EVAL_INSTR_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/element_access.h"
#include "core/kernel_inline.h"
#include "flex/eval_math-inl.h"
#include "flex/row_buffers.h"
#include "hwy/highway.h"
#include "sdpa/error.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::flex {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// An operand as one evaluation sees it: element (r, j) is base[r * row_stride + j] when
/// `lanes`, else base[r * row_stride] (one value per row: scalar and per-row operands).
template <typename T>
struct View {
  const T* base;
  int64_t row_stride;
  bool lanes;
};

/// One evaluation: `rows` rows of lanes [lo, hi) (per row [row_lo[r], row_hi[r]) when
/// given), writing out + r * out_stride. `shape` is the shape being evaluated. A kScore
/// evaluation covers chunk rows row, row + 1, ...; their score lanes are
/// scores + r * score_stride.
struct Pass {
  Shape shape;
  int64_t rows, lo, hi, out_stride;
  int64_t row;
  const float* scores;
  int64_t score_stride = 0;
  const int64_t* row_lo = nullptr;
  const int64_t* row_hi = nullptr;

  int64_t lo_of(int64_t r) const { return row_lo ? row_lo[r] : lo; }
  int64_t hi_of(int64_t r) const { return row_hi ? row_hi[r] : hi; }
};

template <typename T>
SDPA_INLINE const T* Values(RowBuffers& buf, int32_t id);
template <>
SDPA_INLINE const float* Values<float>(RowBuffers& buf, int32_t id) {
  return buf.fvals(id);
}
template <>
SDPA_INLINE const int64_t* Values<int64_t>(RowBuffers& buf, int32_t id) {
  return buf.ivals(id);
}

/// How instruction `id` (of any shape up to the pass's) reads in `pass`.
template <typename T>
SDPA_INLINE View<T> ViewOf(RowBuffers& buf, int32_t id, const Pass& pass) {
  const Shape s = buf.shape[id];
  const T* base = Values<T>(buf, id);
  if constexpr (std::is_same_v<T, float>) {
    if (buf.program->code[id].op == Op::kScore) return {pass.scores, pass.score_stride, true};
  }
  const int64_t chunk_last_row = buf.chunk_rows - 1;
  switch (pass.shape) {
    case Shape::kFull:
      if (s == Shape::kRow) return {base, 1, false};
      if (s == Shape::kFull) return {base, buf.lanes, true};
      if (s == Shape::kDiag)
        return {base + chunk_last_row, -1, true};  // (r, j): j - r + chunk_last_row
      return {base, 0, s == Shape::kCol};
    case Shape::kScore:  // score-shaped values are stored from the pass's first row
      if (s == Shape::kRow) return {base + pass.row, 1, false};
      if (s == Shape::kFull) return {base + pass.row * buf.lanes, buf.lanes, true};
      if (s == Shape::kDiag) return {base + chunk_last_row - pass.row, -1, true};
      if (s == Shape::kScore) return {base, buf.lanes, true};
      return {base, 0, s != Shape::kScalar};
    case Shape::kDiag:
      // Diagonal u is read at row chunk_last_row, key lane u: a q_idx + c operand is its last
      // row's value, a kv_idx + c operand its lane u (key lanes extend to diagonals()).
      if (s == Shape::kRow) return {base + chunk_last_row, 0, false};
      return {base, 0, s != Shape::kScalar};
    default:  // scalar, row and column passes: operands are scalar or of the pass's shape
      return {base, 0, s != Shape::kScalar};
  }
}

/// out(r, j) = f(x(r, j), y(r, j)), with the uniform operands split into their own loops
/// so every loop vectorizes (a select on `lanes` inside the loop would not).
template <typename T, typename R, typename F>
SDPA_INLINE void Map2(const View<T>& x, const View<T>& y, R* HWY_RESTRICT out, const Pass& p, F f) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* HWY_RESTRICT xp = x.base + r * x.row_stride;
    const T* HWY_RESTRICT yp = y.base + r * y.row_stride;
    R* HWY_RESTRICT o = out + r * p.out_stride;
    const int64_t lo = p.lo_of(r), hi = p.hi_of(r);
    if (x.lanes && y.lanes) {
      for (int64_t j = lo; j < hi; ++j) o[j] = f(xp[j], yp[j]);
    } else if (x.lanes) {
      const T b = *yp;
      for (int64_t j = lo; j < hi; ++j) o[j] = f(xp[j], b);
    } else if (y.lanes) {
      const T a = *xp;
      for (int64_t j = lo; j < hi; ++j) o[j] = f(a, yp[j]);
    } else {
      const R v = f(*xp, *yp);
      for (int64_t j = lo; j < hi; ++j) o[j] = v;
    }
  }
}

/// Lanes j.. of a one-row view as a vector.
template <class D>
SDPA_INLINE hn::Vec<D> Lanes(D d, const View<float>& x, int64_t j) {
  return x.lanes ? hn::LoadU(d, x.base + j) : hn::Set(d, *x.base);
}

/// s[j] = f(d, j) (a vector of lanes j..) for j in [lo, hi), in whole vectors where the
/// range allows: the softmax then reloads the row as whole vectors, and a vector load
/// spanning several narrower stores cannot take their data by store forwarding (it waits
/// for them to reach the cache, which made the row's softmax visibly slower).
/// (f may read s itself at lanes j..: s is not restrict.)
template <class F>
SDPA_INLINE void StoreRow(float* s, int64_t lo, int64_t hi, F f) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = lo;
  for (; j < hi && j % n != 0; ++j) hn::StoreU(f(d1, j), d1, s + j);
  for (; j + n <= hi; j += n) hn::StoreU(f(d, j), d, s + j);
  for (; j < hi; ++j) hn::StoreU(f(d1, j), d1, s + j);
}

/// out(r, j) = f(d, x(r, j..), y(r, j..)) for float operands in Highway vectors (as Map2):
/// whole-vector stores, so the next pass's whole-vector loads are store-forwarded.
template <class F>
SDPA_INLINE void MapFloat2(const View<float>& x, const View<float>& y, float* HWY_RESTRICT out,
                           const Pass& p, F f) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const View<float> xr{x.base + r * x.row_stride, 0, x.lanes};
    const View<float> yr{y.base + r * y.row_stride, 0, y.lanes};
    StoreRow(out + r * p.out_stride, p.lo_of(r), p.hi_of(r),
             [&](auto d, int64_t j) { return f(d, Lanes(d, xr, j), Lanes(d, yr, j)); });
  }
}

/// out(r, j) = f(x(r, j)) for element-wise integer or float operations.
template <typename T, typename R, typename F>
SDPA_INLINE void Map1(const View<T>& x, R* HWY_RESTRICT out, const Pass& p, F f) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const T* HWY_RESTRICT xp = x.base + r * x.row_stride;
    R* HWY_RESTRICT o = out + r * p.out_stride;
    const int64_t lo = p.lo_of(r), hi = p.hi_of(r);
    if (x.lanes) {
      for (int64_t j = lo; j < hi; ++j) o[j] = f(xp[j]);
    } else {
      const R v = f(*xp);
      for (int64_t j = lo; j < hi; ++j) o[j] = v;
    }
  }
}

/// out(r, j) = f(x(r, j)) for a Highway math function, over whole vectors covering
/// [lo, hi) (buffers are padded; a tile row is a multiple of the vector width).
template <class F>
SDPA_INLINE void MapFloat(const View<float>& x, float* HWY_RESTRICT out, const Pass& p, F f) {
  const hn::ScalableTag<float> d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* HWY_RESTRICT xp = x.base + r * x.row_stride;
    float* HWY_RESTRICT o = out + r * p.out_stride;
    const int64_t first = p.lo_of(r) / n * n, hi = p.hi_of(r);
    if (x.lanes) {
      for (int64_t j = first; j < hi; j += n) hn::StoreU(f(d, hn::LoadU(d, xp + j)), d, o + j);
    } else {
      const auto v = f(d, hn::Set(d, *xp));
      for (int64_t j = first; j < hi; j += n) hn::StoreU(v, d, o + j);
    }
  }
}

/// out(r, j) = x(r, j) / y(r, j). A divisor uniform over a row becomes a multiplication by
/// its reciprocal (<= 1.5 ulp from the rounded quotient, as GPU compilers' default float
/// division; a vector division per lane cost a soft-cap score_mod half its time), except
/// when the reciprocal is not a normal float (0, inf, NaN or subnormal divisors).
SDPA_INLINE void Divide(const View<float>& x, const View<float>& y, float* HWY_RESTRICT out,
                        const Pass& p, std::pair<float, float>& reciprocal) {
  if (y.lanes) {
    MapFloat2(x, y, out, p, [](auto, auto a, auto b) { return hn::Div(a, b); });
    return;
  }
  for (int64_t r = 0; r < p.rows; ++r) {
    const float divisor = y.base[r * y.row_stride];
    // The divisor rarely changes between score rows (a constant, a per-head value): reuse
    // its reciprocal instead of a scalar division on every row's critical path.
    auto& [last_divisor, last_reciprocal] = reciprocal;
    if (!(divisor == last_divisor)) {
      last_divisor = divisor;
      last_reciprocal = 1.0f / divisor;
    }
    const float reciprocal = last_reciprocal;
    const View<float> xr{x.base + r * x.row_stride, 0, x.lanes};
    float* o = out + r * p.out_stride;
    if (std::isnormal(reciprocal)) {
      StoreRow(o, p.lo_of(r), p.hi_of(r),
               [&](auto d, int64_t j) { return hn::Mul(Lanes(d, xr, j), hn::Set(d, reciprocal)); });
    } else {
      StoreRow(o, p.lo_of(r), p.hi_of(r),
               [&](auto d, int64_t j) { return hn::Div(Lanes(d, xr, j), hn::Set(d, divisor)); });
    }
  }
}

/// Records that element (r, j) of a chunk pass failed (an out-of-range read or an integer
/// division by zero); the element reads as 0 and is reported only if consumed.
SDPA_INLINE void MarkBad(RowBuffers& buf, const Pass& p, int64_t r, int64_t j) {
  buf.any_bad = true;
  switch (p.shape) {
    case Shape::kScalar:
      buf.bad_scalar = true;
      break;
    case Shape::kRow:
      buf.bad_row[j] = 1;
      break;
    case Shape::kCol:
      buf.bad_col[j] = 1;
      break;
    case Shape::kDiag:
      buf.bad_diag[j] = 1;
      break;
    case Shape::kFull:
      buf.bad_full[r * buf.lanes + j] = 1;
      break;
    case Shape::kScore:
      break;  // never marked: score passes throw at once
  }
}

/// The (q_idx, kv_idx) of element (r, j) of pass `p` in the chunk at (q0, kv0).
SDPA_INLINE std::pair<int64_t, int64_t> Position(const RowBuffers& buf, const Pass& p, int64_t r,
                                                 int64_t j) {
  switch (p.shape) {
    case Shape::kRow:
      return {buf.chunk_q0 + j, buf.chunk_kv0};
    case Shape::kCol:
      return {buf.chunk_q0, buf.chunk_kv0 + j};
    case Shape::kFull:
      return {buf.chunk_q0 + r, buf.chunk_kv0 + j};
    case Shape::kScore:
      return {buf.chunk_q0 + p.row + r, buf.chunk_kv0 + j};
    case Shape::kScalar:
    case Shape::kDiag:
      break;  // chunk passes record failures instead of reporting them
  }
  return {buf.chunk_q0, buf.chunk_kv0};
}

// A gather of one row's lanes: lane j reads element offsets[j] of `data` where ok[j].
struct LaneGather {
  const void* data;
  const int64_t* HWY_RESTRICT offsets;
  const uint8_t* HWY_RESTRICT ok;
};

template <typename E, typename R>
SDPA_INLINE void LoadLanes(const LaneGather& g, R* HWY_RESTRICT out, int64_t lo, int64_t hi) {
  const E* HWY_RESTRICT base = static_cast<const E*>(g.data);
  for (int64_t j = lo; j < hi; ++j) out[j] = g.ok[j] ? static_cast<R>(base[g.offsets[j]]) : R(0);
}

/// Captured-tensor read: bounds-checks every index lane, then loads with the dtype switch
/// outside the lane loop.
template <typename R>
SDPA_INLINE void Read(RowBuffers& buf, const Instr& in, R* out, const Pass& p) {
  const Captured& c = (*buf.captured)[in.slot];
  const Tensor& t = c.tensor();
  const int64_t dims = static_cast<int64_t>(in.args.size());
  View<int64_t> index[8];
  for (int64_t d = 0; d < dims; ++d) index[d] = ViewOf<int64_t>(buf, in.args[d], p);
  // Lanes of one row: at most max(kMaxLanes, kMaxChunkRows), checked by RowBuffers.
  static_assert(RowBuffers::kMaxChunkRows <= RowBuffers::kMaxLanes);
  int64_t offsets[RowBuffers::kMaxLanes];
  uint8_t ok[RowBuffers::kMaxLanes];
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t lo = p.lo_of(r), hi = p.hi_of(r);
    std::fill(offsets + lo, offsets + hi, int64_t{0});
    std::fill(ok + lo, ok + hi, uint8_t{1});
    for (int64_t d = 0; d < dims; ++d) {
      const int64_t size = t.size(d), stride = t.stride(d);
      const int64_t* HWY_RESTRICT ip = index[d].base + r * index[d].row_stride;
      for (int64_t j = lo; j < hi; ++j) {
        const int64_t v = index[d].lanes ? ip[j] : *ip;
        const bool inside = v >= 0 && v < size;
        if (!inside && ok[j]) {
          if (p.shape == Shape::kScore) {
            const auto [q, kv] = Position(buf, p, r, j);
            throw_out_of_range(c, d, v, {buf.chunk_b, buf.chunk_h, q, kv});
          }
          MarkBad(buf, p, r, j);
        }
        ok[j] = ok[j] & static_cast<uint8_t>(inside);
        offsets[j] += inside ? v * stride : 0;
      }
    }
    R* o = out + r * p.out_stride;
    const void* data = t.data_ptr();
    const LaneGather gather{data, offsets, ok};
    switch (t.dtype()) {
      case DType::kFloat32:
        LoadLanes<float>(gather, o, lo, hi);
        break;
      case DType::kFloat64:
        LoadLanes<double>(gather, o, lo, hi);
        break;
      case DType::kInt32:
        LoadLanes<int32_t>(gather, o, lo, hi);
        break;
      case DType::kInt64:
        LoadLanes<int64_t>(gather, o, lo, hi);
        break;
      case DType::kBool:
        LoadLanes<bool>(gather, o, lo, hi);
        break;
      case DType::kBFloat16:
      case DType::kFloat16:
      case DType::kFloat8E4M3FN:
        for (int64_t j = lo; j < hi; ++j) {
          o[j] = ok[j] ? static_cast<R>(detail::load_element(data, t.dtype(), offsets[j])) : R(0);
        }
        break;
    }
  }
}

/// Integer floor division / modulo lanes; a zero divisor throws in score passes and is
/// recorded (result 0) in chunk passes.
template <bool kModulo>
SDPA_INLINE void IntDivide(RowBuffers& buf, const View<int64_t>& x, const View<int64_t>& y,
                           int64_t* out, const Pass& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t* xp = x.base + r * x.row_stride;
    const int64_t* yp = y.base + r * y.row_stride;
    int64_t* o = out + r * p.out_stride;
    for (int64_t j = p.lo_of(r); j < p.hi_of(r); ++j) {
      const int64_t a = x.lanes ? xp[j] : *xp, b = y.lanes ? yp[j] : *yp;
      if (b == 0) {
        SDPA_CHECK(p.shape != Shape::kScore, "flex: integer division by zero");
        MarkBad(buf, p, r, j);
        o[j] = 0;
        continue;
      }
      o[j] = kModulo ? floor_mod_int(a, b) : floor_div_int(a, b);
    }
  }
}

/// Operand a of instruction `in` as pass `p` reads it. Forced inline, as the views were
/// when they were macros: GCC did not inline lambdas in EvalInstr's switch.
template <typename T>
SDPA_INLINE View<T> Arg(RowBuffers& buf, const Instr& in, int a, const Pass& p) {
  return ViewOf<T>(buf, in.args[a], p);
}

/// Evaluates instruction `k` in pass `p` into its own storage.
SDPA_INLINE void EvalInstr(RowBuffers& buf, int32_t k, const Pass& p, float* out = nullptr) {
  const CompiledProgram& prog = *buf.program;
  const Instr& in = prog.code[k];
  float* fo = out ? out : buf.fvals(k);
  int64_t* io = buf.ivals(k);
  const bool is_float = in.type == ValueType::kFloat;
  // Operands of comparisons / where / min / max may be float or int.
  const bool float_args = !in.args.empty() && prog.code[in.args.back()].type == ValueType::kFloat;
  switch (in.op) {
    case Op::kScore:
      break;  // read in place from the pass's score lanes
    case Op::kBatch:
      *io = buf.chunk_b;
      break;
    case Op::kHead:
      *io = buf.chunk_h;
      break;
    case Op::kConst:
      if (is_float) {
        *fo = static_cast<float>(in.constant);
      } else {
        *io = static_cast<int64_t>(in.constant);
      }
      break;
    case Op::kQIdx:
      for (int64_t r = 0; r < buf.chunk_rows; ++r) io[r] = buf.chunk_q0 + r;
      break;
    case Op::kKvIdx:
      for (int64_t j = 0; j < buf.diagonals(); ++j) io[j] = buf.chunk_kv0 + j;
      break;
    case Op::kRead:
      if (is_float) {
        Read(buf, in, fo, p);
      } else {
        Read(buf, in, io, p);
      }
      break;
#define SDPA_FLEX_ARITHMETIC(OP, EXPR, VECTOR_OP)                            \
  case OP:                                                                   \
    if (is_float) {                                                          \
      MapFloat2(Arg<float>(buf, in, 0, p), Arg<float>(buf, in, 1, p), fo, p, \
                [](auto, auto a, auto b) { return VECTOR_OP(a, b); });       \
    } else {                                                                 \
      Map2(Arg<int64_t>(buf, in, 0, p), Arg<int64_t>(buf, in, 1, p), io, p,  \
           [](int64_t a, int64_t b) { return EXPR; });                       \
    }                                                                        \
    break;
      SDPA_FLEX_ARITHMETIC(Op::kAdd, a + b, hn::Add)
      SDPA_FLEX_ARITHMETIC(Op::kSub, a - b, hn::Sub)
      SDPA_FLEX_ARITHMETIC(Op::kMul, a * b, hn::Mul)
#undef SDPA_FLEX_ARITHMETIC
#define SDPA_FLEX_BINARY(OP, EXPR)                                          \
  case OP:                                                                  \
    if (is_float) {                                                         \
      Map2(Arg<float>(buf, in, 0, p), Arg<float>(buf, in, 1, p), fo, p,     \
           [](float a, float b) { return EXPR; });                          \
    } else {                                                                \
      Map2(Arg<int64_t>(buf, in, 0, p), Arg<int64_t>(buf, in, 1, p), io, p, \
           [](int64_t a, int64_t b) { return EXPR; });                      \
    }                                                                       \
    break;
      SDPA_FLEX_BINARY(Op::kMin, a < b ? a : b)
      SDPA_FLEX_BINARY(Op::kMax, a > b ? a : b)
#undef SDPA_FLEX_BINARY
    case Op::kDiv:
      Divide(Arg<float>(buf, in, 0, p), Arg<float>(buf, in, 1, p), fo, p, buf.reciprocal[k]);
      break;
    case Op::kMod:
      IntDivide<true>(buf, Arg<int64_t>(buf, in, 0, p), Arg<int64_t>(buf, in, 1, p), io, p);
      break;
    case Op::kFloorDiv:
      IntDivide<false>(buf, Arg<int64_t>(buf, in, 0, p), Arg<int64_t>(buf, in, 1, p), io, p);
      break;
    case Op::kNeg:
      if (is_float) {
        Map1(Arg<float>(buf, in, 0, p), fo, p, [](float a) { return -a; });
      } else {
        Map1(Arg<int64_t>(buf, in, 0, p), io, p, [](int64_t a) { return -a; });
      }
      break;
    case Op::kAbs:
      if (is_float) {
        Map1(Arg<float>(buf, in, 0, p), fo, p, [](float a) { return std::fabs(a); });
      } else {
        // |INT64_MIN| wraps to INT64_MIN (numpy, torch) instead of overflowing.
        Map1(Arg<int64_t>(buf, in, 0, p), io, p, [](int64_t a) {
          return a < 0 ? static_cast<int64_t>(uint64_t{0} - static_cast<uint64_t>(a)) : a;
        });
      }
      break;
    case Op::kExp:
      MapFloat(Arg<float>(buf, in, 0, p), fo, p,
               [](auto d, auto v) { return ExpAllInputs(d, v); });
      break;
    case Op::kLog:
      MapFloat(Arg<float>(buf, in, 0, p), fo, p,
               [](auto d, auto v) { return LogAllInputs(d, v); });
      break;
    case Op::kTanh:
      MapFloat(Arg<float>(buf, in, 0, p), fo, p, [](auto d, auto v) { return FastTanh(d, v); });
      break;
    case Op::kSigmoid:
      MapFloat(Arg<float>(buf, in, 0, p), fo, p, [](auto d, auto v) {
        const auto one = hn::Set(d, 1.0f);
        return hn::Div(one, hn::Add(one, ExpAllInputs(d, hn::Neg(v))));
      });
      break;
    case Op::kSqrt:
      MapFloat(Arg<float>(buf, in, 0, p), fo, p, [](auto, auto v) { return hn::Sqrt(v); });
      break;
    case Op::kToFloat:
      Map1(Arg<int64_t>(buf, in, 0, p), fo, p, [](int64_t a) { return static_cast<float>(a); });
      break;
    case Op::kFloor:
      MapFloat(Arg<float>(buf, in, 0, p), fo, p, [](auto, auto v) { return hn::Floor(v); });
      break;
    case Op::kCeil:
      MapFloat(Arg<float>(buf, in, 0, p), fo, p, [](auto, auto v) { return hn::Ceil(v); });
      break;
    // Per element through libm: the vector forms lose accuracy on large arguments (index
    // phases such as sin(q_idx * w)), and sin / cos are rare in mods.
    case Op::kSin:
      Map1(Arg<float>(buf, in, 0, p), fo, p, [](float a) { return std::sin(a); });
      break;
    case Op::kCos:
      Map1(Arg<float>(buf, in, 0, p), fo, p, [](float a) { return std::cos(a); });
      break;
#define SDPA_FLEX_INTEGER(OP, EXPR)                                       \
  case OP:                                                                \
    Map2(Arg<int64_t>(buf, in, 0, p), Arg<int64_t>(buf, in, 1, p), io, p, \
         [](int64_t a, int64_t b) { return EXPR; });                      \
    break;
      SDPA_FLEX_INTEGER(Op::kBitAnd, a & b)
      SDPA_FLEX_INTEGER(Op::kBitOr, a | b)
      SDPA_FLEX_INTEGER(Op::kBitXor, a ^ b)
      SDPA_FLEX_INTEGER(Op::kShl, shift_left_int(a, b))
      SDPA_FLEX_INTEGER(Op::kShr, shift_right_int(a, b))
#undef SDPA_FLEX_INTEGER
    case Op::kBitNot:
      Map1(Arg<int64_t>(buf, in, 0, p), io, p, [](int64_t a) { return ~a; });
      break;
#define SDPA_FLEX_COMPARE(OP, CMP)                                              \
  case OP:                                                                      \
    if (float_args) {                                                           \
      Map2(Arg<float>(buf, in, 0, p), Arg<float>(buf, in, 1, p), io, p,         \
           [](float a, float b) { return static_cast<int64_t>(a CMP b); });     \
    } else {                                                                    \
      Map2(Arg<int64_t>(buf, in, 0, p), Arg<int64_t>(buf, in, 1, p), io, p,     \
           [](int64_t a, int64_t b) { return static_cast<int64_t>(a CMP b); }); \
    }                                                                           \
    break;
      SDPA_FLEX_COMPARE(Op::kLt, <)
      SDPA_FLEX_COMPARE(Op::kLe, <=)
      SDPA_FLEX_COMPARE(Op::kGt, >)
      SDPA_FLEX_COMPARE(Op::kGe, >=)
      SDPA_FLEX_COMPARE(Op::kEq, ==)
      SDPA_FLEX_COMPARE(Op::kNe, !=)
#undef SDPA_FLEX_COMPARE
    case Op::kAnd:
      Map2(Arg<int64_t>(buf, in, 0, p), Arg<int64_t>(buf, in, 1, p), io, p,
           [](int64_t a, int64_t b) { return a & b; });
      break;
    case Op::kOr:
      Map2(Arg<int64_t>(buf, in, 0, p), Arg<int64_t>(buf, in, 1, p), io, p,
           [](int64_t a, int64_t b) { return a | b; });
      break;
    case Op::kNot:
      Map1(Arg<int64_t>(buf, in, 0, p), io, p, [](int64_t a) { return a ^ 1; });
      break;
    case Op::kWhere: {
      // The condition picks per element; both branches are evaluated (as the oracle does).
      const View<int64_t> c = Arg<int64_t>(buf, in, 0, p);
      auto select = [&](auto x, auto y, auto* out) {
        for (int64_t r = 0; r < p.rows; ++r) {
          const int64_t* cp = c.base + r * c.row_stride;
          const auto* xp = x.base + r * x.row_stride;
          const auto* yp = y.base + r * y.row_stride;
          auto* o = out + r * p.out_stride;
          for (int64_t j = p.lo_of(r); j < p.hi_of(r); ++j) {
            o[j] = (c.lanes ? cp[j] : *cp) ? (x.lanes ? xp[j] : *xp) : (y.lanes ? yp[j] : *yp);
          }
        }
      };
      if (is_float) {
        select(Arg<float>(buf, in, 1, p), Arg<float>(buf, in, 2, p), fo);
      } else {
        select(Arg<int64_t>(buf, in, 1, p), Arg<int64_t>(buf, in, 2, p), io);
      }
      break;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::flex
HWY_AFTER_NAMESPACE();

#endif  // SDPA_FLEX_EVAL_INSTR_INL_H_
