// Emission of flex programs as CUDA C++ (flex_codegen.h).

#include "cuda/flex_codegen.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "flex/autodiff.h"
#include "flex/node.h"
#include "sdpa/error.h"

namespace sdpa::cuda {
namespace {

using flex::Instr;
using flex::Op;
using flex::ValueType;

const char* c_type(ValueType t) {
  switch (t) {
    case ValueType::kFloat: return "float";
    case ValueType::kInt: return "long long";
    case ValueType::kBool: return "bool";
  }
  return "float";
}

// An exact float32 literal (hex float), or the bit pattern for inf and NaN.
std::string float_literal(double value) {
  const float f = static_cast<float>(value);
  if (std::isnan(f)) return "__int_as_float(0x7fffffff)";
  if (std::isinf(f)) return f > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%af", static_cast<double>(f));
  return buf;
}

std::string int_literal(double value) {
  const int64_t i = static_cast<int64_t>(value);
  if (i == INT64_MIN) return "(-9223372036854775807ll - 1)";
  return "(" + std::to_string(i) + "ll)";
}

const char* load_of(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "sdpa_load_f32";
    case DType::kFloat16: return "sdpa_load_f16";
    case DType::kBFloat16: return "sdpa_load_bf16";
    case DType::kFloat64: return "sdpa_load_f64";
    case DType::kInt32: return "sdpa_load_i32";
    case DType::kInt64: return "sdpa_load_i64";
    case DType::kBool: return "sdpa_load_bool";
    default: break;
  }
  sdpa::detail::throw_error("flex codegen: captured tensors of dtype ", dtype_name(dtype),
                            " are not read on CUDA");
}

class Emitter {
 public:
  Emitter(const flex::CompiledProgram& code, const std::vector<flex::Captured>& captured,
          std::ostringstream& os)
      : code_(code), captured_(captured), os_(os) {}

  // Operand `k` of `in` as a value of type `want`.
  std::string arg(const Instr& in, size_t k, ValueType want) const {
    const int32_t a = in.args[k];
    const ValueType have = code_.code[static_cast<size_t>(a)].type;
    const std::string v = "v" + std::to_string(a);
    if (have == want) return v;
    if (want == ValueType::kFloat) {
      return have == ValueType::kBool ? "(" + v + " ? 1.0f : 0.0f)" : "static_cast<float>(" + v + ")";
    }
    if (want == ValueType::kInt) {
      return have == ValueType::kBool ? "static_cast<long long>(" + v + ")" : "sdpa_float_to_int(" + v + ")";
    }
    return "(" + v + " != 0)";
  }

  void read(size_t i, const Instr& in) {
    const Tensor& t = captured_[static_cast<size_t>(in.slot)].tensor();
    const std::string c = "captured[" + std::to_string(in.slot) + "]";
    const std::string v = "v" + std::to_string(i);
    os_ << "  " << c_type(in.type) << ' ' << v << " = 0;\n  {\n    long long off = 0;\n    bool ok = true;\n";
    for (size_t d = 0; d < in.args.size(); ++d) {
      const std::string index = arg(in, d, ValueType::kInt);
      os_ << "    { const long long i = " << index << "; ok = ok && sdpa_in_range(at, " << c << ", "
          << in.slot << ", " << d << ", i); off += i * " << c << ".strides[" << d << "]; }\n";
    }
    os_ << "    if (ok) " << v << " = " << load_of(t.dtype()) << '(' << c << ", off);\n  }\n";
  }

