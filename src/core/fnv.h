#pragma once
// FNV-1a (Fowler, Noll, Vo), 64-bit: the hash of the caches keyed by content (cuDNN graph
// specs, lowered score_mods, NVRTC sources). Not for untrusted keys.

#include <cstdint>
#include <string_view>

namespace sdpa::detail {

struct Fnv1a {
  uint64_t value = 1469598103934665603ull;

  /// Mixes one 64-bit word (one multiply per word, not per byte).
  void word(uint64_t w) { value = (value ^ w) * 1099511628211ull; }
  /// Mixes the bytes of `text` one by one.
  void bytes(std::string_view text) {
    for (unsigned char c : text) word(c);
  }
};

}  // namespace sdpa::detail
