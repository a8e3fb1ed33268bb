#pragma once
// Per-thread storage for evaluating a flex program over the rows of a kernel tile.
//
// Every instruction has a *shape* -- what it varies with -- and is evaluated only as often
// as that shape requires (eval_row-inl.h):
//   kScalar  b, h, constants             once per chunk
//   kRow     q_idx                       one value per row of the chunk
//   kCol     kv_idx                      one lane per key of the tile
//   kDiag    kv_idx - q_idx only         one lane per diagonal of the chunk
//   kFull    q_idx and kv_idx            [chunk_rows, lanes], once per chunk of rows
//   kScore   score                       per score row the kernel hands over (up to
//                                        chunk_rows rows per evaluation)
// kDiag covers relative positions (q_idx - kv_idx, |q_idx - kv_idx|, ALiBi's bias, a
// relative-bias table read, causal and window comparisons): it arises from a subtraction
// or comparison of q_idx + c with kv_idx + c' and stays diagonal through operations with
// scalars and other diagonals, so such programs cost O(rows + lanes) per chunk, not
// O(rows x lanes).
// A chunk is chunk_rows query rows x one key tile. Everything but the score-dependent part
// is computed once per chunk, so a score row costs only its score-dependent instructions
// (ALiBi: one subtraction), and a mask_mod (which never reads score) costs a select per row.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "flex/eval_scalar.h"
#include "hwy/aligned_allocator.h"
#include "sdpa/error.h"

namespace sdpa::flex {

enum class Shape : uint8_t { kScalar, kRow, kCol, kDiag, kFull, kScore };

struct RowBuffers {
  /// Query rows per chunk (chunk_rows) of programs with per-element (kFull) instructions:
  /// 16 x 64 keys of int64 lanes is 8 KB per instruction, so a chunk's working set stays
  /// in L1 while instruction dispatch is paid once per 1024 elements instead of once per
  /// row.
  static constexpr int64_t kFullChunkRows = 16;
  /// Query rows per chunk of the other programs (ALiBi, relative positions, soft-capping):
  /// their chunk costs O(rows + lanes), so a whole 64-row q-block is one chunk and the
  /// dispatch is paid once per key tile (sdpa_mask_ratios on the AMX Xeon: flex ALiBi /
  /// plain 1.28-1.34 -> 1.19-1.22).
  static constexpr int64_t kMaxChunkRows = 64;
  /// Padding after every buffer: vector loops may run to the next multiple of the widest
  /// vector (16 floats).
  static constexpr int64_t kPad = 16;
  /// Most keys per tile row (bounds the evaluator's stack buffers).
  static constexpr int64_t kMaxLanes = 128;
  /// Longest score chain (find_score_chain; bounds eval_chain-inl.h's stack buffers).
  static constexpr size_t kMaxChainSteps = 16;

