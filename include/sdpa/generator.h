#pragma once
// Random state for dropout: a counter-based Philox4x32-10 stream keyed by (seed, offset).

#include <cstdint>
#include <mutex>

namespace sdpa {

/// Seed and offset that fully determine one call's dropout mask (so a backward pass can
/// regenerate it instead of storing it).
struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

/// A seedable dropout generator (PyTorch's torch.Generator for the Philox engine).
/// Each attention call with dropout takes the current (seed, offset) and advances the
/// offset by one, so consecutive calls draw independent masks. Thread-safe.
class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) : seed_(seed) {}
  /// Resets to `seed` with offset 0 (torch.manual_seed).
  void manual_seed(uint64_t seed);
  uint64_t initial_seed() const;
  /// Returns the state to use for one call and advances the offset.
  PhiloxState next();

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// The process-wide generator used when a call names none.
Generator& default_generator();
/// Seeds the default generator.
void manual_seed(uint64_t seed);

}  // namespace sdpa
