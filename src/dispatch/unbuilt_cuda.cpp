// Compiled when sdpa is built without CUDA: the public CUDA functions report that, and
// the CUDA checks of MATH and FLASH give it as their reason.

#include "cuda/flash/flash.h"
#include "cuda/math.h"
#include "sdpa/cuda.h"

namespace sdpa::cuda {
namespace {

constexpr const char* kNotBuilt = "sdpa was built without CUDA support (configure with SDPA_CUDA)";

[[noreturn]] void not_built(const char* what) { sdpa::detail::throw_error(what, ": ", kNotBuilt); }

}  // namespace

bool is_built() { return false; }
int device_count() { return 0; }
bool is_available() { return false; }
std::string unavailable_reason() { return kNotBuilt; }
std::string device_description(int) { not_built("device_description"); }
std::string runtime_compiler_description() { return kNotBuilt; }
Tensor empty(const Shape&, DType, int, Stream) { not_built("cuda::empty"); }
Tensor to_device(const Tensor&, Device, Stream) { not_built("cuda::to_device"); }
void synchronize(Stream) { not_built("cuda::synchronize"); }
MemoryStats memory_stats(int) { return {}; }
void reset_peak_memory(int) {}

bool math_supports(const AttentionParams&, Reasons& r) {
  r.add(kNotBuilt);
  return false;
}
void math_forward(const AttentionParams&, const Tensor&, const Tensor&) {
  not_built("MATH forward on cuda");
}
void math_backward(const AttentionParams&, sdpa::detail::BackwardOutputs&) {
  not_built("MATH backward on cuda");
}
void fill_zeros(const Tensor&, void*) { not_built("fill_zeros on cuda"); }

bool flash_supports(const AttentionParams&, Reasons& r) {
  r.add(kNotBuilt);
  return false;
}
void flash_forward(const AttentionParams&, const Tensor&, const Tensor&) {
  not_built("FLASH forward on cuda");
}

}  // namespace sdpa::cuda
