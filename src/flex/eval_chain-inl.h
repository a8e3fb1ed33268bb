// Score chains of flex programs (RowBuffers::score_chain): a score_mod whose score part is
// a chain of element-wise float operations (soft-capping: score / cap, tanh, times cap)
// runs the whole chain on each vector of scores in registers, where the general evaluator
// (eval_instr-inl.h) makes one pass over the rows per instruction through its buffers.
// Results equal the general evaluator's lane for lane: each step is the operation
// EvalInstr applies. Per-target code: include after foreach_target.h.

#if defined(SDPA_FLEX_EVAL_CHAIN_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_FLEX_EVAL_CHAIN_INL_H_
#undef SDPA_FLEX_EVAL_CHAIN_INL_H_
#else
#define SDPA_FLEX_EVAL_CHAIN_INL_H_
#endif

#include <cmath>
#include <cstdint>

#include "core/kernel_inline.h"
#include "flex/eval_instr-inl.h"
#include "flex/eval_math-inl.h"
#include "flex/row_buffers.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::flex {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// A chain step's operand for one score row: its lanes, or one value for the row; a
/// uniform divisor as EvalInstr's Divide takes it (its reciprocal when that is normal).
struct ChainOperand {
  View<float> value;
  float reciprocal = 0.0f;
  bool multiply_by_reciprocal = false;
};

/// x[g] = step(x[g]) for kGroup vectors of a score row, x[g] holding lanes j + g * N..
/// (N lanes per vector): step-major over the group, so that its vectors' dependency
/// chains (tanh's polynomial) overlap.
template <int kGroup, class D, class V>
SDPA_INLINE void ChainStepGroup(D d, const RowBuffers::ChainStep& step, const ChainOperand& operand,
                                V (&x)[kGroup], int64_t j) {
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  auto each = [&](auto f) {
    for (int g = 0; g < kGroup; ++g) x[g] = f(x[g], j + g * n);
  };
  if (step.operand < 0) {
    switch (step.op) {
      case Op::kNeg:
        return each([](V v, int64_t) { return hn::Neg(v); });
      case Op::kAbs:
        return each([](V v, int64_t) { return hn::Abs(v); });
      case Op::kExp:
        return each([&](V v, int64_t) { return ExpAllInputs(d, v); });
      case Op::kLog:
        return each([&](V v, int64_t) { return LogAllInputs(d, v); });
      case Op::kTanh:
        return each([&](V v, int64_t) { return FastTanh(d, v); });
      case Op::kSigmoid:
        return each([&](V v, int64_t) {
          const V one = hn::Set(d, 1.0f);
          return hn::Div(one, hn::Add(one, ExpAllInputs(d, hn::Neg(v))));
        });
      default:  // kSqrt (RowBuffers::chain_op admits no other unary op)
        return each([](V v, int64_t) { return hn::Sqrt(v); });
    }
  }
  if (step.op == Op::kDiv && operand.multiply_by_reciprocal) {
    const V reciprocal = hn::Set(d, operand.reciprocal);
    return each([&](V v, int64_t) { return hn::Mul(v, reciprocal); });
  }
  // Binary: a op b with the operand on its side.
  auto binary = [&](auto op) {
    each([&](V v, int64_t lane) {
      const V y = Lanes(d, operand.value, lane);
      return step.operand_first ? op(y, v) : op(v, y);
    });
  };
  switch (step.op) {
    case Op::kAdd:
      return binary([](V a, V b) { return hn::Add(a, b); });
    case Op::kSub:
      return binary([](V a, V b) { return hn::Sub(a, b); });
    case Op::kMul:
      return binary([](V a, V b) { return hn::Mul(a, b); });
    case Op::kDiv:
      return binary([](V a, V b) { return hn::Div(a, b); });
    case Op::kMin:  // a < b ? a : b, as EvalInstr (NaN handling included)
      return binary([](V a, V b) { return hn::IfThenElse(hn::Lt(a, b), a, b); });
    default:  // kMax
      return binary([](V a, V b) { return hn::IfThenElse(hn::Gt(a, b), a, b); });
  }
}

