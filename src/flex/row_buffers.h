#pragma once
// Per-thread storage for evaluating a flex program over one tile row.

#include <cstdint>
#include <vector>

#include "flex/eval_scalar.h"

namespace sdpa::flex {

/// Lane buffers for every instruction (float lanes for float values, int64 lanes for int
/// and bool) plus a scalar evaluator for the row-uniform instructions.
struct RowBuffers {
  RowBuffers(const CompiledProgram& program, const std::vector<Captured>& captured,
             int64_t lanes)
      : program(&program),
        captured(&captured),
        lanes(lanes),
        f(program.code.size() * lanes),
        i(program.code.size() * lanes),
        scalar(program, captured) {}

  const CompiledProgram* program;
  const std::vector<Captured>* captured;
  int64_t lanes;
  std::vector<float> f;
  std::vector<int64_t> i;
  ScalarEvaluator scalar;  // row-uniform instructions; also full scalar evaluation (MATH)

  float* floats(int32_t instr) { return f.data() + instr * lanes; }
  int64_t* ints(int32_t instr) { return i.data() + instr * lanes; }
};

}  // namespace sdpa::flex
