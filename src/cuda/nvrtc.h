#pragma once
// Run-time compilation of generated CUDA C++ (flex programs, cuda/flex_codegen.h) with
// NVRTC, loaded at run time like cuDNN: the library runs without it, and what needs it
// says why it is missing. Compiled code is cached by a hash of (source, architecture,
// NVRTC version): in memory, and on disk under nvrtc_cache_dir(), so a program compiles
// once per machine.

#include <cstdint>
#include <string>
#include <vector>

namespace sdpa::cuda {

/// "" when NVRTC is loaded, else why not. SDPA_NVRTC_LIBRARY names the file; by default
/// libnvrtc.so.13, then libnvrtc.so.12.
const std::string& nvrtc_load_error();

/// NVRTC's version as major * 1000 + minor * 10 (13000 for 13.0); throws when not loaded.
int nvrtc_version();

/// The on-disk cache folder: $SDPA_CACHE_DIR/nvrtc, else $XDG_CACHE_HOME/sdpa/nvrtc, else
/// ~/.cache/sdpa/nvrtc ("" when none of them is set: no disk cache). Created on first use.
std::string nvrtc_cache_dir();

struct CompiledModule {
  std::string cubin;   ///< the ELF image for cuModuleLoadData
  bool from_cache = false;  ///< found in memory or on disk (not compiled by this call)
  uint64_t key = 0;         ///< the cache key (source, options, architecture, NVRTC version)
};

/// Compiles `source` for compute capability `arch` (80 for sm_80, 90 for sm_90a's
/// generic form sm_90) to CUBIN, with -std=c++17, fast-math off and `options` (e.g.
/// "-I" + cuda_include_dir(); part of the cache key). Throws sdpa::Error with NVRTC's log
/// when the source does not compile, or nvrtc_load_error() when NVRTC is missing.
CompiledModule compile_cubin(const std::string& source, int arch,
                             const std::vector<std::string>& options = {});

/// The folder holding the CUDA headers (cuda_bf16.h, cuda_fp16.h) that units including
/// them need: $SDPA_CUDA_INCLUDE_DIR, else $CUDA_HOME/include, $CUDA_PATH/include, the
/// toolkit sdpa was built with, /usr/local/cuda/include: the first that has cuda_bf16.h;
/// "" when none does.
std::string cuda_include_dir();

/// FNV-1a over `text`: the cache's key function (exposed for tests and `sdpa info`).
uint64_t source_hash(const std::string& text, int arch);

}  // namespace sdpa::cuda
