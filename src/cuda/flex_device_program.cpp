// Flex programs flattened and copied for the CUDA interpreter (flex_device_program.h).

#include "cuda/flex_device_program.h"

#include "cuda/copy.h"
#include "flex/interval.h"
#include "flex/node.h"
#include "sdpa/cuda.h"
#include "sdpa/error.h"

namespace sdpa::cuda {
namespace {

namespace fi = flex_interp;
using flex::Op;

static_assert(static_cast<int>(Op::kRead) == fi::kRead && static_cast<int>(Op::kCos) == fi::kCos &&
                  static_cast<int>(Op::kShr) == fi::kShr &&
                  static_cast<int>(Op::kWhere) == fi::kWhere,
              "flex_interp's opcodes are flex::Op's values");
static_assert(static_cast<int>(DType::kFloat16) == fi::kF16 &&
              static_cast<int>(DType::kBool) == fi::kBoolean &&
              static_cast<int>(DType::kInt64) == fi::kI64);

}  // namespace

FlatProgram flatten(const flex::CompiledProgram& code, int32_t result) {
  FlatProgram flat;
  flat.result = result;
  for (int32_t i = 0; i <= result; ++i) {
    const flex::Instr& in = code.code[static_cast<size_t>(i)];
    fi::Instr out{};
    out.constant = in.constant;
    out.first_arg = static_cast<int32_t>(flat.args.size());
    out.slot = in.slot;
    out.op = static_cast<uint8_t>(in.op);
    out.arg_count = static_cast<uint8_t>(in.args.size());
    flat.args.insert(flat.args.end(), in.args.begin(), in.args.end());
    flat.code.push_back(out);
  }
  return flat;
}

fi::CapturedTensor describe_captured(const Tensor& t) {
  fi::CapturedTensor d{};
  d.data = t.data_ptr();
  d.dim = static_cast<int>(t.dim());
  d.dtype = static_cast<int>(t.dtype());
  for (int64_t k = 0; k < t.dim() && k < 8; ++k) {
    d.sizes[k] = t.size(k);
    d.strides[k] = t.stride(k);
  }
  return d;
}

std::string interpreter_unsupported(const flex::Program& program) {
  const flex::CompiledProgram& code = *program.compiled();
  if (code.result + 1 > fi::kMaxInstructions) {
    return "the program has " + std::to_string(code.result + 1) +
           " instructions; MATH on CUDA "
           "interprets up to " +
           std::to_string(fi::kMaxInstructions);
  }
  for (const flex::Captured& c : program.captured()) {
    if (c.tensor().dtype() == DType::kFloat8E4M3FN || c.tensor().dim() > 8) {
      return "captured tensor '" + c.name() + "' is " +
             std::string(dtype_name(c.tensor().dtype())) + " of " +
             std::to_string(c.tensor().dim()) +
             " dimensions; MATH on CUDA reads "
             "captured tensors of other dtypes with at most 8";
    }
  }
  return "";
}

bool program_may_fail(const flex::CompiledProgram& code,
                      const std::vector<flex::Captured>& captured, int64_t batch, int64_t heads,
                      int64_t q_len, int64_t kv_len) {
  bool reads = false, uses_batch = false, uses_head = false;
  for (const flex::Instr& in : code.code) {  // every output: classify_block bounds them all
    if (in.op == Op::kFloorDiv || in.op == Op::kMod) {
      const flex::Instr& divisor = code.code[static_cast<size_t>(in.args[1])];
      if (divisor.op != Op::kConst || divisor.constant == 0.0) return true;
    }
    reads = reads || in.op == Op::kRead;
    uses_batch = uses_batch || in.op == Op::kBatch;
    uses_head = uses_head || in.op == Op::kHead;
  }
  if (!reads || q_len == 0 || kv_len == 0) return false;
  // One block per (b, h) the program reads; bounded so that the proof stays cheap.
  const int64_t bs = uses_batch ? batch : 1, hs = uses_head ? heads : 1;
  if (bs * hs > 4096) return true;
  for (int64_t b = 0; b < bs; ++b) {
    for (int64_t h = 0; h < hs; ++h) {
      bool in_bounds = true;
      flex::classify_block(code, captured, {b, h, 0, q_len - 1, 0, kv_len - 1}, &in_bounds);
      if (!in_bounds) return true;
    }
  }
  return false;
}

bool program_may_fail(const flex::Program& program, int64_t batch, int64_t heads, int64_t q_len,
                      int64_t kv_len) {
  return program_may_fail(*program.compiled(), program.captured(), batch, heads, q_len, kv_len);
}

std::string flex_failure_message(const char* program, const fi::Status& s,
                                 const std::vector<flex::Captured>& captured) {
  const std::string where = " (b=" + std::to_string(s.b) + ", h=" + std::to_string(s.h) +
                            ", q_idx=" + std::to_string(s.q_idx) +
                            ", kv_idx=" + std::to_string(s.kv_idx) + ")";
  const std::string what = std::string("flex ") + program + ": ";
  if (s.code == 2) return what + "integer division by zero" + where;
  const bool known = s.slot >= 0 && static_cast<size_t>(s.slot) < captured.size();
  const Tensor* t = known ? &captured[static_cast<size_t>(s.slot)].tensor() : nullptr;
  const std::string name = known ? captured[static_cast<size_t>(s.slot)].name() : "?";
  const std::string size =
      t != nullptr && s.dim >= 0 && s.dim < t->dim() ? std::to_string(t->size(s.dim)) : "?";
  return what + "index " + std::to_string(s.index) + " is out of range for dimension " +
         std::to_string(s.dim) + " of captured tensor '" + name + "' (size " + size + ")" + where;
}

DeviceProgram::DeviceProgram(const flex::CompiledProgram& code, int32_t result,
                             const std::vector<flex::Captured>& captured, Device device,
                             void* stream) {
  const FlatProgram flat = flatten(code, result);
  SDPA_CHECK(static_cast<int>(flat.code.size()) <= fi::kMaxInstructions,
             "flex: MATH on CUDA interprets programs of up to ", fi::kMaxInstructions,
             " instructions, got ", flat.code.size());
  std::vector<fi::CapturedTensor> described;
  for (const flex::Captured& c : captured) {
    const Tensor& t = c.tensor();
    const bool here = t.device().type == DeviceType::kCUDA && t.device().index == device.index;
    keep_.push_back(here ? t : to_device(t, device, stream));
    described.push_back(describe_captured(keep_.back()));
  }
  keep_.push_back(detail::vector_to_device(flat.code, DType::kBool, device, stream));
  view_.code = static_cast<const fi::Instr*>(keep_.back().data_ptr());
  keep_.push_back(detail::vector_to_device(flat.args, DType::kBool, device, stream));
  view_.args = static_cast<const int32_t*>(keep_.back().data_ptr());
  keep_.push_back(detail::vector_to_device(described, DType::kBool, device, stream));
  view_.captured = static_cast<const fi::CapturedTensor*>(keep_.back().data_ptr());
  view_.count = static_cast<int>(flat.code.size());
  view_.result = flat.result;
}

DeviceProgram::DeviceProgram(const flex::Program& program, Device device, void* stream)
    : DeviceProgram(*program.compiled(), program.compiled()->result, program.captured(), device,
                    stream) {}

}  // namespace sdpa::cuda
