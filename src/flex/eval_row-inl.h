// Evaluation of a flex program for the score rows of a kernel tile (row_buffers.h):
// instructions that do not read score are evaluated once per chunk of chunk_rows query
// rows x one key tile, each over its shape (scalar, per row, per key, per element); a score
// row then runs only the instructions that read score. This file schedules the chunks and
// score rows; eval_instr-inl.h evaluates one instruction. Per-target code: include after
// foreach_target.h.

#if defined(SDPA_FLEX_EVAL_ROW_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef SDPA_FLEX_EVAL_ROW_INL_H_
#undef SDPA_FLEX_EVAL_ROW_INL_H_
#else
#define SDPA_FLEX_EVAL_ROW_INL_H_
#endif

#include <algorithm>
#include <bit>
#include <cstdint>
#include <iterator>
#include <limits>

#include "core/kernel_inline.h"
#include "flex/eval_chain-inl.h"
#include "flex/eval_instr-inl.h"
#include "flex/row_buffers.h"
#include "hwy/highway.h"
#include "sdpa/error.h"

HWY_BEFORE_NAMESPACE();
namespace sdpa::flex {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Where an evaluation runs: query rows [q_first, q_first + rows) of (batch b, head h)
/// over the key tile that starts at key kv0.
struct EvalSite {
  int64_t b, h, q_first, rows, kv0;
};

/// Score rows s + r * stride, r < rows, and the lanes [lo[r], hi[r]) of each that count.
template <class T>
struct ScoreLanes {
  T* s;
  int64_t stride;
  const int64_t* lo;
  const int64_t* hi;

