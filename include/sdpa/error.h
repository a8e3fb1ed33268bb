#pragma once
// sdpa::Error: the one exception type the library throws for bad input.

#include <sstream>
#include <stdexcept>
#include <string>

namespace sdpa {

/// Thrown for every invalid argument or unsupported request. The message names the
/// argument, what was expected and what came (e.g. "query: expected 3-D or 4-D
/// [B, Hq, L, E], got 2-D [4, 8]").
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
[[noreturn]] void throw_error(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw Error(os.str());
}
}  // namespace detail

}  // namespace sdpa

/// Throws sdpa::Error with the streamed message when `cond` is false.
#define SDPA_CHECK(cond, ...)                     \
  do {                                            \
    if (!(cond)) ::sdpa::detail::throw_error(__VA_ARGS__); \
  } while (0)
