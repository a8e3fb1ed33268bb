// The process-wide thread settings behind sdpa::set_num_threads and the work grain.

#include "core/threading.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "sdpa/error.h"
#include "sdpa/threading.h"

namespace sdpa {
namespace {

// 0: follow OpenMP (omp_get_max_threads of the calling thread).
std::atomic<int> g_num_threads{0};

// SDPA_GRAIN_SCALE retunes the grain for another host (or 0: every region parallel, as
// the grain measurement needs); a value that does not parse, or a negative one, is 1.
double grain_scale_from_env() {
  const char* text = std::getenv("SDPA_GRAIN_SCALE");
  if (text == nullptr) return 1.0;
  char* end = nullptr;
  const double scale = std::strtod(text, &end);
  return end != text && scale >= 0 ? scale : 1.0;
}

std::atomic<double> g_grain_scale{grain_scale_from_env()};

// Until when (now_ns) a late worker marked the processors contended.
std::atomic<int64_t> g_contended_until_ns{0};

}  // namespace

void set_num_threads(int n) {
  SDPA_CHECK(n >= 1, "set_num_threads: n: expected >= 1, got ", n);
  g_num_threads.store(n, std::memory_order_relaxed);
}

int get_num_threads() {
  const int n = g_num_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : omp_get_max_threads();
}

namespace detail {

ThreadingContext ThreadingContext::current() {
  const double scale = g_grain_scale.load(std::memory_order_relaxed);
  const int budget = get_num_threads();
  const bool contended =
      scale > 0 && now_ns() < g_contended_until_ns.load(std::memory_order_relaxed);
  return ThreadingContext(budget, scale, contended ? 1 : budget);
}

double set_grain_scale(double scale) {
  return g_grain_scale.exchange(scale, std::memory_order_relaxed);
}

void clear_num_threads() { g_num_threads.store(0, std::memory_order_relaxed); }

void note_worker_start(int64_t late_ns) {
  if (late_ns > kLateWorkerNs) {
    g_contended_until_ns.store(now_ns() + kContendedNs, std::memory_order_relaxed);
  }
}

bool team_exists(int threads) {
  thread_local int largest_team = 1;
  if (threads <= largest_team) return true;
  largest_team = threads;
  return false;
}

void clear_contention() { g_contended_until_ns.store(0, std::memory_order_relaxed); }

}  // namespace detail
}  // namespace sdpa
