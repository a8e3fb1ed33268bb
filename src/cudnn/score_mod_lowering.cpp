// Lowering of flex score_mod programs to cuDNN pointwise nodes (score_mod_lowering.h).

#include "cudnn/score_mod_lowering.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "flex/node.h"

namespace sdpa::cudnn {
namespace {

using flex::Op;
using Kind = LoweredNode::Kind;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

bool op_of(Op op, PointwiseOp& out) {
  switch (op) {
    case Op::kAdd: out = PointwiseOp::kAdd; return true;
    case Op::kSub: out = PointwiseOp::kSub; return true;
    case Op::kMul: out = PointwiseOp::kMul; return true;
    case Op::kDiv: out = PointwiseOp::kDiv; return true;
    case Op::kMin: out = PointwiseOp::kMin; return true;
    case Op::kMax: out = PointwiseOp::kMax; return true;
    case Op::kNeg: out = PointwiseOp::kNeg; return true;
    case Op::kAbs: out = PointwiseOp::kAbs; return true;
    case Op::kExp: out = PointwiseOp::kExp; return true;
    case Op::kLog: out = PointwiseOp::kLog; return true;
    case Op::kTanh: out = PointwiseOp::kTanh; return true;
    case Op::kSigmoid: out = PointwiseOp::kSigmoid; return true;
    case Op::kSqrt: out = PointwiseOp::kSqrt; return true;
    case Op::kToFloat: out = PointwiseOp::kIdentity; return true;
    case Op::kLt: out = PointwiseOp::kLt; return true;
    case Op::kLe: out = PointwiseOp::kLe; return true;
    case Op::kGt: out = PointwiseOp::kGt; return true;
    case Op::kGe: out = PointwiseOp::kGe; return true;
    case Op::kEq: out = PointwiseOp::kEq; return true;
    case Op::kNe: out = PointwiseOp::kNe; return true;
    case Op::kAnd: out = PointwiseOp::kAnd; return true;
    case Op::kOr: out = PointwiseOp::kOr; return true;
    case Op::kNot: out = PointwiseOp::kNot; return true;
    case Op::kWhere: out = PointwiseOp::kSelect; return true;
    default: return false;
  }
}

int axis_of(Op op) {
  switch (op) {
    case Op::kBatch: return 0;
    case Op::kHead: return 1;
    case Op::kQIdx: return 2;
    case Op::kKvIdx: return 3;
    default: return -1;
  }
}

// A captured read t[i0][i1]... whose indices are distinct b/h/q_idx/kv_idx inputs becomes
// a broadcast tensor; anything else would need a gather.
bool lower_read(const flex::CompiledProgram& code, const flex::Instr& in,
                const flex::Program& program, const std::array<int64_t, 4>& sizes,
                LoweredNode& node, Reasons& r) {
  const Tensor& t = program.captured()[static_cast<size_t>(in.slot)].tensor();
  const std::string& name = program.captured()[static_cast<size_t>(in.slot)].name();
  if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kFloat16 &&
      t.dtype() != DType::kBFloat16 && t.dtype() != DType::kInt32) {
    r.add("flex: captured tensor '", name, "' is ", std::string(dtype_name(t.dtype())),
          "; cuDNN's score_mod reads float32/float16/bfloat16/int32 tensors");
    return false;
  }
  node.kind = Kind::kTensor;
  node.slot = in.slot;
  bool used[4] = {false, false, false, false};
  for (size_t i = 0; i < in.args.size(); ++i) {
    const int axis = axis_of(code.code[static_cast<size_t>(in.args[i])].op);
    if (axis < 0 || used[axis]) {
      r.add("flex: captured tensor '", name, "' is indexed by a computed value; cuDNN's "
            "score_mod has no gather (only reads indexed directly by distinct b, h, q_idx, "
            "kv_idx lower)");
      return false;
    }
    if (t.size(static_cast<int64_t>(i)) < sizes[axis]) {
      r.add("flex: captured tensor '", name, "' has ", std::to_string(t.size(static_cast<int64_t>(i))),
            " entries along dimension ", std::to_string(i), ", fewer than the call's ",
            std::to_string(sizes[axis]));
      return false;
    }
    used[axis] = true;
    node.dims[axis] = sizes[axis];
    node.strides[axis] = t.stride(static_cast<int64_t>(i));
  }
  return true;
}

const char* type_name(flex::ValueType t) {
  switch (t) {
    case flex::ValueType::kFloat: return "float";
    case flex::ValueType::kInt: return "int32";
    case flex::ValueType::kBool: return "bool";
  }
  return "?";
}

}  // namespace

