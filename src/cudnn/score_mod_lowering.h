#pragma once
// A flex score_mod program lowered to the pointwise operations of cuDNN's score_mod
// subgraph (the frontend's SDPA_attributes::set_score_mod): every SSA instruction becomes
// one node, its inputs the score, cuDNN's generated indices (GEN_INDEX on an axis of
// [B, H, L, S]), constants passed by value, and captured tensors read through broadcast
// strides. Programs with operations cuDNN cannot express are refused with the reason.
//
// The description holds no cuDNN types, so the lowering is tested without a GPU; the
// cuDNN backend builds the frontend nodes from it.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/backend_impl.h"
#include "sdpa/flex.h"

namespace sdpa::cudnn {

/// cuDNN pointwise modes a score_mod uses (PointwiseMode_t's ADD, SUB, ..., BINARY_SELECT).
enum class PointwiseOp : uint8_t {
  kAdd, kSub, kMul, kDiv, kMin, kMax, kNeg, kAbs, kExp, kLog, kTanh, kSigmoid, kSqrt,
  kIdentity, kLt, kLe, kGt, kGe, kEq, kNe, kAnd, kOr, kNot, kSelect,
};

/// cuDNN's name of a mode ("ADD", "CMP_LT", "BINARY_SELECT", ...).
const char* pointwise_name(PointwiseOp op);

struct LoweredNode {
  enum class Kind : uint8_t { kScore, kIndex, kConstant, kTensor, kOp };
  Kind kind = Kind::kOp;
  flex::ValueType type = flex::ValueType::kFloat;  ///< FLOAT, INT32 or BOOLEAN in cuDNN
  int axis = -1;          ///< kIndex: 0 batch, 1 head, 2 q_idx, 3 kv_idx
  double constant = 0.0;  ///< kConstant
  int slot = -1;          ///< kTensor: the program's captured tensor
  DType dtype = DType::kFloat32;  ///< kTensor: its element type
  /// kTensor: the captured tensor as a [B, H, L, S]-broadcast view (dims 1 and strides 0
  /// on the axes it is not indexed by), with the strides of the device copy cuDNN reads
  /// (the tensor's own on CUDA, contiguous ones for a host tensor copied per call).
  std::array<int64_t, 4> dims{1, 1, 1, 1};
  std::array<int64_t, 4> strides{0, 0, 0, 0};
  PointwiseOp op = PointwiseOp::kIdentity;  ///< kOp
  std::vector<int32_t> args;                ///< kOp: earlier nodes (kSelect: cond, a, b)
  /// Whether the result depends on this node (a derived program computes more outputs
  /// than the one lowered; the others are not built).
  bool live = true;
};

/// A lowered program: nodes in dependency order, `result` the new score.
struct LoweredScoreMod {
  std::vector<LoweredNode> nodes;
  int32_t result = -1;
  /// One node per live line: "%3 = SUB(%1, %2)  int", "%1 = GEN_INDEX(axis 2)  int".
  std::string to_string() const;
  /// A 64-bit hash of everything the built subgraph depends on (nodes, constants, tensor
  /// dims, strides and types): part of the graph cache's key.
  uint64_t fingerprint() const;
};

/// Lowers score_mod `program` for a call of sizes [B, Hq, L, S]. Returns false, adding
/// the reason, for what cuDNN's pointwise ops cannot express: integer floor division and
/// modulo (their rounding of negative operands), captured reads not indexed by distinct
/// b/h/q_idx/kv_idx inputs (cuDNN's score_mod has no gather), captured tensors smaller
/// than the call or of float64/int64 elements, and sizes or constants beyond int32.
bool lower_score_mod(const flex::Program& program, const std::array<int64_t, 4>& sizes,
                     LoweredScoreMod& lowered, Reasons& reasons);

/// The same for instruction `result` of a compiled program reading `captured` (a derived
/// gradient program): only the instructions `result` depends on are lowered.
bool lower_instructions(const flex::CompiledProgram& code, int32_t result,
                        const std::vector<flex::Captured>& captured,
                        const std::array<int64_t, 4>& sizes, LoweredScoreMod& lowered,
                        Reasons& reasons);

}  // namespace sdpa::cudnn
