// NVRTC loaded at run time, and the compiled-code caches (nvrtc.h).

#include "cuda/nvrtc.h"

#include <dlfcn.h>
#include <nvrtc.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "core/fnv.h"
#include "sdpa/cuda.h"
#include "sdpa/error.h"

namespace sdpa::cuda {
namespace {

// The NVRTC entry points sdpa calls, resolved from the loaded library.
struct Nvrtc {
  decltype(&nvrtcGetErrorString) error_string = nullptr;
  decltype(&nvrtcVersion) version = nullptr;
  decltype(&nvrtcCreateProgram) create = nullptr;
  decltype(&nvrtcCompileProgram) compile = nullptr;
  decltype(&nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&nvrtcGetProgramLog) log = nullptr;
  decltype(&nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&nvrtcGetCUBIN) cubin = nullptr;
  decltype(&nvrtcDestroyProgram) destroy = nullptr;
  std::string error;  // why it could not be loaded ("" when loaded)
};

template <typename F>
bool resolve(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr && error.empty()) error = std::string("NVRTC has no ") + name;
  return fn != nullptr;
}

const Nvrtc& nvrtc() {
  static const Nvrtc api = [] {
    Nvrtc n;
    const char* named = std::getenv("SDPA_NVRTC_LIBRARY");
    std::vector<std::string> candidates;
    if (named != nullptr && *named != '\0') {
      candidates.emplace_back(named);
    } else {
      candidates = {"libnvrtc.so.13", "libnvrtc.so.12"};
    }
    void* lib = nullptr;
    std::string why;
    for (const std::string& name : candidates) {
      lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      const char* e = dlerror();
      why += (why.empty() ? "" : "; ") + name + ": " + (e != nullptr ? e : "not found");
    }
    if (lib == nullptr) {
      n.error = "NVRTC could not be loaded (" + why +
                "); install the CUDA toolkit's NVRTC (e.g. pip install nvidia-cuda-nvrtc) or "
                "set SDPA_NVRTC_LIBRARY";
      return n;
    }
    resolve(lib, "nvrtcGetErrorString", n.error_string, n.error);
    resolve(lib, "nvrtcVersion", n.version, n.error);
    resolve(lib, "nvrtcCreateProgram", n.create, n.error);
    resolve(lib, "nvrtcCompileProgram", n.compile, n.error);
    resolve(lib, "nvrtcGetProgramLogSize", n.log_size, n.error);
    resolve(lib, "nvrtcGetProgramLog", n.log, n.error);
    resolve(lib, "nvrtcGetCUBINSize", n.cubin_size, n.error);
    resolve(lib, "nvrtcGetCUBIN", n.cubin, n.error);
    resolve(lib, "nvrtcDestroyProgram", n.destroy, n.error);
    return n;
  }();
  return api;
}

void check(nvrtcResult status, const char* call) {
  if (status != NVRTC_SUCCESS) {
    sdpa::detail::throw_error(call, ": ", nvrtc().error_string(status));
  }
}

struct MemoryCache {
  std::mutex mu;
  std::unordered_map<uint64_t, std::string> cubins;
};

MemoryCache& memory_cache() {
  static MemoryCache* c = new MemoryCache;  // never destroyed: modules may load at exit
  return *c;
}

std::string cache_file(uint64_t key) {
  const std::string dir = nvrtc_cache_dir();
  if (dir.empty()) return "";
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.cubin", static_cast<unsigned long long>(key));
  return dir + "/" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// Written under a temporary name and renamed, so a reader never sees half a file. A disk
// that cannot take it only loses the cache.
void write_file(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(reinterpret_cast<uintptr_t>(&bytes));
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out || !out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()))) return;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

