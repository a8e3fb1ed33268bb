#pragma once
// Philox4x32-10 counter-based generator (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC 2011) and the dropout keep decision shared by every backend, so MATH
// and FLASH drop exactly the same elements for the same (seed, offset).

#include <array>
#include <cstdint>

#include "sdpa/generator.h"

namespace sdpa::cpu {

/// Ten Philox rounds on `counter` with `key`.
inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter,
                                             std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * counter[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * counter[2];
    counter = {static_cast<uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(p1),
               static_cast<uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

/// Dropout decisions for the elements of one call. Element n (the linear index into
/// [B, Hq, L, S]) uses word n % 4 of the Philox block at counter (n / 4, offset) keyed by
/// the seed, and is kept when that word >= p * 2^32.
class DropoutStream {
 public:
  DropoutStream(const PhiloxState& state, double p)
      : key_{static_cast<uint32_t>(state.seed), static_cast<uint32_t>(state.seed >> 32)},
        offset_(state.offset),
        threshold_(static_cast<uint64_t>(p * 4294967296.0)),
        keep_scale_(1.0 / (1.0 - p)) {}

  /// Multiplies p[j] for elements first_element + j, j < n, by 0 (dropped) or 1/(1-p).
  template <typename T>
  void apply(uint64_t first_element, T* p, int64_t n) const {
    int64_t j = 0;
    while (j < n) {
      const uint64_t element = first_element + static_cast<uint64_t>(j);
      const uint64_t block = element >> 2;
      const auto words = philox4x32_10({static_cast<uint32_t>(block),
                                        static_cast<uint32_t>(block >> 32),
                                        static_cast<uint32_t>(offset_),
                                        static_cast<uint32_t>(offset_ >> 32)},
                                       key_);
      for (uint64_t w = element & 3u; w < 4 && j < n; ++w, ++j) {
        p[j] = words[w] >= threshold_ ? p[j] * static_cast<T>(keep_scale_) : T(0);
      }
    }
  }

 private:
  std::array<uint32_t, 2> key_;
  uint64_t offset_;
  uint64_t threshold_;
  double keep_scale_;
};

}  // namespace sdpa::cpu
