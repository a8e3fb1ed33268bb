#include "core/memory_ceiling.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>

namespace sdpa::detail {
namespace {

// "123", "64M", "2G" (powers of 1024); nullopt for anything else.
std::optional<size_t> parse_bytes(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 18) return std::nullopt;
  size_t value = std::stoull(text.substr(0, digits));
  const std::string suffix = text.substr(digits);
  int shift = 0;
  if (suffix == "K" || suffix == "k") shift = 10;
  else if (suffix == "M" || suffix == "m") shift = 20;
  else if (suffix == "G" || suffix == "g") shift = 30;
  else if (suffix == "T" || suffix == "t") shift = 40;
  else if (!suffix.empty()) return std::nullopt;
  if (value > (std::numeric_limits<size_t>::max() >> shift)) return std::nullopt;
  return value << shift;
}

std::optional<size_t> read_limit_file(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return std::nullopt;
  return parse_bytes(text);  // "max" (no limit) parses to nullopt
}

void lower(MemoryCeiling& c, std::optional<size_t> bytes, const char* source) {
  if (bytes && *bytes > 0 && *bytes < c.bytes) c = {*bytes, source};
}

MemoryCeiling compute() {
  MemoryCeiling c{std::numeric_limits<size_t>::max() / 2, "the address space"};
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0) {
    lower(c, static_cast<size_t>(pages) * static_cast<size_t>(page_size), "physical memory");
  }
  lower(c, read_limit_file("/sys/fs/cgroup/memory.max"), "the cgroup's memory.max");
  lower(c, read_limit_file("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        "the cgroup's memory.limit_in_bytes");
  for (const auto& [resource, name] : {std::pair{RLIMIT_AS, "RLIMIT_AS"},
                                       std::pair{RLIMIT_DATA, "RLIMIT_DATA"}}) {
    rlimit limit{};
    if (getrlimit(resource, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
      lower(c, static_cast<size_t>(limit.rlim_cur), name);
    }
  }
  if (const char* env = std::getenv("SDPA_MEMORY_LIMIT")) {
    lower(c, parse_bytes(env), "SDPA_MEMORY_LIMIT");
  }
  return c;
}

}  // namespace

const MemoryCeiling& memory_ceiling() {
  static const MemoryCeiling ceiling = compute();
  return ceiling;
}

}  // namespace sdpa::detail
