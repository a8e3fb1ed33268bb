// The registry from several threads at once: the plugin's functional kernel, its derived
// out= variant, the counted CPU fallback of the backward and plain CPU calls, while another
// thread lists the ops. Every thread's results equal the sequential ones. scripts/tsan.sh
// runs this under ThreadSanitizer.

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "arena_fixture.h"

namespace sdpa::arena_test {
namespace {

struct Results {
  Tensor out, out_variant, grad_k, cpu_out;
};

TEST_F(ArenaTest, ConcurrentCallsGiveTheSequentialResults) {
  const Inputs host = host_inputs(2, 4, 2, 9, 13, 8, 6);
  const Inputs dev = on_arena(host);
  const Tensor grad_out = to_device(randn({2, 4, 9, 6}, DType::kFloat32, 5), arena());
  SDPAOptions options;
  options.enable_gqa = true;
  options.is_causal = true;
  const auto run = [&] {
    Results r;
    const AttentionResult fwd = scaled_dot_product_attention_with_lse(dev.q, dev.k, dev.v, options);
    r.out = to_host(fwd.out);
    Tensor out = empty({2, 4, 9, 6}, DType::kFloat32, arena()), lse;
    scaled_dot_product_attention_out(dev.q, dev.k, dev.v, out, lse, options);
    r.out_variant = to_host(out);
    r.grad_k = to_host(scaled_dot_product_attention_backward(grad_out, dev.q, dev.k, dev.v,
                                                             fwd.out, fwd.lse, options)
                           .grad_k);
    r.cpu_out = scaled_dot_product_attention(host.q, host.k, host.v, options);
    return r;
  };
  ::testing::internal::CaptureStderr();  // the fallback's one-time warning
  const Results want = run();
  constexpr int kThreads = 4;
  std::vector<Results> got(kThreads);
  std::atomic<bool> done{false};
  std::thread lister([&] {
    while (!done.load()) EXPECT_FALSE(ops().empty());
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) got[t] = run();
    });
  }
  for (std::thread& th : threads) th.join();
  done = true;
  lister.join();
  ::testing::internal::GetCapturedStderr();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(max_diff(got[t].out, want.out), 0.0) << "thread " << t;
    EXPECT_EQ(max_diff(got[t].out_variant, want.out), 0.0) << "thread " << t;
    EXPECT_EQ(max_diff(got[t].grad_k, want.grad_k), 0.0) << "thread " << t;
    EXPECT_EQ(max_diff(got[t].cpu_out, want.cpu_out), 0.0) << "thread " << t;
  }
  EXPECT_LT(max_diff(want.out, reference(host.q, host.k, host.v, options).out), 1e-5);
}

}  // namespace
}  // namespace sdpa::arena_test
