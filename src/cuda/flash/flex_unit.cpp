// The NVRTC unit of CUDA FLASH's forward kernel with a flex program (flex_unit.h).

#include "cuda/flash/flex_unit.h"

#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "cuda/flex_codegen.h"
#include "sdpa/error.h"

namespace sdpa::cuda::flash {
namespace {

// The embedded sources without their includes of each other (they come in dependency
// order) and without #pragma once (one file here).
std::string strip_includes(const char* sources) {
  std::istringstream in(sources);
  std::string text, line;
  while (std::getline(in, line)) {
    if (line.rfind("#include \"cuda/", 0) == 0 || line.rfind("#pragma once", 0) == 0) continue;
    text += line;
    text += '\n';
  }
  return text;
}

// The hooks forward_body calls per element (NoFlex's members), running the generated
// functions with the call's captured tensors and failure record.
constexpr const char* kHooks = R"(
namespace sdpa::cuda::flash {
struct GeneratedFlex {
  static constexpr bool kActive = true;
  __device__ static float score(const ForwardArgs& a, float score, int64_t b, int64_t h, int i,
                                int j) {
    return sdpa_score_mod(score, b, h, i, j,
                          static_cast<const SdpaCapturedTensor*>(a.score_mod_captured),
                          static_cast<SdpaFlexStatus*>(a.score_mod_status));
  }
  __device__ static bool keep(const ForwardArgs& a, int64_t b, int64_t h, int i, int j) {
    return sdpa_mask_mod(0.0f, b, h, i, j,
                         static_cast<const SdpaCapturedTensor*>(a.mask_mod_captured),
                         static_cast<SdpaFlexStatus*>(a.mask_mod_status));
  }
};
}  // namespace sdpa::cuda::flash
)";

// What selects one compiled unit: the programs' structures (0 for an absent one; is_mask
// is part of a program's hash), the unit's dtype and tile, and the architecture. The
// headers' folder is looked up (a file system probe) only when a unit compiles.
using ModuleKey = std::tuple<uint64_t, uint64_t, DType, int, int>;

uint64_t structure(const flex::Program* program) {
  return program == nullptr ? 0 : program->structural_hash();
}

}  // namespace

std::string flex_forward_unit(const flex::Program* score_mod, const flex::Program* mask_mod,
                              DType dtype, int head_dim_tile) {
  SDPA_CHECK(dtype == DType::kFloat16 || dtype == DType::kBFloat16,
             "flex_forward_unit: dtype must be float16 or bfloat16, got ", dtype_name(dtype));
  SDPA_CHECK(
      head_dim_tile == 32 || head_dim_tile == 64 || head_dim_tile == 128 || head_dim_tile == 256,
      "flex_forward_unit: head_dim_tile must be 32, 64, 128 or 256, got ", head_dim_tile);
  static const std::string kernel_sources = strip_includes(flash_kernel_sources());
  const char* element = dtype == DType::kFloat16 ? "__half" : "__nv_bfloat16";
  std::ostringstream unit;
  unit << flex_translation_unit(score_mod, mask_mod, /*with_gradient=*/false) << '\n'
       << kernel_sources << kHooks << '\n'
       << "extern \"C\" __global__ void __launch_bounds__(sdpa::cuda::flash::ForwardTile<"
       << head_dim_tile << ">::kThreads)\n    " << kFlexForwardEntry
       << "(const sdpa::cuda::flash::ForwardArgs a) {\n"
       << "  sdpa::cuda::flash::forward_body<" << element << ", " << head_dim_tile
       << ", sdpa::cuda::flash::GeneratedFlex>(a);\n}\n";
  return unit.str();
}

const CompiledModule& flex_forward_module(const flex::Program* score_mod,
                                          const flex::Program* mask_mod, DType dtype,
                                          int head_dim_tile, int arch) {
  static std::mutex mu;
  // Modules stay for the process (as the kernels loaded from them); map nodes do not move.
  static auto* modules = new std::map<ModuleKey, CompiledModule>;
  ModuleKey key{structure(score_mod), structure(mask_mod), dtype, head_dim_tile, arch};
  {
    std::lock_guard lock(mu);
    if (auto it = modules->find(key); it != modules->end()) return it->second;
  }
  // Compiled outside the lock: a second thread asking for the same unit meanwhile compiles
  // it too (or finds it in compile_cubin's cache), and the first result stays.
  CompiledModule module =
      compile_cubin(flex_forward_unit(score_mod, mask_mod, dtype, head_dim_tile), arch,
                    {"-I" + cuda_include_dir()});
  std::lock_guard lock(mu);
  return modules->try_emplace(std::move(key), std::move(module)).first->second;
}

}  // namespace sdpa::cuda::flash
