// The process-wide cache of built cuDNN graphs (graph_cache.h).

#include "cudnn/graph_cache.h"

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
  int64_t hits = 0, misses = 0;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: graphs may be in use at exit
  return *c;
}

std::shared_ptr<CachedGraph> build(const GraphSpec& spec, cudnnHandle_t handle) {
  auto entry = std::make_shared<CachedGraph>();
  try {
    entry->graph = spec.backward ? build_backward_graph(spec, handle)
                                 : build_forward_graph(spec, handle);
    entry->workspace_bytes = entry->graph->get_workspace_size();
  } catch (const Error& e) {
    entry->graph = nullptr;
    entry->error = e.what();
  }
  return entry;
}

}  // namespace

std::shared_ptr<CachedGraph> graph_for(const GraphSpec& spec, cudnnHandle_t handle) {
  Cache& c = cache();
  {
    std::lock_guard lock(c.mu);
    auto it = c.map.find(spec);
    if (it != c.map.end()) {
      ++c.hits;
      c.order.splice(c.order.begin(), c.order, it->second.second);
      return it->second.first;
    }
    ++c.misses;
  }
  // Built outside the lock (hundreds of milliseconds); two threads may race to build the
  // same spec, and the first one stored wins.
  std::shared_ptr<CachedGraph> built = build(spec, handle);
  std::lock_guard lock(c.mu);
  auto it = c.map.find(spec);
  if (it != c.map.end()) return it->second.first;
  c.order.push_front(spec);
  c.map.emplace(spec, std::make_pair(built, c.order.begin()));
  if (c.map.size() > kCapacity) {
    c.map.erase(c.order.back());
    c.order.pop_back();
  }
  return built;
}

}  // namespace sdpa::cudnn

namespace sdpa::cuda {

GraphCacheStats cudnn_graph_cache_stats() {
  auto& c = sdpa::cudnn::cache();
  std::lock_guard lock(c.mu);
  return {c.hits, c.misses, static_cast<int64_t>(c.map.size()),
          static_cast<int64_t>(sdpa::cudnn::kCapacity)};
}

}  // namespace sdpa::cuda