  std::string expr(const Instr& in) const {
    const ValueType t = in.type;
    const auto a = [&](size_t k) { return arg(in, k, t); };
    const bool ints = t == ValueType::kInt;
    switch (in.op) {
      case Op::kScore: return "score";
      case Op::kBatch: return "at.b";
      case Op::kHead: return "at.h";
      case Op::kQIdx: return "at.q_idx";
      case Op::kKvIdx: return "at.kv_idx";
      case Op::kConst:
        return t == ValueType::kFloat ? float_literal(in.constant)
               : t == ValueType::kInt ? int_literal(in.constant)
                                      : (in.constant != 0.0 ? "true" : "false");
      case Op::kAdd: return ints ? "sdpa_add(" + a(0) + ", " + a(1) + ")" : a(0) + " + " + a(1);
      case Op::kSub: return ints ? "sdpa_sub(" + a(0) + ", " + a(1) + ")" : a(0) + " - " + a(1);
      case Op::kMul: return ints ? "sdpa_mul(" + a(0) + ", " + a(1) + ")" : a(0) + " * " + a(1);
      case Op::kDiv: return arg(in, 0, ValueType::kFloat) + " / " + arg(in, 1, ValueType::kFloat);
      case Op::kMod: return "sdpa_floor_mod(at, " + a(0) + ", " + a(1) + ")";
      case Op::kFloorDiv: return "sdpa_floor_div(at, " + a(0) + ", " + a(1) + ")";
      case Op::kNeg: return ints ? "sdpa_neg(" + a(0) + ")" : "-" + a(0);
      case Op::kMin: return "(" + a(0) + " < " + a(1) + " ? " + a(0) + " : " + a(1) + ")";
      case Op::kMax: return "(" + a(0) + " > " + a(1) + " ? " + a(0) + " : " + a(1) + ")";
      case Op::kAbs: return ints ? "sdpa_abs(" + a(0) + ")" : "fabsf(" + a(0) + ")";
      case Op::kExp: return "expf(" + a(0) + ")";
      case Op::kLog: return "logf(" + a(0) + ")";
      case Op::kTanh: return "tanhf(" + a(0) + ")";
      case Op::kSigmoid: return "1.0f / (1.0f + expf(-" + a(0) + "))";
      case Op::kSqrt: return "sqrtf(" + a(0) + ")";
      case Op::kToFloat: return arg(in, 0, ValueType::kFloat);
      case Op::kFloor: return ints ? a(0) : "floorf(" + a(0) + ")";
      case Op::kCeil: return ints ? a(0) : "ceilf(" + a(0) + ")";
      case Op::kSin: return "sinf(" + a(0) + ")";
      case Op::kCos: return "cosf(" + a(0) + ")";
      case Op::kBitAnd: return t == ValueType::kBool ? a(0) + " && " + a(1) : a(0) + " & " + a(1);
      case Op::kBitOr: return t == ValueType::kBool ? a(0) + " || " + a(1) : a(0) + " | " + a(1);
      case Op::kBitXor: return t == ValueType::kBool ? a(0) + " != " + a(1) : a(0) + " ^ " + a(1);
      case Op::kBitNot: return t == ValueType::kBool ? "!" + a(0) : "~" + a(0);
      case Op::kShl: return "sdpa_shl(" + a(0) + ", " + a(1) + ")";
      case Op::kShr: return "sdpa_shr(" + a(0) + ", " + a(1) + ")";
      case Op::kLt: return compare(in, "<");
      case Op::kLe: return compare(in, "<=");
      case Op::kGt: return compare(in, ">");
      case Op::kGe: return compare(in, ">=");
      case Op::kEq: return compare(in, "==");
      case Op::kNe: return compare(in, "!=");
      case Op::kAnd: return a(0) + " && " + a(1);
      case Op::kOr: return a(0) + " || " + a(1);
      case Op::kNot: return "!" + a(0);
      case Op::kWhere:
        return "(" + arg(in, 0, ValueType::kBool) + " ? " + arg(in, 1, t) + " : " + arg(in, 2, t) + ")";
      case Op::kRead: break;
    }
    sdpa::detail::throw_error("flex codegen: no CUDA form for '", flex::op_name(in.op), "'");
  }

