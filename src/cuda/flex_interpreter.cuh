#pragma once
// Flex programs evaluated by interpretation in CUDA kernels: MATH on CUDA, the GPU's
// reference path, runs any score_mod / mask_mod without NVRTC by walking the program's
// linear instructions (flex/node.h's CompiledProgram, flattened by flex_device_program.h)
// per element in float64, as the CPU's MATH evaluates them (flex/eval_scalar.cpp): ints as
// int64 with Python's floor division and modulo and torch's shifts, bools as 0/1, captured
// tensors read through their strides with every index checked. A device cannot throw: the
// first out-of-range read or integer division by zero is recorded in a Status for the host
// to raise, and evaluates to 0. Plain C++ that also compiles for the host, where the tests
// run it against the CPU's evaluator (tests/cuda/flex_interpreter_test.cpp).

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define SDPA_FLEX_FN __host__ __device__ inline
#else
#define SDPA_FLEX_FN inline
#endif

namespace sdpa::cuda::flex_interp {

/// Instruction codes: flex::Op's values (flex_device_program.cpp checks that they agree).
enum Opcode : uint8_t {
  kScore,
  kBatch,
  kHead,
  kQIdx,
  kKvIdx,
  kConst,
  kRead,
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMod,
  kFloorDiv,
  kNeg,
  kMin,
  kMax,
  kAbs,
  kExp,
  kLog,
  kTanh,
  kSigmoid,
  kSqrt,
  kToFloat,
  kFloor,
  kCeil,
  kSin,
  kCos,
  kBitAnd,
  kBitOr,
  kBitXor,
  kBitNot,
  kShl,
  kShr,
  kLt,
  kLe,
  kGt,
  kGe,
  kEq,
  kNe,
  kAnd,
  kOr,
  kNot,
  kWhere,
};

/// Element types of captured tensors: sdpa::DType's values (float8 tensors are refused).
enum ElementType : int {
  kF32 = 0,
  kF64 = 1,
  kBF16 = 2,
  kF16 = 3,
  kBoolean = 4,
  kI32 = 5,
  kI64 = 6
};

/// Longest program interpreted: each thread keeps one float64 value per instruction.
constexpr int kMaxInstructions = 128;

struct Instr {
  double constant;    // kConst
  int32_t first_arg;  // operands: args[first_arg, first_arg + arg_count) of the Program
  int32_t slot;       // kRead: the captured tensor
  uint8_t op;
  uint8_t arg_count;
};

/// A captured tensor as the interpreter reads it (strides in elements).
struct CapturedTensor {
  const void* data;
  int64_t sizes[8];
  int64_t strides[8];
  int dim;
  int dtype;  // ElementType
};

/// The first failure of a launch: code 1 an out-of-range captured read (slot, dimension,
/// index), 2 an integer division by zero; where it happened.
struct Status {
  int code;
  int slot;
  int dim;
  int64_t index;
  int64_t b, h, q_idx, kv_idx;
};

/// One program: `count` instructions, operands by instruction position, the captured
/// tensors by slot, the result's position. count == 0: no program.
struct Program {
  const Instr* code;
  const int32_t* args;
  const CapturedTensor* captured;
  int count;
  int result;
};

SDPA_FLEX_FN float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = ldexpf(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign != 0 ? -magnitude : magnitude;
}

SDPA_FLEX_FN double load(const CapturedTensor& t, int64_t offset) {
  switch (t.dtype) {
    case kF32:
      return static_cast<const float*>(t.data)[offset];
    case kF64:
      return static_cast<const double*>(t.data)[offset];
    case kBF16: {
      const uint32_t bits = static_cast<const uint16_t*>(t.data)[offset];
      float value;
      const uint32_t word = bits << 16;
      memcpy(&value, &word, sizeof value);
      return value;
    }
    case kF16:
      return half_to_float(static_cast<const uint16_t*>(t.data)[offset]);
    case kBoolean:
      return static_cast<const uint8_t*>(t.data)[offset] != 0 ? 1.0 : 0.0;
    case kI32:
      return static_cast<const int32_t*>(t.data)[offset];
    default:
      return static_cast<double>(static_cast<const int64_t*>(t.data)[offset]);
  }
}

/// Truncation to int64 as x86's cvttsd2si (the CPU evaluators' rule): NaN and values
/// outside int64's range give INT64_MIN.
SDPA_FLEX_FN int64_t to_int64(double x) {
  if (!(x >= -0x1p63 && x < 0x1p63)) return INT64_MIN;
  return static_cast<int64_t>(x);
}

/// Where one evaluation happens, and where its failure goes.
struct Site {
  int64_t b, h, q_idx, kv_idx;
  Status* status;

