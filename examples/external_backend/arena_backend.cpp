// An sdpa backend plugin for a simulated accelerator, "arena": its memory is one block
// of host memory managed by its own allocator (so device pointers are not ordinary host
// allocations), and it implements exactly one kernel, the functional `attention`, as a
// naive loop over device memory. Everything else comes from sdpa: attention.out and
// attention_ are derived from the functional kernel; attention_backward,
// merge_attention_states and materialize_bias run through the CPU fallback.
//
// Build: see CMakeLists.txt. Load: sdpa::load_backend("libsdpa_arena_backend.so") or
// SDPA_BACKENDS=/path/to/libsdpa_arena_backend.so.

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sdpa/plugin.h"

namespace arena {

// The device's memory: one 64-byte aligned block, first-fit allocation with coalescing.
class Arena {
 public:
  static constexpr size_t kAlign = 64;

  explicit Arena(size_t capacity)
      : capacity_(capacity), base_(static_cast<char*>(std::aligned_alloc(kAlign, capacity))) {
    SDPA_CHECK(base_ != nullptr, "arena: cannot reserve ", capacity, " bytes");
    free_[0] = capacity;
  }

  void* allocate(size_t nbytes) {
    const size_t size = (nbytes + kAlign - 1) / kAlign * kAlign;
    std::lock_guard lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const size_t offset = it->first, left = it->second - size;
      free_.erase(it);
      if (left > 0) free_[offset + size] = left;
      used_[offset] = size;
      in_use_ += size;
      return base_ + offset;
    }
    return nullptr;  // out of device memory
  }

  void free(void* ptr) {
    std::lock_guard lock(mu_);
    const size_t offset = static_cast<size_t>(static_cast<char*>(ptr) - base_);
    auto used = used_.find(offset);
    SDPA_CHECK(used != used_.end(), "arena: free of ", ptr, ", which is not an arena allocation");
    size_t size = used->second;
    in_use_ -= size;
    used_.erase(used);
    size_t start = offset;
    auto next = free_.lower_bound(offset);
    if (next != free_.end() && next->first == offset + size) {  // merge with the next block
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {  // merge with the previous block
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        start = prev->first;
        size += prev->second;
        free_.erase(prev);
      }
    }
    free_[start] = size;
  }

  // True when [ptr, ptr + nbytes) lies inside the arena.
  bool contains(const void* ptr, size_t nbytes) const {
    const char* p = static_cast<const char*>(ptr);
    return p >= base_ && p + nbytes <= base_ + capacity_;
  }

  size_t bytes_in_use() const {
    std::lock_guard lock(mu_);
    return in_use_;
  }

 private:
  size_t capacity_;
  char* base_;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> size
  std::map<size_t, size_t> used_;
  size_t in_use_ = 0;
};

Arena& device_memory() {
  static Arena arena([] {
    const char* env = std::getenv("SDPA_ARENA_BYTES");
    return env ? static_cast<size_t>(std::strtoull(env, nullptr, 10)) : size_t{64} << 20;
  }());
  return arena;
}

std::atomic<int64_t> g_attention_calls{0};

void check_on_device(const char* name, const sdpa::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  SDPA_CHECK(device_memory().contains(t.data_ptr(), 1), "arena: ", name,
             " is not in arena memory (", t.describe(), ")");
}

// Element (b, h, i, j) of a 4-D strided tensor.
template <typename T>
T at(const sdpa::Tensor& t, int64_t b, int64_t h, int64_t i, int64_t j) {
  return t.data<T>()[b * t.stride(0) + h * t.stride(1) + i * t.stride(2) + j * t.stride(3)];
}

bool in_band(const sdpa::DiagonalBand& band, int64_t i, int64_t j, int64_t q_len,
             int64_t kv_len) {
  const int64_t d = band.alignment == sdpa::DiagonalAlignment::kTopLeft ? 0 : kv_len - q_len;
  if (band.left && j < i + d - *band.left) return false;
  if (band.right && j > i + d + *band.right) return false;
  return true;
}