  ScoreLanes from(int64_t r) const { return {s + r * stride, stride, lo + r, hi + r}; }
};

/// The pass evaluating every instruction of shape `s` in a chunk.
SDPA_INLINE Pass ChunkPass(const RowBuffers& buf, Shape s) {
  switch (s) {
    case Shape::kRow:
      return {s, 1, 0, buf.chunk_rows, 0, 0, nullptr};
    case Shape::kCol:
    case Shape::kDiag:
      return {s, 1, 0, buf.diagonals(), 0, 0, nullptr};
    case Shape::kFull:
      return {s, buf.chunk_rows, 0, buf.lanes, buf.lanes, 0, nullptr};
    default:
      return {s, 1, 0, 1, 0, 0, nullptr};
  }
}

/// Evaluates every instruction that does not read score for the chunk of query rows
/// [q0, q0 + chunk_rows) and key tile [kv0, kv0 + lanes) of (b, h). Rows past q_len and
/// keys past kv_len are evaluated too; failures there stay unreported (MarkBad).
inline HWY_NOINLINE void EvaluateChunk(RowBuffers& buf, int64_t b, int64_t h, int64_t q0,
                                       int64_t kv0) {
  buf.chunk_b = b;
  buf.chunk_h = h;
  buf.chunk_q0 = q0;
  buf.chunk_kv0 = kv0;
  if (buf.any_bad) {
    buf.any_bad = buf.bad_scalar = false;
    std::fill(std::begin(buf.bad_row), std::end(buf.bad_row), uint8_t{0});
    std::fill(buf.bad_col.begin(), buf.bad_col.end(), uint8_t{0});
    std::fill(buf.bad_diag.begin(), buf.bad_diag.end(), uint8_t{0});
    std::fill(buf.bad_full.begin(), buf.bad_full.end(), uint8_t{0});
  }
  for (int32_t k : buf.chunk_code) EvalInstr(buf, k, ChunkPass(buf, buf.shape[k]));
}

/// Makes the chunk containing query q_idx and the key tile at kv0 of (b, h) current
/// (evaluated once, then reused by the chunk's other rows); returns q_idx's chunk row.
SDPA_INLINE int64_t PrepareChunk(RowBuffers& buf, int64_t b, int64_t h, int64_t q_idx,
                                 int64_t kv0) {
  const int64_t q0 = q_idx - q_idx % buf.chunk_rows;
  if (b != buf.chunk_b || h != buf.chunk_h || q0 != buf.chunk_q0 || kv0 != buf.chunk_kv0) {
    EvaluateChunk(buf, b, h, q0, kv0);
  }
  return q_idx - q0;
}

/// Whether element (row, j) for some j in [lo, hi) failed in the chunk pass.
SDPA_INLINE bool RowHasBad(const RowBuffers& buf, int64_t row, int64_t lo, int64_t hi) {
  if (!buf.any_bad || lo >= hi) return false;
  if (buf.bad_scalar || buf.bad_row[row]) return true;
  const uint8_t* full = buf.bad_full.data() + row * buf.lanes;
  const uint8_t* diag = buf.bad_diag.data() + buf.chunk_rows - 1 - row;
  for (int64_t j = lo; j < hi; ++j) {
    if (buf.bad_col[j] | full[j] | diag[j]) return true;
  }
  return false;
}

/// Reports the failure of a consumed element of row `row` (RowHasBad): the float64 oracle
/// re-evaluates the elements of [lo, hi) and throws the same error the element raises
/// there (naming the tensor, index and position).
[[noreturn]] inline void ReportBadRow(RowBuffers& buf, const float* scores, int64_t row, int64_t lo,
                                      int64_t hi) {
  for (int64_t j = lo; j < hi; ++j) {
    buf.scalar.run(scores ? scores[j] : 0.0, buf.chunk_b, buf.chunk_h, buf.chunk_q0 + row,
                   buf.chunk_kv0 + j);
  }
  detail::throw_error("flex: internal error: a failed element of row ", buf.chunk_q0 + row,
                      " evaluates without error in the reference");
}

/// Throws (ReportBadRow) for a failed chunk element that lanes [lo[r], hi[r]) of score
/// rows row .. row + rows - 1 consume (scores + r * stride: their scores).
SDPA_INLINE void CheckScoreRows(RowBuffers& buf, int64_t row, int64_t rows, const float* scores,
                                int64_t stride, const int64_t* lo, const int64_t* hi) {
  for (int64_t r = 0; r < rows; ++r) {
    if (RowHasBad(buf, row + r, lo[r], hi[r])) {
      ReportBadRow(buf, scores + r * stride, row + r, lo[r], hi[r]);
    }
  }
}

/// Runs the score-reading instructions for chunk rows row .. row + rows - 1 over lanes
/// [lo[r], hi[r]) of scores + r * score_stride (tile rows), after PrepareChunk; their
/// values are stored from row 0 of the score-shaped buffers. Throws for a consumed failed
/// element.
inline HWY_NOINLINE void EvaluateScoreRows(RowBuffers& buf, int64_t row, int64_t rows,
                                           const ScoreLanes<const float>& lanes) {
  const float* scores = lanes.s;
  const int64_t score_stride = lanes.stride;
  const int64_t *lo = lanes.lo, *hi = lanes.hi;
  CheckScoreRows(buf, row, rows, scores, score_stride, lo, hi);
  const Pass pass{Shape::kScore, rows, 0, 0, buf.lanes, row, scores, score_stride, lo, hi};
  for (int32_t k : buf.score_code) EvalInstr(buf, k, pass);
}

/// Whether the program's result is the last score-shaped float instruction, which can then
/// be evaluated straight into the score rows (ScoreModInPlace).
SDPA_INLINE bool ResultInPlace(const RowBuffers& buf) {
  const int32_t result = buf.program->result;
  return !buf.score_code.empty() && buf.score_code.back() == result &&
         buf.program->code[result].type == ValueType::kFloat;
}

/// EvaluateScoreRows for a ResultInPlace program whose result replaces lanes [lo[r],
/// hi[r]) of the scores themselves (lanes of the covering vectors outside them are
/// overwritten too): every instruction before the result has read the scores by then,
/// and the result's element-wise operation reads each lane before writing it.
inline HWY_NOINLINE void ScoreModInPlace(RowBuffers& buf, int64_t row, int64_t rows,
                                         const ScoreLanes<float>& lanes) {
  float* scores = lanes.s;
  const int64_t score_stride = lanes.stride;
  const int64_t *lo = lanes.lo, *hi = lanes.hi;
  CheckScoreRows(buf, row, rows, scores, score_stride, lo, hi);
  const Pass pass{Shape::kScore, rows, 0, 0, buf.lanes, row, scores, score_stride, lo, hi};
  const size_t last = buf.score_code.size() - 1;
  for (size_t i = 0; i < last; ++i) EvalInstr(buf, buf.score_code[i], pass);
  Pass to_scores = pass;
  to_scores.out_stride = score_stride;
  EvalInstr(buf, buf.score_code[last], to_scores, scores);
}

/// One score row of EvaluateScoreRows.
SDPA_INLINE void EvaluateScoreRow(RowBuffers& buf, int64_t row, const float* scores, int64_t lo,
                                  int64_t hi) {
  EvaluateScoreRows(buf, row, 1, ScoreLanes<const float>{scores, 0, &lo, &hi});
}

/// Evaluates the program for query site.q_first of (b, h) and keys kv0 + j, j < n, with
/// score = scores[j] (kv0 the start of a key tile; `scores` the tile row). Returns the result
/// instruction; MaterializeLanes then gives an instruction's lanes.
inline int32_t EvaluateRow(RowBuffers& buf, const EvalSite& site, const float* scores,
                           int64_t n) {
  const int64_t row = PrepareChunk(buf, site.b, site.h, site.q_first, site.kv0);
  EvaluateScoreRow(buf, row, scores, 0, n);
  buf.last_row = row;
  buf.last_scores = scores;
  return buf.program->result;
}

/// Makes floats(id) / ints(id) hold instruction id's lanes for the last EvaluateRow.
inline void MaterializeLanes(RowBuffers& buf, int32_t id) {
  const Pass pass{Shape::kScore, 1, 0, buf.lanes, buf.lanes, buf.last_row, buf.last_scores};
  if (buf.program->code[id].type == ValueType::kFloat) {
    Map1(ViewOf<float>(buf, id, pass), buf.floats(id), pass, [](float a) { return a; });
  } else {
    Map1(ViewOf<int64_t>(buf, id, pass), buf.ints(id), pass, [](int64_t a) { return a; });
  }
}

/// Replaces lanes.s[r * stride + j] by score_mod of it for the site's rows r (query
/// q_first + r) and lanes j in [lo[r], hi[r]): one evaluation per chunk of rows, so the
/// program's dispatch is paid per chunk rather than per row.
SDPA_INLINE void ApplyScoreModRows(RowBuffers& buf, const EvalSite& site,
                                   const ScoreLanes<float>& lanes) {
  const int64_t s_stride = lanes.stride;
  for (int64_t r0 = 0; r0 < site.rows;) {
    const int64_t row = PrepareChunk(buf, site.b, site.h, site.q_first + r0, site.kv0);
    const int64_t n = std::min(site.rows - r0, buf.chunk_rows - row);
    const ScoreLanes<float> chunk = lanes.from(r0);
    float* sc = chunk.s;
    const int64_t* l = chunk.lo;
    const int64_t* u = chunk.hi;
    const Pass pass{Shape::kScore, n, 0, 0, buf.lanes, row, sc, s_stride, l, u};
    if (buf.bias >= 0) {  // score +/- X: no score instruction runs
      CheckScoreRows(buf, row, n, sc, s_stride, l, u);
      const View<float> x = ViewOf<float>(buf, buf.bias, pass);
      const float sign = buf.bias_subtracted ? -1.0f : 1.0f;
      for (int64_t r = 0; r < n; ++r) {
        float* sr = sc + r * s_stride;
        const View<float> xr{x.base + r * x.row_stride, 0, x.lanes};
        StoreRow(sr, l[r], u[r], [&](auto d, int64_t j) {
          return hn::MulAdd(hn::Set(d, sign), Lanes(d, xr, j), hn::LoadU(d, sr + j));
        });
      }
    } else if (!buf.score_chain.empty()) {  // the chain on each vector in registers
      CheckScoreRows(buf, row, n, sc, s_stride, l, u);
      ScoreChainInPlace(buf, row, n, sc, s_stride, l, u);
    } else if (ResultInPlace(buf)) {  // saves a copy pass over the tile
      ScoreModInPlace(buf, row, n, chunk);
    } else {
      EvaluateScoreRows(buf, row, n, ScoreLanes<const float>{sc, s_stride, l, u});
      const View<float> result = ViewOf<float>(buf, buf.program->result, pass);
      if (result.base != sc) {  // else score_mod(score) = score
        for (int64_t r = 0; r < n; ++r) {
          const View<float> rr{result.base + r * result.row_stride, 0, result.lanes};
          StoreRow(sc + r * s_stride, l[r], u[r],
                   [&](auto d, int64_t j) { return Lanes(d, rr, j); });
        }
      }
    }
    r0 += n;
  }
}

/// Whether ScoreModRegisterRow can apply this score_mod: score + X, score - X (ALiBi,
/// relative position) or a score chain (soft-capping).
SDPA_INLINE bool ScoreModRunsInRegisters(const RowBuffers& buf) {
  return buf.bias >= 0 || !buf.score_chain.empty();
}

/// What ScoreModRegisterRow looked up for one chunk of rows (PrepareChunk) over one key
/// tile, reused by the chunk's other rows, so that a row costs only its arithmetic.
struct RegisterModRows {
  int64_t q0 = -1;  // the chunk's first query (-1: nothing looked up yet)
  int64_t lo = 0, hi = 0;
  Pass pass{};          // chunk row 0 over lanes [lo, hi)
  View<float> bias{};   // score + X: X at chunk row 0
  float sign = 1.0f;    // -1 for score - X
  ChainOperand operands[RowBuffers::kMaxChainSteps];  // the chain's, at chunk row 0
  bool operands_by_row = false;  // some chain operand varies with the row
};

/// Makes the chunk of the site's query current and fills `rows` for it (lanes keys).
inline HWY_NOINLINE void LookUpRegisterModRows(RowBuffers& buf, const EvalSite& site, int64_t lanes,
                                      RegisterModRows& rows) {
  PrepareChunk(buf, site.b, site.h, site.q_first, site.kv0);
  rows.q0 = buf.chunk_q0;
  rows.lo = 0;
  rows.hi = lanes;
  rows.pass = Pass{Shape::kScore, 1, 0, lanes, buf.lanes, 0, nullptr, 0, &rows.lo, &rows.hi};
  if (buf.bias >= 0) {
    rows.bias = ViewOf<float>(buf, buf.bias, rows.pass);
    rows.sign = buf.bias_subtracted ? -1.0f : 1.0f;
    return;
  }
  ChainRowOperands(buf, rows.pass, 0, rows.operands);
  rows.operands_by_row = false;
  for (const RowBuffers::ChainStep& step : buf.score_chain) {
    if (step.operand >= 0 && ViewOf<float>(buf, step.operand, rows.pass).row_stride != 0) {
      rows.operands_by_row = true;
    }
  }
}

/// score_mod of the site's query row (site.rows == 1) over a whole key tile (kVecs
/// vectors = buf.lanes keys from site.kv0) whose scores are in registers, x[v] holding
/// lanes v * Lanes(d)..: the fused kernels apply it before their register softmax, so the
/// scores never reach memory. The operations are ApplyScoreModRows', lane for lane. Needs
/// ScoreModRunsInRegisters; `rows` carries the lookups of the row's chunk across the
/// calls for one tile (rows in any order; a fresh RegisterModRows per tile). Throws for a
/// consumed failed element.
template <int kVecs, class D>
SDPA_INLINE void ScoreModRegisterRow(RowBuffers& buf, const EvalSite& site, RegisterModRows& rows,
                                     D d, hn::Vec<D> (&x)[kVecs]) {
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  if (rows.q0 < 0 || site.q_first < rows.q0 || site.q_first - rows.q0 >= buf.chunk_rows) {
    LookUpRegisterModRows(buf, site, kVecs * n, rows);
  }
  const int64_t row = site.q_first - rows.q0;
  if (RowHasBad(buf, row, rows.lo, rows.hi)) {
    float scores[RowBuffers::kMaxLanes];  // the oracle re-evaluates with the scores
    for (int v = 0; v < kVecs; ++v) hn::StoreU(x[v], d, scores + v * n);
    ReportBadRow(buf, scores, row, rows.lo, rows.hi);
  }
  if (buf.bias >= 0) {
    const View<float> bias{rows.bias.base + row * rows.bias.row_stride, 0, rows.bias.lanes};
    const auto sign = hn::Set(d, rows.sign);
    for (int v = 0; v < kVecs; ++v) x[v] = hn::MulAdd(sign, Lanes(d, bias, v * n), x[v]);
    return;
  }
  if (rows.operands_by_row) ChainRowOperands(buf, rows.pass, row, rows.operands);
  for (size_t i = 0; i < buf.score_chain.size(); ++i) {
    ChainStepGroup<kVecs>(d, buf.score_chain[i], rows.operands[i], x, 0);
  }
}

/// Replaces s[j] by score_mod(s[j]) for j in [lo, hi), where s is the score row of the
/// site's query over its key tile.
SDPA_INLINE void ApplyScoreMod(RowBuffers& buf, const EvalSite& site, float* s, int64_t lo,
                               int64_t hi) {
  ApplyScoreModRows(buf, site, ScoreLanes<float>{s, 0, &lo, &hi});
}

/// Which lanes of [lo, hi) a mask_mod keeps: the first and last kept lane and how many are
/// kept (count 0: none; then first and last are meaningless).
struct KeptLanes {
  int64_t first = 0, last = -1, count = 0;
};

/// The lanes of [lo, hi) (at most 64) where mask_mod (a program that does not read score)
/// keeps chunk row `row` (after PrepareChunk): bit j - lo for lane j.
SDPA_INLINE uint64_t KeptLaneBits(RowBuffers& buf, int64_t row, int64_t lo, int64_t hi) {
  const uint64_t all = hi - lo >= 64 ? ~uint64_t{0} : (uint64_t{1} << (hi - lo)) - 1;
  const View<int64_t> keep = ViewOf<int64_t>(
      buf, buf.program->result, Pass{Shape::kScore, 1, lo, hi, buf.lanes, row, nullptr});
  if (!keep.lanes) return *keep.base != 0 ? all : 0;
  // Lanes past hi are read from the padded buffers and cleared.
  const hn::ScalableTag<int64_t> d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  uint64_t bits = 0;
  for (int64_t j = lo; j < hi; j += n) {
    uint8_t mask_bytes[8] = {};
    hn::StoreMaskBits(d, hn::Ne(hn::LoadU(d, keep.base + j), hn::Zero(d)), mask_bytes);
    bits |= static_cast<uint64_t>(mask_bytes[0]) << (j - lo);  // n <= 8 lanes of int64
  }
  return bits & all;
}

/// Kept lanes of mask_mod (a program that does not read score) for the site's query over
/// lanes [lo, hi) of its key tile. Throws, as ApplyMaskMod, for a failed element of
/// [lo, hi).
SDPA_INLINE KeptLanes CountKeptLanes(RowBuffers& buf, const EvalSite& site, int64_t lo,
                                     int64_t hi) {
  SDPA_CHECK(buf.score_code.empty(), "flex: internal error: a mask_mod reads score");
  const int64_t row = PrepareChunk(buf, site.b, site.h, site.q_first, site.kv0);
  if (RowHasBad(buf, row, lo, hi)) ReportBadRow(buf, nullptr, row, lo, hi);
  // 64 lanes at a time as a bit set, so first / last / count are bit scans rather than a
  // loop over lanes.
  KeptLanes kept{hi, -1, 0};
  for (int64_t w = lo; w < hi; w += 64) {
    const uint64_t bits = KeptLaneBits(buf, row, w, std::min(hi, w + 64));
    if (bits == 0) continue;
    kept.first = std::min(kept.first, w + std::countr_zero(bits));
    kept.last = w + 63 - std::countl_zero(bits);
    kept.count += std::popcount(bits);
  }
  return kept.count > 0 ? kept : KeptLanes{};
}

/// Sets s[j] = -inf for j in [lo, hi) where mask_mod is false (s as in ApplyScoreMod).
SDPA_INLINE void ApplyMaskMod(RowBuffers& buf, const EvalSite& site, float* HWY_RESTRICT s,
                              int64_t lo, int64_t hi) {
  const int64_t row = PrepareChunk(buf, site.b, site.h, site.q_first, site.kv0);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (buf.score_code.empty()) {
    if (RowHasBad(buf, row, lo, hi)) ReportBadRow(buf, s, row, lo, hi);
  } else {
    EvaluateScoreRow(buf, row, s, lo, hi);
  }
  const View<int64_t> keep =
      ViewOf<int64_t>(buf, buf.program->result, Pass{Shape::kScore, 1, lo, hi, buf.lanes, row, s});
  if (!keep.lanes) {
    if (*keep.base == 0) std::fill(s + lo, s + hi, kNegInf);
    return;
  }
  for (int64_t j = lo; j < hi; ++j) s[j] = keep.base[j] ? s[j] : kNegInf;
}

}  // namespace HWY_NAMESPACE
}  // namespace sdpa::flex
HWY_AFTER_NAMESPACE();

#endif  // SDPA_FLEX_EVAL_ROW_INL_H_