  /// `lanes`: keys per tile row (a multiple of 16).
  RowBuffers(const CompiledProgram& program, const std::vector<Captured>& captured, int64_t lanes)
      : program(&program), captured(&captured), lanes(lanes), scalar(program, captured) {
    SDPA_CHECK(lanes > 0 && lanes % kPad == 0 && lanes + kFullChunkRows - 1 <= kMaxLanes,
               "flex: internal error: ", lanes, " lanes per row");
    const size_t n = program.code.size();
    shape.resize(n);
    offset.resize(n);
    q_affine.assign(n, 0);
    kv_affine.assign(n, 0);
    int64_t f_size = 0, i_size = 0;
    for (size_t k = 0; k < n; ++k) {
      const Instr& in = program.code[k];
      Shape s = Shape::kScalar;
      switch (in.op) {
        case Op::kScore:
          s = Shape::kScore;
          break;
        case Op::kQIdx:
          s = Shape::kRow;
          break;
        case Op::kKvIdx:
          s = Shape::kCol;
          break;
        default: {
          bool by_row = false, by_col = false, by_diag = false, by_score = false;
          for (int32_t a : in.args) {
            by_score |= shape[a] == Shape::kScore;
            by_row |= shape[a] == Shape::kRow || shape[a] == Shape::kFull;
            by_col |= shape[a] == Shape::kCol || shape[a] == Shape::kFull;
            by_diag |= shape[a] == Shape::kDiag;
          }
          const bool relative = in.args.size() == 2 &&
                                (in.op == Op::kSub || is_comparison(in.op)) &&
                                ((q_affine[in.args[0]] && kv_affine[in.args[1]]) ||
                                 (kv_affine[in.args[0]] && q_affine[in.args[1]]));
          s = by_score                                                ? Shape::kScore
              : relative                                              ? Shape::kDiag
              : (by_row && by_col) || (by_diag && (by_row || by_col)) ? Shape::kFull
              : by_diag                                               ? Shape::kDiag
              : by_row                                                ? Shape::kRow
              : by_col                                                ? Shape::kCol
                                                                      : Shape::kScalar;
        }
      }
      shape[k] = s;
      // q_idx + c, c + q_idx, q_idx - c for an int scalar c (likewise kv_idx).
      auto affine = [&](Op input, const std::vector<uint8_t>& of) -> uint8_t {
        if (in.op == input) return 1;
        if (in.type != ValueType::kInt || in.args.size() != 2) return 0;
        const bool scalar0 = shape[in.args[0]] == Shape::kScalar;
        const bool scalar1 = shape[in.args[1]] == Shape::kScalar;
        if (in.op == Op::kAdd) return (of[in.args[0]] && scalar1) || (scalar0 && of[in.args[1]]);
        if (in.op == Op::kSub) return of[in.args[0]] && scalar1;
        return 0;
      };
      q_affine[k] = affine(Op::kQIdx, q_affine);
      kv_affine[k] = affine(Op::kKvIdx, kv_affine);
      (s == Shape::kScore ? score_code : chunk_code).push_back(static_cast<int32_t>(k));
    }
    const bool per_element =
        std::any_of(shape.begin(), shape.end(), [](Shape s) { return s == Shape::kFull; });
    chunk_rows = per_element || lanes + kMaxChunkRows - 1 > kMaxLanes ? kFullChunkRows
                                                                       : kMaxChunkRows;
    for (size_t k = 0; k < n; ++k) {
      // Whole 64-byte lines per instruction: a vector access that straddles two cache lines
      // costs two, which made misaligned score buffers the evaluation's largest cost.
      const int64_t size = (extent(shape[k]) + kPad + kPad - 1) / kPad * kPad;
      int64_t& next = program.code[k].type == ValueType::kFloat ? f_size : i_size;
      offset[k] = next;
      next += size;
    }
    // score_mod(score) = score + X, X + score or score - X with X independent of score:
    // ApplyScoreMod adds X's lanes to the row in one loop (ALiBi, relative position).
    const Instr& result = program.code[program.result];
    if ((result.op == Op::kAdd || result.op == Op::kSub) &&
        shape[program.result] == Shape::kScore) {
      auto is_score = [&](int32_t a) { return program.code[a].op == Op::kScore; };
      const int32_t x = result.args[0], y = result.args[1];
      if (is_score(x) && shape[y] != Shape::kScore) {
        bias = y;
        bias_subtracted = result.op == Op::kSub;
      } else if (result.op == Op::kAdd && is_score(y) && shape[x] != Shape::kScore) {
        bias = x;
      }
    }
    find_score_chain();
    // (Highway refuses empty allocations: programs may have no float or no int values.)
    f = hwy::AllocateAligned<float>(static_cast<size_t>(std::max<int64_t>(f_size, 1)));
    i = hwy::AllocateAligned<int64_t>(static_cast<size_t>(std::max<int64_t>(i_size, 1)));
    SDPA_CHECK(f && i, "flex: out of memory for the evaluator's buffers");
    std::fill(f.get(), f.get() + f_size, 0.0f);
    std::fill(i.get(), i.get() + i_size, int64_t{0});
    reciprocal.assign(n, {std::numeric_limits<float>::quiet_NaN(), 0.0f});
    row_f.assign(n * static_cast<size_t>(lanes), 0.0f);
    row_i.assign(n * static_cast<size_t>(lanes), 0);
    bad_full.assign(static_cast<size_t>(chunk_rows * lanes), 0);
    bad_col.assign(static_cast<size_t>(diagonals()), 0);
    bad_diag.assign(static_cast<size_t>(diagonals()), 0);
  }

  /// One step of a score chain: value = op(value) or op(value, operand) (operand_first:
  /// op(operand, value)), `instr` the instruction it evaluates.
  struct ChainStep {
    Op op;
    int32_t instr;
    int32_t operand = -1;  // -1: a unary op
    bool operand_first = false;
  };

  /// Fills score_chain when the score-reading part of the program is a chain of float
  /// element-wise operations, each reading the previous one's value (the first: score) and
  /// at most one operand independent of score, the last being the result (soft-capping:
  /// score / cap, tanh, times cap). eval_chain-inl.h then runs the chain over each vector of
  /// scores in registers instead of one pass over the rows per instruction.
  void find_score_chain() {
    const CompiledProgram& prog = *program;
    if (prog.outputs.size() > 1 || score_code.size() < 2 ||
        score_code.size() > kMaxChainSteps + 1 ||
        score_code.back() != prog.result || prog.code[score_code.front()].op != Op::kScore) {
      return;
    }
    std::vector<ChainStep> steps;
    int32_t previous = score_code.front();
    for (size_t i = 1; i < score_code.size(); ++i) {
      const int32_t k = score_code[i];
      const Instr& in = prog.code[k];
      if (in.type != ValueType::kFloat || !chain_op(in.op, in.args.size())) return;
      if (std::count(in.args.begin(), in.args.end(), previous) != 1) return;
      ChainStep step{in.op, k};
      for (size_t a = 0; a < in.args.size(); ++a) {
        const int32_t arg = in.args[a];
        if (arg == previous) continue;
        if (shape[arg] == Shape::kScore || prog.code[arg].type != ValueType::kFloat) return;
        step.operand = arg;
        step.operand_first = a == 0;
      }
      steps.push_back(step);
      previous = k;
    }
    score_chain = std::move(steps);
  }

