#pragma once
// Reference evaluation of a program in float64, one (b, h, q_idx, kv_idx) at a time.
// The oracle for the row evaluator and the evaluator MATH uses.

#include <cstdint>
#include <vector>

#include "flex/node.h"

namespace sdpa::flex {

/// The index arguments of one evaluation of a mod.
struct ModIndex {
  int64_t b, h, q_idx, kv_idx;
};

/// Reads captured tensor `c` at `index` (already bounds-checked) as double.
double read_captured(const Captured& c, const int64_t* index);

/// Throws sdpa::Error describing an out-of-range captured read: `index` in dimension `dim`
/// of `c`, evaluating the mod at `at`.
[[noreturn]] void throw_out_of_range(const Captured& c, int64_t dim, int64_t index,
                                     const ModIndex& at);

/// Integer floor division / modulo with Python semantics; throws on division by zero.
int64_t floor_div_int(int64_t a, int64_t b);
int64_t floor_mod_int(int64_t a, int64_t b);

/// a << n and a >> n (arithmetic) of int64; a count outside [0, 63] gives 0 / the sign
/// fill, as torch and numpy do (C++ leaves such shifts undefined).
inline int64_t shift_left_int(int64_t a, int64_t n) {
  return n < 0 || n > 63 ? 0 : static_cast<int64_t>(static_cast<uint64_t>(a) << n);
}
inline int64_t shift_right_int(int64_t a, int64_t n) {
  return n < 0 || n > 63 ? (a < 0 ? -1 : 0) : a >> n;
}

class ScalarEvaluator {
 public:
  ScalarEvaluator(const CompiledProgram& program, const std::vector<Captured>& captured)
      : program_(program), captured_(captured), values_(program.code.size()) {}

  /// Evaluates every instruction; returns the result (bool as 0/1).
  double run(double score, int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx);
  /// Evaluates only the uniform instructions (those independent of score and kv_idx).
  void run_uniform(int64_t b, int64_t h, int64_t q_idx);
  /// Value of instruction i after the last run / run_uniform.
  double value(int32_t i) const { return values_[i]; }

 private:
  double step(const Instr& in, double score, const ModIndex& at) const;
  const CompiledProgram& program_;
  const std::vector<Captured>& captured_;
  std::vector<double> values_;
};

}  // namespace sdpa::flex