// The arena's attention kernel: softmax(q k^T * scale + mask) v, one query row at a time,
// accumulating in double. Returns out [B, Hq, L, Ev] and lse [B, Hq, L] in arena memory.
template <typename T>
std::tuple<sdpa::Tensor, sdpa::Tensor> attention(const sdpa::AttentionParams& p) {
  check_on_device("query", p.q);
  check_on_device("key", p.k);
  check_on_device("value", p.v);
  check_on_device("attn_mask", p.mask.dense);
  ++g_attention_calls;
  sdpa::Tensor out = sdpa::empty({p.batch, p.num_heads_q, p.q_len, p.head_dim_vo}, p.dtype,
                                 p.device);
  sdpa::Tensor lse = sdpa::empty({p.batch, p.num_heads_q, p.q_len}, sdpa::DType::kFloat32,
                                 p.device);
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<double> scores(static_cast<size_t>(p.kv_len));
  std::vector<double> acc(static_cast<size_t>(p.head_dim_vo));
  T* out_data = out.data<T>();
  float* lse_data = lse.data<float>();
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.num_heads_q; ++h) {
      const int64_t hk = h / p.group_size();
      for (int64_t i = 0; i < p.q_len; ++i) {
        double row_max = kNegInf;
        for (int64_t j = 0; j < p.kv_len; ++j) {
          double s = 0.0;
          for (int64_t e = 0; e < p.head_dim_qk; ++e) {
            s += static_cast<double>(at<T>(p.q, b, h, i, e)) * at<T>(p.k, b, hk, j, e);
          }
          s *= p.scale;
          for (const sdpa::DiagonalBand& band : p.mask.bands) {
            if (!in_band(band, i, j, p.q_len, p.kv_len)) s = kNegInf;
          }
          if (p.mask.dense_kind == sdpa::DenseMaskKind::kBoolKeep) {
            if (!at<bool>(p.mask.dense, b, h, i, j)) s = kNegInf;
          } else if (p.mask.dense_kind == sdpa::DenseMaskKind::kAdditive) {
            s += at<T>(p.mask.dense, b, h, i, j);
          }
          scores[j] = s;
          row_max = std::max(row_max, s);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double sum = 0.0;
        if (row_max != kNegInf) {
          for (int64_t j = 0; j < p.kv_len; ++j) {
            const double w = std::exp(scores[j] - row_max);
            sum += w;
            for (int64_t e = 0; e < p.head_dim_vo; ++e) acc[e] += w * at<T>(p.v, b, hk, j, e);
          }
        }
        const int64_t row = (b * p.num_heads_q + h) * p.q_len + i;
        for (int64_t e = 0; e < p.head_dim_vo; ++e) {
          out_data[row * p.head_dim_vo + e] = static_cast<T>(sum > 0.0 ? acc[e] / sum : 0.0);
        }
        lse_data[row] = static_cast<float>(sum > 0.0 ? row_max + std::log(sum) : kNegInf);
      }
    }
  }
  return {out, lse};
}

std::tuple<sdpa::Tensor, sdpa::Tensor> attention_kernel(const sdpa::AttentionParams& p) {
  return p.dtype == sdpa::DType::kFloat64 ? attention<double>(p) : attention<float>(p);
}

// Selection checks: what the kernel above can run. Each explains a refusal.
bool check_dtype(const sdpa::AttentionParams& p, sdpa::Reasons& reasons) {
  if (p.dtype == sdpa::DType::kFloat32 || p.dtype == sdpa::DType::kFloat64) return true;
  reasons.add("dtype " + std::string(sdpa::dtype_name(p.dtype)) +
              " is not supported (the arena kernel computes float32 and float64)");
  return false;
}

bool check_dropout(const sdpa::AttentionParams& p, sdpa::Reasons& reasons) {
  if (!p.has_dropout()) return true;
  reasons.add("dropout is not supported (the arena has no random number generator)");
  return false;
}

bool check_mask(const sdpa::AttentionParams& p, sdpa::Reasons& reasons) {
  std::string unsupported;
  const sdpa::MaskDescriptor& m = p.mask;
  if (m.has_documents()) unsupported += " packed documents";
  if (!m.kv_lengths.empty()) unsupported += " padded keys";
  if (!m.alibi_slopes.empty()) unsupported += " ALiBi";
  if (m.score_mod || m.block_mask) unsupported += " flex programs";
  for (const sdpa::DiagonalBand& band : m.bands) {
    if (band.frame != sdpa::BandFrame::kSequence) unsupported += " per-segment bands";
  }
  if (unsupported.empty()) return true;
  reasons.add("mask parts not supported:" + unsupported +
              " (the arena kernel takes diagonal bands and dense masks)");
  return false;
}

}  // namespace arena

// Introspection for tests and tools (resolved with dlsym).
SDPA_PLUGIN_EXPORT size_t arena_bytes_in_use() { return arena::device_memory().bytes_in_use(); }
SDPA_PLUGIN_EXPORT bool arena_contains(const void* ptr) {
  return arena::device_memory().contains(ptr, 1);
}
SDPA_PLUGIN_EXPORT int64_t arena_attention_calls() { return arena::g_attention_calls.load(); }

SDPA_BACKEND_PLUGIN(registrar) {
  sdpa::DeviceInterface device;
  device.name = "arena";
  device.allocate = [](size_t nbytes) { return arena::device_memory().allocate(nbytes); };
  device.free = [](void* ptr) { arena::device_memory().free(ptr); };
  device.copy_to_host = [](void* host, const void* dev, size_t nbytes) {
    SDPA_CHECK(arena::device_memory().contains(dev, nbytes), "arena: copy_to_host from ", dev,
               ", which is not arena memory");
    std::memcpy(host, dev, nbytes);
  };
  device.copy_from_host = [](void* dev, const void* host, size_t nbytes) {
    SDPA_CHECK(arena::device_memory().contains(dev, nbytes), "arena: copy_from_host to ", dev,
               ", which is not arena memory");
    std::memcpy(dev, host, nbytes);
  };
  device.copy_on_device = [](void* dst, const void* src, size_t nbytes) {
    SDPA_CHECK(arena::device_memory().contains(dst, nbytes) &&
                   arena::device_memory().contains(src, nbytes),
               "arena: copy_on_device outside arena memory");
    std::memmove(dst, src, nbytes);
  };
  registrar.register_device(std::move(device))
      .impl(sdpa::op::attention, arena::attention_kernel)
      .add_check("dtype", arena::check_dtype)
      .add_check("dropout", arena::check_dropout)
      .add_check("mask", arena::check_mask);
}