  /// Element-wise float ops a score chain may hold, with their operand counts.
  static bool chain_op(Op op, size_t args) {
    switch (op) {
      case Op::kAdd:
      case Op::kSub:
      case Op::kMul:
      case Op::kDiv:
      case Op::kMin:
      case Op::kMax:
        return args == 2;
      case Op::kNeg:
      case Op::kAbs:
      case Op::kExp:
      case Op::kLog:
      case Op::kTanh:
      case Op::kSigmoid:
      case Op::kSqrt:
        return args == 1;
      default:
        return false;
    }
  }

  static bool is_comparison(Op op) {
    return op == Op::kLt || op == Op::kLe || op == Op::kGt || op == Op::kGe || op == Op::kEq ||
           op == Op::kNe;
  }

  /// Diagonals of a chunk: element (r, j) lies on diagonal j - r + chunk_rows - 1. Key
  /// lanes (kCol) are evaluated that far too, so a diagonal pass can read kv_idx + c at
  /// row chunk_rows - 1 for every diagonal.
  int64_t diagonals() const { return lanes + chunk_rows - 1; }

  /// Elements an instruction of shape `s` holds.
  int64_t extent(Shape s) const {
    switch (s) {
      case Shape::kScalar:
        return 1;
      case Shape::kRow:
        return chunk_rows;
      case Shape::kCol:
        return diagonals();
      case Shape::kDiag:
        return diagonals();
      case Shape::kFull:
        return chunk_rows * lanes;
      case Shape::kScore:
        return chunk_rows * lanes;
    }
    return 0;
  }

  const CompiledProgram* program;
  const std::vector<Captured>* captured;
  int64_t lanes;
  int64_t chunk_rows = kFullChunkRows;  // query rows per chunk (kFullChunkRows or kMaxChunkRows)
  std::vector<Shape> shape;                     // per instruction
  std::vector<int32_t> chunk_code, score_code;  // instructions without / with kScore shape
  std::vector<uint8_t> q_affine, kv_affine;     // per instruction: q_idx / kv_idx + scalar
  // Per kDiv instruction: its last uniform divisor and 1 / divisor (NaN: none yet; a NaN
  // divisor never matches and is recomputed, giving NaN quotients as division would).
  std::vector<std::pair<float, float>> reciprocal;
  std::vector<ChainStep> score_chain;       // the score part as a chain, else empty
  int32_t bias = -1;                       // the X of a score + X program, else -1
  bool bias_subtracted = false;            // score - X
  std::vector<int64_t> offset;             // per instruction: start of its values in f (float) or i
  hwy::AlignedFreeUniquePtr<float[]> f;    // float instructions' values
  hwy::AlignedFreeUniquePtr<int64_t[]> i;  // int and bool (0 / 1) instructions' values
  ScalarEvaluator scalar;                  // the float64 oracle (MATH; error reports)

  // The chunk whose index part (every instruction but kScore) is in f / i.
  int64_t chunk_b = -1, chunk_h = -1, chunk_q0 = -1, chunk_kv0 = -1;
  // Elements where the index part failed (captured read out of range, integer division by
  // zero): they hold 0 and are reported only if a kernel consumes them, because chunks
  // cover keys and queries that the call's masks may exclude.
  bool any_bad = false, bad_scalar = false;
  uint8_t bad_row[kMaxChunkRows] = {};
  std::vector<uint8_t> bad_col;   // [diagonals()]
  std::vector<uint8_t> bad_diag;  // [diagonals()]
  std::vector<uint8_t> bad_full;  // [chunk_rows, lanes]

  // The last EvaluateRow's row in its chunk and score lanes (MaterializeLanes reads them).
  int64_t last_row = 0;
  const float* last_scores = nullptr;
  // Instruction values of that row as lanes, filled by MaterializeLanes (the backward).
  std::vector<float> row_f;    // [instructions, lanes]
  std::vector<int64_t> row_i;  // [instructions, lanes]

  /// Values of an instruction in its shape's layout (the evaluator's storage).
  float* fvals(int32_t instr) { return f.get() + offset[instr]; }
  int64_t* ivals(int32_t instr) { return i.get() + offset[instr]; }
  /// Lanes of an instruction for the last evaluated row, valid after MaterializeLanes.
  float* floats(int32_t instr) { return row_f.data() + instr * lanes; }
  int64_t* ints(int32_t instr) { return row_i.data() + instr * lanes; }
};

}  // namespace sdpa::flex