const char* pointwise_name(PointwiseOp op) {
  static constexpr const char* kNames[] = {
      "ADD",    "SUB",    "MUL",    "DIV",    "MIN",     "MAX",     "NEG",     "ABS",
      "EXP",    "LOG",    "TANH_FWD", "SIGMOID_FWD", "SQRT", "IDENTITY", "CMP_LT", "CMP_LE",
      "CMP_GT", "CMP_GE", "CMP_EQ", "CMP_NEQ", "LOGICAL_AND", "LOGICAL_OR", "LOGICAL_NOT",
      "BINARY_SELECT"};
  return kNames[static_cast<size_t>(op)];
}

bool lower_score_mod(const flex::Program& program, const std::array<int64_t, 4>& sizes,
                     LoweredScoreMod& lowered, Reasons& r) {
  const flex::CompiledProgram& code = *program.compiled();
  if (program.is_mask()) {
    r.add("flex: a mask_mod is not a score_mod");
    return false;
  }
  for (int64_t extent : sizes) {
    if (extent > kInt32Max) {
      r.add("flex: cuDNN generates int32 indices; the call has a dimension of ",
            std::to_string(extent));
      return false;
    }
  }
  lowered = LoweredScoreMod{};
  lowered.nodes.reserve(code.code.size());
  bool ok = true;
  for (const flex::Instr& in : code.code) {
    LoweredNode node;
    node.type = in.type;
    if (in.op == Op::kScore) {
      node.kind = Kind::kScore;
    } else if (axis_of(in.op) >= 0) {
      node.kind = Kind::kIndex;
      node.axis = axis_of(in.op);
    } else if (in.op == Op::kConst) {
      node.kind = Kind::kConstant;
      node.constant = in.constant;
      if (in.type == flex::ValueType::kInt && std::fabs(in.constant) > kInt32Max) {
        r.add("flex: the integer constant ", std::to_string(in.constant),
              " does not fit cuDNN's int32");
        ok = false;
      }
    } else if (in.op == Op::kRead) {
      ok = lower_read(code, in, program, sizes, node, r) && ok;
    } else if (op_of(in.op, node.op)) {
      node.kind = Kind::kOp;
      node.args = in.args;
    } else {
      r.add("flex: '", flex::op_name(in.op), "' has no exact cuDNN pointwise form (integer "
            "floor division and modulo round negative operands differently)");
      ok = false;
    }
    lowered.nodes.push_back(std::move(node));
  }
  lowered.result = code.result;
  return ok;
}

std::string LoweredScoreMod::to_string() const {
  static constexpr const char* kAxes[] = {"b", "h", "q_idx", "kv_idx"};
  std::ostringstream os;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const LoweredNode& n = nodes[i];
    os << '%' << i << " = ";
    switch (n.kind) {
      case Kind::kScore: os << "score"; break;
      case Kind::kIndex: os << "GEN_INDEX(axis " << n.axis << ": " << kAxes[n.axis] << ")"; break;
      case Kind::kConstant: os << "constant " << n.constant; break;
      case Kind::kTensor:
        os << "tensor slot " << n.slot << " dims [" << n.dims[0] << ", " << n.dims[1] << ", "
           << n.dims[2] << ", " << n.dims[3] << "] strides [" << n.strides[0] << ", "
           << n.strides[1] << ", " << n.strides[2] << ", " << n.strides[3] << "]";
        break;
      case Kind::kOp:
        os << pointwise_name(n.op) << '(';
        for (size_t a = 0; a < n.args.size(); ++a) os << (a ? ", %" : "%") << n.args[a];
        os << ')';
        break;
    }
    os << "  " << type_name(n.type) << (static_cast<int32_t>(i) == result ? "  (result)" : "")
       << '\n';
  }
  return os.str();
}

}  // namespace sdpa::cudnn
