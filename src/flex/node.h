#pragma once
// Expression graph nodes and the compiled (linearized) program form. Internal.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sdpa/flex.h"

namespace sdpa::flex {

enum class Op : uint8_t {
  // inputs
  kScore, kBatch, kHead, kQIdx, kKvIdx, kConst, kRead,
  // arithmetic
  kAdd, kSub, kMul, kDiv, kMod, kFloorDiv, kNeg, kMin, kMax, kAbs,
  kExp, kLog, kTanh, kSigmoid, kSqrt, kToFloat, kFloor, kCeil, kSin, kCos,
  // integer bit operations (int64, two's complement)
  kBitAnd, kBitOr, kBitXor, kBitNot, kShl, kShr,
  // comparisons and logic
  kLt, kLe, kGt, kGe, kEq, kNe, kAnd, kOr, kNot, kWhere,
};

/// Op name as printed ("add", "q_idx", ...).
const char* op_name(Op op);

struct CapturedData {
  std::string name;
  Tensor tensor;
  bool requires_grad = false;
};

struct Node {
  Op op;
  ValueType type;
  double constant = 0.0;                         // kConst
  std::shared_ptr<const CapturedData> captured;  // kRead
  std::vector<std::shared_ptr<const Node>> args; // operands (kRead: the indices)
};

/// One SSA instruction: operands refer to earlier instructions by position.
struct Instr {
  Op op;
  ValueType type;
  std::vector<int32_t> args;
  double constant = 0.0;
  int32_t slot = -1;     // kRead: index into the program's captured tensors
  bool uniform = false;  // depends only on b, h, q_idx and constants (not score / kv_idx)
};

/// A linearized program; shared between Programs of the same structure (the cache).
struct CompiledProgram {
  std::vector<Instr> code;
  int32_t result = -1;
  std::vector<int32_t> outputs;  // every root of a multi-output program (result first)
  bool is_mask = false;
  bool uses_score = false, uses_batch = false, uses_head = false, uses_q = false,
       uses_kv = false;
  uint64_t hash = 0;
};

/// Linearizes `root` (deduplicating shared subexpressions) and type-checks the result
/// (float for score_mod, bool for mask_mod). Reuses a cached form of equal structure.
/// Returns the compiled code and the captured tensors in slot order.
std::shared_ptr<const CompiledProgram> compile(const Expr& root, bool is_mask,
                                               std::vector<Captured>* captured);

/// Linearizes several roots into one program whose `outputs` are their instructions
/// (float, int or bool). Used for derived backward programs; not cached.
std::shared_ptr<const CompiledProgram> compile_outputs(const std::vector<Expr>& roots,
                                                       std::vector<Captured>* captured);

/// Placeholders handed to mods.
Expr input(Op op);

/// Throws sdpa::Error naming the tensor unless every captured tensor of `program` can be
/// read where `device` computes: on the CPU for CPU work (`what` says which), on the CPU
/// or that CUDA device for CUDA calls (the GPU backends copy host tensors over).
void require_captured_on(const Program& program, Device device, const char* what);

}  // namespace sdpa::flex