std::string compile_now(const std::string& source, int arch,
                        const std::vector<std::string>& extra) {
  const Nvrtc& n = nvrtc();
  nvrtcProgram program = nullptr;
  check(n.create(&program, source.c_str(), "sdpa_flex.cu", 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  const std::string arch_flag = "--gpu-architecture=sm_" + std::to_string(arch);
  std::vector<const char*> options = {arch_flag.c_str(), "-std=c++17", "--fmad=true"};
  for (const std::string& option : extra) options.push_back(option.c_str());
  const nvrtcResult status = n.compile(program, static_cast<int>(options.size()), options.data());
  if (status != NVRTC_SUCCESS) {
    size_t size = 0;
    n.log_size(program, &size);
    std::string log(size, '\0');
    if (size > 0) n.log(program, log.data());
    n.destroy(&program);
    sdpa::detail::throw_error("nvrtcCompileProgram (sm_", arch, "): ", n.error_string(status),
                              "\n", log);
  }
  size_t size = 0;
  std::string cubin;
  try {
    check(n.cubin_size(program, &size), "nvrtcGetCUBINSize");
    cubin.resize(size);
    check(n.cubin(program, cubin.data()), "nvrtcGetCUBIN");
  } catch (...) {
    n.destroy(&program);
    throw;
  }
  n.destroy(&program);
  return cubin;
}

}  // namespace

const std::string& nvrtc_load_error() { return nvrtc().error; }

int nvrtc_version() {
  SDPA_CHECK(nvrtc().error.empty(), nvrtc().error);
  int major = 0, minor = 0;
  check(nvrtc().version(&major, &minor), "nvrtcVersion");
  return major * 1000 + minor * 10;
}

std::string nvrtc_cache_dir() {
  if (const char* dir = std::getenv("SDPA_CACHE_DIR"); dir != nullptr && *dir != '\0') {
    return std::string(dir) + "/nvrtc";
  }
  if (const char* dir = std::getenv("XDG_CACHE_HOME"); dir != nullptr && *dir != '\0') {
    return std::string(dir) + "/sdpa/nvrtc";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.cache/sdpa/nvrtc";
  }
  return "";
}

uint64_t source_hash(const std::string& text, int arch) {
  sdpa::detail::Fnv1a hash;
  hash.bytes(text);
  hash.word(static_cast<uint64_t>(arch));
  return hash.value;
}

CompiledModule compile_cubin(const std::string& source, int arch,
                             const std::vector<std::string>& options) {
  SDPA_CHECK(nvrtc().error.empty(), nvrtc().error);
  // The NVRTC version and the options are part of the key: a newer compiler's code, or
  // code against other headers, replaces the old.
  std::string keyed = source + "\n// nvrtc " + std::to_string(nvrtc_version());
  for (const std::string& option : options) keyed += "\n// " + option;
  const uint64_t key = source_hash(keyed, arch);
  MemoryCache& memory = memory_cache();
  {
    std::lock_guard lock(memory.mu);
    if (auto it = memory.cubins.find(key); it != memory.cubins.end())
      return {it->second, true, key};
  }
  const std::string path = cache_file(key);
  std::string cubin = path.empty() ? "" : read_file(path);
  const bool from_disk = !cubin.empty();
  if (!from_disk) {
    cubin = compile_now(source, arch, options);
    if (!path.empty()) write_file(path, cubin);
  }
  std::lock_guard lock(memory.mu);
  memory.cubins.emplace(key, cubin);
  return {cubin, from_disk, key};
}

std::string cuda_include_dir() {
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("SDPA_CUDA_INCLUDE_DIR"); dir != nullptr && *dir != '\0') {
    candidates.emplace_back(dir);
  }
  for (const char* root : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* dir = std::getenv(root); dir != nullptr && *dir != '\0') {
      candidates.push_back(std::string(dir) + "/include");
    }
  }
  candidates.emplace_back(SDPA_CUDA_TOOLKIT_INCLUDE_DIR);
  candidates.emplace_back("/usr/local/cuda/include");
  for (const std::string& dir : candidates) {
    std::error_code ec;
    if (std::filesystem::exists(dir + "/cuda_bf16.h", ec)) return dir;
  }
  return "";
}

// Loads nothing: NVRTC is a large library, and which copy a process finds first can differ
// (torch's wheel may have loaded its own), so info stays the same in every process.
std::string runtime_compiler_description() {
  const std::string dir = nvrtc_cache_dir();
  const std::string headers = cuda_include_dir();
  return "NVRTC (libnvrtc.so.13 or .12, loaded on first use); cache " +
         (dir.empty() ? std::string("in memory only (no SDPA_CACHE_DIR, XDG_CACHE_HOME or HOME)")
                      : dir) +
         "; CUDA headers " +
         (headers.empty() ? std::string("not found (set SDPA_CUDA_INCLUDE_DIR)") : headers);
}

}  // namespace sdpa::cuda