/// The whole chain over kGroup vectors of score row s from lane j, in place.
template <int kGroup, class D>
SDPA_INLINE void ChainLanes(D d, const std::vector<RowBuffers::ChainStep>& chain,
                            const ChainOperand* operands, float* s, int64_t j) {
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  hn::Vec<D> x[kGroup];
  for (int g = 0; g < kGroup; ++g) x[g] = hn::LoadU(d, s + j + g * n);
  for (size_t i = 0; i < chain.size(); ++i) ChainStepGroup<kGroup>(d, chain[i], operands[i], x, j);
  for (int g = 0; g < kGroup; ++g) hn::StoreU(x[g], d, s + j + g * n);
}

/// The operands of the chain's steps for score row r of `pass` (after PrepareChunk).
SDPA_INLINE void ChainRowOperands(RowBuffers& buf, const Pass& pass, int64_t r,
                                  ChainOperand (&operands)[RowBuffers::kMaxChainSteps]) {
  const std::vector<RowBuffers::ChainStep>& chain = buf.score_chain;
  for (size_t i = 0; i < chain.size(); ++i) {
    const RowBuffers::ChainStep& step = chain[i];
    if (step.operand < 0) continue;
    const View<float> v = ViewOf<float>(buf, step.operand, pass);
    ChainOperand& operand = operands[i];
    operand = {{v.base + r * v.row_stride, 0, v.lanes}};
    if (step.op == Op::kDiv && !step.operand_first && !v.lanes) {
      // Divide's rule: a uniform divisor multiplies by its (cached) reciprocal when that
      // is a normal float.
      const float divisor = *operand.value.base;
      auto& [last_divisor, last_reciprocal] = buf.reciprocal[step.instr];
      if (!(divisor == last_divisor)) {
        last_divisor = divisor;
        last_reciprocal = 1.0f / divisor;
      }
      operand.reciprocal = last_reciprocal;
      operand.multiply_by_reciprocal = std::isnormal(last_reciprocal);
    }
  }
}

/// Replaces lanes [lo[r], hi[r]) of score rows scores + r * stride (chunk rows row ..
/// row + rows - 1, after PrepareChunk) by the program's result, for a program with a
/// score chain. The caller has checked the rows' chunk failures (RowHasBad).
inline HWY_NOINLINE void ScoreChainInPlace(RowBuffers& buf, int64_t row, int64_t rows,
                                           float* scores, int64_t stride, const int64_t* lo,
                                           const int64_t* hi) {
  const std::vector<RowBuffers::ChainStep>& chain = buf.score_chain;
  const Pass pass{Shape::kScore, rows, 0, 0, buf.lanes, row, scores, stride, lo, hi};
  ChainOperand operands[RowBuffers::kMaxChainSteps];
  for (int64_t r = 0; r < rows; ++r) {
    ChainRowOperands(buf, pass, r, operands);
    // Whole vectors (four at a time) where the lanes allow, as StoreRow: the softmax then
    // reloads them by store forwarding.
    float* s = scores + r * stride;
    const hn::ScalableTag<float> d;
    const hn::CappedTag<float, 1> d1;
    const int64_t n = static_cast<int64_t>(hn::Lanes(d));
    int64_t j = lo[r];
    for (; j < hi[r] && j % n != 0; ++j) ChainLanes<1>(d1, chain, operands, s, j);
    for (; j + 4 * n <= hi[r]; j += 4 * n) ChainLanes<4>(d, chain, operands, s, j);
    for (; j + n <= hi[r]; j += n) ChainLanes<1>(d, chain, operands, s, j);
    for (; j < hi[r]; ++j) ChainLanes<1>(d1, chain, operands, s, j);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::flex
HWY_AFTER_NAMESPACE();

#endif  // SDPA_FLEX_EVAL_CHAIN_INL_H_
