#pragma once
// Shared by the registry test files: the example plugin's simulated device ("arena",
// examples/external_backend), its introspection functions, random inputs, the float64
// reference and small helpers. Inline, so that every test file shares one loaded plugin.

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "sdpa/registry.h"

namespace sdpa::arena_test {

inline constexpr const char* kPluginPath = SDPA_ARENA_BACKEND;
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// The plugin's introspection functions (resolved from the loaded library).
struct ArenaApi {
  size_t (*bytes_in_use)() = nullptr;
  bool (*contains)(const void*) = nullptr;
  int64_t (*attention_calls)() = nullptr;
};

inline Device arena() {
  static const Device device = load_backend(kPluginPath).devices.at(0);
  return device;
}

inline const ArenaApi& arena_api() {
  static const ArenaApi api = [] {
    arena();
    void* handle = dlopen(kPluginPath, RTLD_NOW | RTLD_NOLOAD);
    EXPECT_NE(handle, nullptr);
    ArenaApi a;
    a.bytes_in_use = reinterpret_cast<size_t (*)()>(dlsym(handle, "arena_bytes_in_use"));
    a.contains = reinterpret_cast<bool (*)(const void*)>(dlsym(handle, "arena_contains"));
    a.attention_calls = reinterpret_cast<int64_t (*)()>(dlsym(handle, "arena_attention_calls"));
    return a;
  }();
  return api;
}

inline Tensor randn(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist;
  Tensor t = Tensor::empty(shape, DType::kFloat64);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(rng);
  return t.to(dtype);
}

// Max |a - b| over elements (both moved to host); equal infinities count as 0.
inline double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  const Tensor x = to_host(a).to(DType::kFloat64), y = to_host(b).to(DType::kFloat64);
  double worst = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double u = x.data<double>()[i], v = y.data<double>()[i];
    if (u == v) continue;
    worst = std::max(worst, std::isnan(u - v) ? kInf : std::abs(u - v));
  }
  return worst;
}

// Float64 MATH attention of host tensors: the reference.
inline AttentionResult reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                 SDPAOptions options = {}) {
  sdpa_kernel guard(SDPBackend::MATH);
  if (options.attn_mask.tensor().defined() && options.attn_mask.tensor().dtype() != DType::kBool) {
    options.attn_mask = to_host(options.attn_mask.tensor()).to(DType::kFloat64);
  }
  return scaled_dot_product_attention_with_lse(to_host(q).to(DType::kFloat64),
                                               to_host(k).to(DType::kFloat64),
                                               to_host(v).to(DType::kFloat64), options);
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline void set(Tensor& t, std::vector<int64_t> index, double value) { t.set_item(index, value); }

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Sets an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// q [B, H, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] on the host.
struct Inputs {
  Tensor q, k, v;
};

inline Inputs host_inputs(int64_t b, int64_t hq, int64_t hkv, int64_t l, int64_t s, int64_t e,
                          int64_t ev, DType dtype = DType::kFloat32, uint32_t seed = 1) {
  return {randn({b, hq, l, e}, dtype, seed), randn({b, hkv, s, e}, dtype, seed + 1),
          randn({b, hkv, s, ev}, dtype, seed + 2)};
}

inline Inputs on_arena(const Inputs& in) {
  return {to_device(in.q, arena()), to_device(in.k, arena()), to_device(in.v, arena())};
}

// Checks that every arena allocation a test makes is freed again.
class ArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    arena();
    in_use_ = arena_api().bytes_in_use();
  }
  void TearDown() override { EXPECT_EQ(arena_api().bytes_in_use(), in_use_) << "arena leak"; }

 private:
  size_t in_use_ = 0;
};

inline const OpImplementation& implementation(const std::string& op, const std::string& key) {
  static std::vector<OpInfo> all;
  all = ops();
  for (const OpInfo& info : all) {
    if (info.name != op) continue;
    for (const OpImplementation& impl : info.implementations) {
      if (impl.dispatch_key == key) return impl;
    }
  }
  static const OpImplementation none;
  ADD_FAILURE() << "no entry for " << op << " on " << key;
  return none;
}

}  // namespace sdpa::arena_test
