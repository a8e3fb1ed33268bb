// Lowering of flex score_mod programs to cuDNN pointwise nodes (score_mod_lowering.h).

#include "cudnn/score_mod_lowering.h"

#include <bit>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/fnv.h"
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
                const std::vector<flex::Captured>& captured, const std::array<int64_t, 4>& sizes,
                LoweredNode& node, Reasons& r) {
  const Tensor& t = captured[static_cast<size_t>(in.slot)].tensor();
  const std::string& name = captured[static_cast<size_t>(in.slot)].name();
  if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kFloat16 &&
      t.dtype() != DType::kBFloat16 && t.dtype() != DType::kInt32) {
    r.add("flex: captured tensor '", name, "' is ", std::string(dtype_name(t.dtype())),
          "; cuDNN's score_mod reads float32/float16/bfloat16/int32 tensors");
    return false;
  }
  node.kind = Kind::kTensor;
  node.slot = in.slot;
  node.dtype = t.dtype();
  // A host tensor is copied per call to a contiguous device tensor: cuDNN reads that.
  const bool on_device = t.device().type == DeviceType::kCUDA;
  std::vector<int64_t> strides(static_cast<size_t>(t.dim()));
  for (int64_t d = t.dim() - 1, step = 1; d >= 0; --d) {
    strides[static_cast<size_t>(d)] = on_device ? t.stride(d) : step;
    step *= t.size(d);
  }
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
    node.strides[axis] = strides[i];
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
  if (program.is_mask()) {
    r.add("flex: a mask_mod is not a score_mod");
    return false;
  }
  const flex::CompiledProgram& code = *program.compiled();
  return lower_instructions(code, code.result, program.captured(), sizes, lowered, r);
}

bool lower_instructions(const flex::CompiledProgram& code, int32_t result,
                        const std::vector<flex::Captured>& captured,
                        const std::array<int64_t, 4>& sizes, LoweredScoreMod& lowered,
                        Reasons& r) {
  for (int64_t extent : sizes) {
    if (extent > kInt32Max) {
      r.add("flex: cuDNN generates int32 indices; the call has a dimension of ",
            std::to_string(extent));
      return false;
    }
  }
  lowered = LoweredScoreMod{};
  lowered.nodes.resize(code.code.size());
  // Instructions are in dependency order: walking back from the result marks what it reads.
  std::vector<bool> live(code.code.size(), false);
  live[static_cast<size_t>(result)] = true;
  for (size_t i = code.code.size(); i-- > 0;) {
    if (!live[i]) continue;
    for (int32_t a : code.code[i].args) live[static_cast<size_t>(a)] = true;
  }
  bool ok = true;
  for (size_t i = 0; i < code.code.size(); ++i) {
    const flex::Instr& in = code.code[i];
    LoweredNode& node = lowered.nodes[i];
    node.live = live[i];
    node.type = in.type;
    if (!node.live) continue;
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
      } else if (in.type == flex::ValueType::kBool) {
        r.add("flex: a boolean constant has no cuDNN scalar form");
        ok = false;
      }
    } else if (in.op == Op::kRead) {
      ok = lower_read(code, in, captured, sizes, node, r) && ok;
    } else if (op_of(in.op, node.op)) {
      node.kind = Kind::kOp;
      node.args = in.args;
    } else {
      r.add("flex: '", flex::op_name(in.op), "' has no exact cuDNN pointwise form (integer "
            "floor division and modulo round negative operands differently)");
      ok = false;
    }
  }
  lowered.result = result;
  return ok;
}

uint64_t LoweredScoreMod::fingerprint() const {
  sdpa::detail::Fnv1a hash;
  const auto mix = [&hash](uint64_t v) { hash.word(v); };
  mix(static_cast<uint64_t>(result));
  for (const LoweredNode& n : nodes) {
    mix(n.live);
    if (!n.live) continue;
    mix(static_cast<uint64_t>(n.kind) | static_cast<uint64_t>(n.type) << 8 |
        static_cast<uint64_t>(n.op) << 16 | static_cast<uint64_t>(n.dtype) << 24);
    mix(static_cast<uint64_t>(n.axis));
    mix(std::bit_cast<uint64_t>(n.constant));
    mix(static_cast<uint64_t>(n.slot));
    for (int64_t d : n.dims) mix(static_cast<uint64_t>(d));
    for (int64_t s : n.strides) mix(static_cast<uint64_t>(s));
    for (int32_t a : n.args) mix(static_cast<uint64_t>(a));
    mix(n.args.size());
  }
  return hash.value;
}

std::string LoweredScoreMod::to_string() const {
  static constexpr const char* kAxes[] = {"b", "h", "q_idx", "kv_idx"};
  std::ostringstream os;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const LoweredNode& n = nodes[i];
    if (!n.live) continue;
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