  // Comparisons compute in float when either operand is a float, else in int64.
  std::string compare(const Instr& in, const char* cmp) const {
    const auto type_of = [&](size_t k) { return code_.code[static_cast<size_t>(in.args[k])].type; };
    const ValueType t = type_of(0) == ValueType::kFloat || type_of(1) == ValueType::kFloat
                            ? ValueType::kFloat
                            : ValueType::kInt;
    return arg(in, 0, t) + " " + cmp + " " + arg(in, 1, t);
  }

  void function(int32_t result, const std::string& name) {
    std::vector<bool> live(code_.code.size(), false);
    live[static_cast<size_t>(result)] = true;
    for (size_t i = code_.code.size(); i-- > 0;) {
      if (!live[i]) continue;
      for (int32_t a : code_.code[i].args) live[static_cast<size_t>(a)] = true;
    }
    const ValueType type = code_.code[static_cast<size_t>(result)].type;
    os_ << "__device__ __forceinline__ " << c_type(type) << ' ' << name
        << "(float score, long long b, long long h, long long q_idx, long long kv_idx,\n"
        << "    const SdpaCapturedTensor* captured, SdpaFlexStatus* status) {\n"
        << "  const SdpaAt at{b, h, q_idx, kv_idx, status};\n"
        << "  (void)score; (void)captured; (void)at;\n";
    for (size_t i = 0; i < code_.code.size(); ++i) {
      if (!live[i]) continue;
      const Instr& in = code_.code[i];
      if (in.op == Op::kRead) {
        read(i, in);
      } else {
        os_ << "  const " << c_type(in.type) << " v" << i << " = " << expr(in) << ";\n";
      }
    }
    os_ << "  return v" << result << ";\n}\n\n";
  }

 private:
  const flex::CompiledProgram& code_;
  const std::vector<flex::Captured>& captured_;
  std::ostringstream& os_;
};

const char* kIdentityFunctions[] = {
    "__device__ __forceinline__ float sdpa_score_mod(float score, long long, long long,\n"
    "    long long, long long, const SdpaCapturedTensor*, SdpaFlexStatus*) {\n"
    "  return score;\n}\n\n",
    "__device__ __forceinline__ float sdpa_score_mod_grad(float, long long, long long,\n"
    "    long long, long long, const SdpaCapturedTensor*, SdpaFlexStatus*) {\n"
    "  return 1.0f;\n}\n\n",
    "__device__ __forceinline__ bool sdpa_mask_mod(float, long long, long long, long long,\n"
    "    long long, const SdpaCapturedTensor*, SdpaFlexStatus*) {\n"
    "  return true;\n}\n\n",
};

}  // namespace

std::string emit_device_function(const flex::CompiledProgram& code, int32_t result,
                                 const std::vector<flex::Captured>& captured,
                                 const std::string& name) {
  std::ostringstream os;
  Emitter(code, captured, os).function(result, name);
  return os.str();
}

std::string flex_translation_unit(const flex::Program* score_mod, const flex::Program* mask_mod,
                                  bool with_gradient) {
  std::string unit = flex_prelude() + "\n";
  if (score_mod != nullptr) {
    unit += emit_device_function(*score_mod->compiled(), score_mod->compiled()->result,
                                 score_mod->captured(), "sdpa_score_mod");
  } else {
    unit += kIdentityFunctions[0];
  }
  if (with_gradient && score_mod != nullptr) {
    const flex::GradientProgram d = flex::differentiate(*score_mod);
    const flex::CompiledProgram code = d.in_slots_of(score_mod->captured());
    unit += emit_device_function(code, d.d_score, score_mod->captured(), "sdpa_score_mod_grad");
  } else if (with_gradient) {
    unit += kIdentityFunctions[1];
  }
  if (mask_mod != nullptr) {
    unit += emit_device_function(*mask_mod->compiled(), mask_mod->compiled()->result,
                                 mask_mod->captured(), "sdpa_mask_mod");
  } else {
    unit += kIdentityFunctions[2];
  }
  return unit;
}

}  // namespace sdpa::cuda
