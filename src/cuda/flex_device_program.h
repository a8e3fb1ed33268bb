#pragma once
// Flex programs prepared for the interpreter of CUDA kernels (cuda/flex_interpreter.cuh):
// flattened to plain arrays on the host, then copied with their captured tensors to the
// call's device.

#include <string>
#include <vector>

#include "cuda/flex_interpreter.cuh"
#include "sdpa/flex.h"
#include "sdpa/tensor.h"

namespace sdpa::flex {
struct CompiledProgram;
}

namespace sdpa::cuda {

/// A program's instructions and operand lists as flex_interp reads them.
struct FlatProgram {
  std::vector<flex_interp::Instr> code;
  std::vector<int32_t> args;
  int result = 0;
};

/// Instruction `result` of `code` and everything before it, flattened.
FlatProgram flatten(const flex::CompiledProgram& code, int32_t result);

/// `t` described for flex_interp (its data pointer as is: host or device memory).
flex_interp::CapturedTensor describe_captured(const Tensor& t);

/// "" when `program` can be interpreted on CUDA, else why not: more than
/// flex_interp::kMaxInstructions instructions, or a captured tensor of float8 or of more
/// than 8 dimensions.
std::string interpreter_unsupported(const flex::Program& program);

/// Whether any instruction of `code` (reading `captured`) may fail somewhere on the call's
/// indices b < batch, h < heads, q_idx < q_len, kv_idx < kv_len: a captured read that
/// interval analysis (flex/interval.h) cannot keep inside its tensor, or an integer
/// division or modulo by anything but a nonzero constant. Launches whose programs cannot
/// fail do not read their failure records back, so the call does not wait for its stream.
bool program_may_fail(const flex::CompiledProgram& code,
                      const std::vector<flex::Captured>& captured, int64_t batch, int64_t heads,
                      int64_t q_len, int64_t kv_len);
/// The same for a score_mod or mask_mod's result.
bool program_may_fail(const flex::Program& program, int64_t batch, int64_t heads, int64_t q_len,
                      int64_t kv_len);

/// The sdpa::Error message of failure record `status` of `program` ("score_mod" or
/// "mask_mod") reading `captured`: the tensor, index and dimension, or the division by
/// zero, and where (b, h, q_idx, kv_idx).
std::string flex_failure_message(const char* program, const flex_interp::Status& status,
                                 const std::vector<flex::Captured>& captured);

/// A program on a CUDA device for one call: its flattened arrays and its captured tensors
/// (host ones copied, device ones on `device` read in place), alive as long as this is.
class DeviceProgram {
 public:
  /// No program: view().count == 0.
  DeviceProgram() = default;
  /// Instruction `result` of `code`, reading `captured` (by slot), on `device`, copied on
  /// `stream`. interpreter_unsupported's conditions must hold.
  DeviceProgram(const flex::CompiledProgram& code, int32_t result,
                const std::vector<flex::Captured>& captured, Device device, void* stream);
  /// A score_mod or mask_mod's result.
  DeviceProgram(const flex::Program& program, Device device, void* stream);

  const flex_interp::Program& view() const { return view_; }

 private:
  std::vector<Tensor> keep_;
  flex_interp::Program view_{};
};

}  // namespace sdpa::cuda
