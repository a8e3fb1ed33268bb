#pragma once
// Backend identifiers, process-wide enable flags and the scoped sdpa_kernel guard.

#include <string>
#include <string_view>
#include <vector>

namespace sdpa {

/// Attention backends; values and names are PyTorch's torch.nn.attention.SDPBackend.
enum class SDPBackend : int {
  ERROR = -1,
  MATH = 0,
  FLASH_ATTENTION = 1,
  EFFICIENT_ATTENTION = 2,
  CUDNN_ATTENTION = 3,
  OVERRIDEABLE = 4,
};

/// "FLASH_ATTENTION", ...
std::string_view backend_name(SDPBackend backend);
/// Parses backend_name() or its lower-case form ("flash_attention", also "flash", "math",
/// "efficient", "cudnn"); throws sdpa::Error for anything else.
SDPBackend parse_backend(std::string_view name);
/// Every real backend (ERROR excluded), in the default priority order.
const std::vector<SDPBackend>& default_priority_order();

/// Scoped restriction of the backends the calling thread may use (PyTorch's
/// torch.nn.attention.sdpa_kernel). While alive, only `backends` are tried; with
/// `set_priority` they are tried in the given order, otherwise in the default order.
/// Guards nest (the innermost wins) and are thread-local: other threads are unaffected.
/// Throws sdpa::Error when `backends` is empty or contains ERROR.
class sdpa_kernel {
 public:
  explicit sdpa_kernel(std::vector<SDPBackend> backends, bool set_priority = false);
  explicit sdpa_kernel(SDPBackend backend) : sdpa_kernel(std::vector<SDPBackend>{backend}) {}
  ~sdpa_kernel();
  sdpa_kernel(const sdpa_kernel&) = delete;
  sdpa_kernel& operator=(const sdpa_kernel&) = delete;
};

/// Whether an sdpa_kernel guard is active on the calling thread (the Python torch entry
/// points then ignore torch's own guard).
bool sdpa_kernel_active();

/// Backends the calling thread may use now, in the order they are tried: the innermost
/// sdpa_kernel guard's list if one is active, else the enabled process-wide flags.
std::vector<SDPBackend> active_backends();

/// Whether `backend` is compiled into this build: MATH (CPU, and CUDA in a CUDA build),
/// FLASH_ATTENTION (CPU) and OVERRIDEABLE (external devices) always are; CUDNN_ATTENTION
/// when built with cuDNN (cmake/SdpaCuda.cmake); EFFICIENT_ATTENTION and ERROR never are.
bool backend_built(SDPBackend backend);

/// The process-wide enable flag of `backend` (backends::*_sdp_enabled() without a guard).
bool backend_enabled(SDPBackend backend);

/// The report of `sdpa info` and `python -m sdpa.info`: version, CPU capability (and its
/// override), OpenMP threads, loaded backend plugins, and per backend in priority order
/// whether it is built, enabled, and would run a probe float32 CPU call (else why not).
std::string info_text();

/// Process-wide defaults (PyTorch's torch.backends.cuda.enable_*_sdp). They apply where no
/// sdpa_kernel guard is active; the *_enabled() queries report the calling thread's
/// effective state (guard first, then flag).
namespace backends {
void enable_math_sdp(bool enabled);
void enable_flash_sdp(bool enabled);
void enable_mem_efficient_sdp(bool enabled);
void enable_cudnn_sdp(bool enabled);
void enable_overrideable_sdp(bool enabled);
bool math_sdp_enabled();
bool flash_sdp_enabled();
bool mem_efficient_sdp_enabled();
bool cudnn_sdp_enabled();
bool overrideable_sdp_enabled();
/// PyTorch's torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp: when on, MATH
/// computes float16 / bfloat16 forwards in their own dtype, rounding every intermediate
/// (scaled q and k, scores, masked scores, probabilities, out) to it as torch's math path
/// does without its float32 upcast. Off by default (computed in float32). Process-wide;
/// SDPAOptions::allow_fp16_bf16_reduction_math turns it on for one call. The backward
/// keeps float32 compute either way.
void allow_fp16_bf16_reduction_math_sdp(bool enabled);
bool fp16_bf16_reduction_math_sdp_allowed();

namespace cpu {
/// SIMD level the CPU kernels use: "AVX512", "AVX2" or "DEFAULT" (PyTorch's
/// torch.backends.cpu.get_cpu_capability). The environment variable SDPA_CPU_CAPABILITY
/// can lower it (a level above the CPU's gives the CPU's best; a value other than AVX512,
/// AVX2 or DEFAULT is an error: this function and the CPU kernels throw sdpa::Error);
/// set_cpu_capability overrides both (for tests and benchmarks).
std::string get_cpu_capability();
/// Best capability this CPU supports, ignoring overrides.
std::string detected_cpu_capability();
/// Forces a capability for the calling thread ("" restores the default). Throws
/// sdpa::Error for an unknown name or one this CPU cannot run.
void set_cpu_capability(std::string_view capability);
/// Whether bfloat16 products may run on Intel AMX tiles (TDPBF16PS): the CPU has AMX-TILE
/// and AMX-BF16, the OS granted this process the tile state, and SDPA_DISABLE_AMX is not
/// 1. They do in the FLASH kernels' bfloat16 calls at the AVX512 level.
bool amx_bf16_available();
}  // namespace cpu
}  // namespace backends

}  // namespace sdpa