  SDPA_FLEX_FN void fail(int code, int slot, int dim, int64_t index) const {
#ifdef __CUDA_ARCH__
    if (atomicCAS(&status->code, 0, code) != 0) return;
#else
    if (status->code != 0) return;
    status->code = code;
#endif
    status->slot = slot;
    status->dim = dim;
    status->index = index;
    status->b = b;
    status->h = h;
    status->q_idx = q_idx;
    status->kv_idx = kv_idx;
  }
};

/// Python's floor division and modulo of int64 (INT64_MIN / -1 wraps, as numpy and
/// torch); a zero divisor is a failure (code 2) giving 0.
SDPA_FLEX_FN int64_t floor_div(int64_t a, int64_t b, const Site& at) {
  if (b == 0) {
    at.fail(2, -1, -1, 0);
    return 0;
  }
  if (b == -1) return a == INT64_MIN ? a : -a;
  int64_t q = a / b;
  if (a % b != 0 && (a < 0) != (b < 0)) --q;
  return q;
}

SDPA_FLEX_FN int64_t floor_mod(int64_t a, int64_t b, const Site& at) {
  if (b == -1) return 0;
  const uint64_t product = static_cast<uint64_t>(floor_div(a, b, at)) * static_cast<uint64_t>(b);
  return static_cast<int64_t>(static_cast<uint64_t>(a) - product);
}

SDPA_FLEX_FN int64_t shift_left(int64_t a, int64_t n) {
  return n < 0 || n > 63 ? 0 : static_cast<int64_t>(static_cast<uint64_t>(a) << n);
}
SDPA_FLEX_FN int64_t shift_right(int64_t a, int64_t n) {
  return n < 0 || n > 63 ? (a < 0 ? -1 : 0) : a >> n;
}

/// Instruction `in` of `p` given the values of the instructions before it.
SDPA_FLEX_FN double step(const Program& p, const Instr& in, const double* values, double score,
                         const Site& at) {
  const int32_t* args = p.args + in.first_arg;
  const double x = in.arg_count > 0 ? values[args[0]] : 0.0;
  const double y = in.arg_count > 1 ? values[args[1]] : 0.0;
  switch (in.op) {
    case kScore:
      return score;
    case kBatch:
      return static_cast<double>(at.b);
    case kHead:
      return static_cast<double>(at.h);
    case kQIdx:
      return static_cast<double>(at.q_idx);
    case kKvIdx:
      return static_cast<double>(at.kv_idx);
    case kConst:
      return in.constant;
    case kRead: {
      const CapturedTensor& t = p.captured[in.slot];
      int64_t offset = 0;
      for (int d = 0; d < in.arg_count; ++d) {
        const int64_t index = to_int64(values[args[d]]);
        if (index < 0 || index >= t.sizes[d]) {
          at.fail(1, in.slot, d, index);
          return 0.0;
        }
        offset += index * t.strides[d];
      }
      return load(t, offset);
    }
    case kAdd:
      return x + y;
    case kSub:
      return x - y;
    case kMul:
      return x * y;
    case kDiv:
      return x / y;
    case kMod:
      return static_cast<double>(floor_mod(to_int64(x), to_int64(y), at));
    case kFloorDiv:
      return static_cast<double>(floor_div(to_int64(x), to_int64(y), at));
    case kNeg:
      return -x;
    case kMin:
      return fmin(x, y);
    case kMax:
      return fmax(x, y);
    case kAbs:
      return fabs(x);
    case kExp:
      return exp(x);
    case kLog:
      return log(x);
    case kTanh:
      return tanh(x);
    case kSigmoid:
      return 1.0 / (1.0 + exp(-x));
    case kSqrt:
      return sqrt(x);
    case kToFloat:
      return x;
    case kFloor:
      return floor(x);
    case kCeil:
      return ceil(x);
    case kSin:
      return sin(x);
    case kCos:
      return cos(x);
    case kBitAnd:
      return static_cast<double>(to_int64(x) & to_int64(y));
    case kBitOr:
      return static_cast<double>(to_int64(x) | to_int64(y));
    case kBitXor:
      return static_cast<double>(to_int64(x) ^ to_int64(y));
    case kBitNot:
      return static_cast<double>(~to_int64(x));
    case kShl:
      return static_cast<double>(shift_left(to_int64(x), to_int64(y)));
    case kShr:
      return static_cast<double>(shift_right(to_int64(x), to_int64(y)));
    case kLt:
      return x < y ? 1.0 : 0.0;
    case kLe:
      return x <= y ? 1.0 : 0.0;
    case kGt:
      return x > y ? 1.0 : 0.0;
    case kGe:
      return x >= y ? 1.0 : 0.0;
    case kEq:
      return x == y ? 1.0 : 0.0;
    case kNe:
      return x != y ? 1.0 : 0.0;
    case kAnd:
      return x != 0.0 && y != 0.0 ? 1.0 : 0.0;
    case kOr:
      return x != 0.0 || y != 0.0 ? 1.0 : 0.0;
    case kNot:
      return x != 0.0 ? 0.0 : 1.0;
    case kWhere:
      return x != 0.0 ? y : values[args[2]];
    default:
      return 0.0;
  }
}

/// The program's result at `at` for `score` (bool as 0/1); `values` holds p.count doubles.
SDPA_FLEX_FN double evaluate(const Program& p, double score, const Site& at, double* values) {
  for (int i = 0; i < p.count; ++i) values[i] = step(p, p.code[i], values, score, at);
  return values[p.result];
}

}  // namespace sdpa::cuda::flex_interp

#undef SDPA_FLEX_FN
