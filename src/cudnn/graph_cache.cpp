// The process-wide cache of built cuDNN graphs (graph_cache.h).

#include "cudnn/graph_cache.h"

#include <atomic>
#include <list>
#include <unordered_map>

#include "sdpa/cuda.h"

namespace sdpa::cudnn {
namespace {

// Distinct call signatures kept: a model uses a handful per layer shape; each entry holds
// an execution plan (a few KiB of host memory).
constexpr size_t kCapacity = 1024;

struct Cache {
  std::mutex mu;
  std::list<GraphSpec> order;  // most recently used first
  std::unordered_map<GraphSpec, std::pair<std::shared_ptr<CachedGraph>,
                                          std::list<GraphSpec>::iterator>, GraphSpecHash> map;
  std::atomic<int64_t> hits = 0, misses = 0;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: graphs may be in use at exit
  return *c;
}

std::shared_ptr<CachedGraph> build(const GraphSpec& spec, cudnnHandle_t handle,
                                   const std::shared_ptr<const ScoreModGraph>& score_mod) {
  auto entry = std::make_shared<CachedGraph>();
  try {
    entry->graph = spec.backward ? build_backward_graph(spec, handle, score_mod)
                                 : build_forward_graph(spec, handle, score_mod);
    entry->workspace_bytes = entry->graph->get_workspace_size();
  } catch (const Error& e) {
    entry->graph = nullptr;
    entry->error = e.what();
  }
  return entry;
}

}  // namespace

std::shared_ptr<CachedGraph> graph_for(const GraphSpec& spec, cudnnHandle_t handle,
                                       const std::shared_ptr<const ScoreModGraph>& score_mod) {
  Cache& c = cache();
  // Selection and the kernel ask for the same spec in turn, and a model repeats its
  // layer's spec: the thread's last answer skips the hash and the lock. It is held weakly,
  // so a thread never owns (and at its exit destroys) a cuDNN graph the cache evicted.
  thread_local GraphSpec last_spec;
  thread_local std::weak_ptr<CachedGraph> last_entry;
  if (last_spec == spec) {
    if (std::shared_ptr<CachedGraph> entry = last_entry.lock()) {
      ++c.hits;
      return entry;
    }
  }
  const auto remember = [&](std::shared_ptr<CachedGraph> entry) {
    last_spec = spec;
    last_entry = entry;
    return entry;
  };
  {
    std::lock_guard lock(c.mu);
    auto it = c.map.find(spec);
    if (it != c.map.end()) {
      ++c.hits;
      c.order.splice(c.order.begin(), c.order, it->second.second);
      return remember(it->second.first);
    }
    ++c.misses;
  }
  // Built outside the lock (hundreds of milliseconds); two threads may race to build the
  // same spec, and the first one stored wins.
  std::shared_ptr<CachedGraph> built = build(spec, handle, score_mod);
  std::lock_guard lock(c.mu);
  auto it = c.map.find(spec);
  if (it != c.map.end()) return remember(it->second.first);
  c.order.push_front(spec);
  c.map.emplace(spec, std::make_pair(built, c.order.begin()));
  if (c.map.size() > kCapacity) {
    c.map.erase(c.order.back());
    c.order.pop_back();
  }
  return remember(built);
}

}  // namespace sdpa::cudnn

namespace sdpa::cuda {

GraphCacheStats cudnn_graph_cache_stats() {
  auto& c = sdpa::cudnn::cache();
  std::lock_guard lock(c.mu);
  return {c.hits.load(), c.misses.load(), static_cast<int64_t>(c.map.size()),
          static_cast<int64_t>(sdpa::cudnn::kCapacity)};
}

}  // namespace sdpa::cuda
