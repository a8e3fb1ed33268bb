// libFuzzer target for the safetensors reader: any byte string given to load_safetensors
// must load or throw sdpa::Error (never another exception, a crash or a read outside the
// file), and a file that loads must survive save_safetensors and load again unchanged.
// The bytes go through an in-memory file (memfd), so no disk is touched.
//
// Build and run: scripts/fuzz.sh (docs/reliability.md).

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "sdpa/error.h"
#include "sdpa/safetensors.h"

namespace {

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "safetensors_fuzzer finding: %s\n", what.c_str());
  std::abort();
}

// An anonymous in-memory file, reachable by path through /proc/self/fd.
class MemoryFile {
 public:
  MemoryFile() : fd_(memfd_create("safetensors_fuzzer", 0)) {
    if (fd_ < 0) finding("memfd_create failed");
  }
  ~MemoryFile() { close(fd_); }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;

  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }
  void write(const uint8_t* data, size_t size) const {
    if (ftruncate(fd_, 0) != 0) finding("ftruncate failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) finding("pwrite failed");
      done += static_cast<size_t>(n);
    }
  }

 private:
  int fd_;
};

bool same_bytes(const sdpa::Tensor& a, const sdpa::Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  const size_t bytes = static_cast<size_t>(a.numel()) * sdpa::element_size(a.dtype());
  return bytes == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), bytes) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const MemoryFile input, copy;
  input.write(data, size);
  sdpa::SafetensorsFile file;
  try {
    file = sdpa::load_safetensors(input.path());
  } catch (const sdpa::Error&) {
    return 0;  // refused: the expected outcome for most inputs
  } catch (const std::exception& e) {
    finding(std::string("an exception other than sdpa::Error escaped: ") + e.what());
  }
  try {
    sdpa::save_safetensors(copy.path(), file.tensors, file.metadata);
    const sdpa::SafetensorsFile again = sdpa::load_safetensors(copy.path());
    if (again.metadata != file.metadata || again.tensors.size() != file.tensors.size()) {
      finding("a saved file reloads with other names or metadata");
    }
    for (const auto& [name, tensor] : file.tensors) {
      const auto it = again.tensors.find(name);
      if (it == again.tensors.end() || !same_bytes(tensor, it->second)) {
        finding("tensor '" + name + "' changed through save and load");
      }
    }
  } catch (const std::exception& e) {
    finding(std::string("a loaded file failed to save and reload: ") + e.what());
  }
  return 0;
}
