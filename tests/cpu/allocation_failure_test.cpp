// Every allocation of a call may fail: each one, in turn, is made to fail
// (detail::fail_allocation_after) and the call must end in sdpa::Error "out of memory",
// never std::terminate (an exception leaving an OpenMP region) or a hang (a worker that
// left a region early), and must hold no memory afterwards. Per-thread scratch is
// allocated inside the regions, so the calls run on two threads with every region
// parallel.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>

#include "common/harness.h"
#include "common/threads.h"
#include "core/allocation_faults.h"
#include "sdpa/flex_attention.h"
#include "sdpa/flex_mods.h"

namespace sdpa::test {
namespace {

// Fails allocation 0, 1, 2, ... of `call` until one run makes none fail; returns how many
// allocations the call makes.
int64_t fail_each_allocation(const std::function<void()>& call) {
  const int64_t held = memory_stats().current_bytes;
  for (int64_t n = 0; n < 1000; ++n) {
    detail::fail_allocation_after(n);
    bool failed = false;
    try {
      call();
    } catch (const Error& e) {
      failed = true;
      EXPECT_THAT(e.what(), testing::HasSubstr("out of memory")) << "allocation " << n;
    }
    detail::fail_allocation_after(-1);
    EXPECT_EQ(memory_stats().current_bytes, held) << "allocation " << n << " leaked";
    if (!failed) return n;
  }
  ADD_FAILURE() << "the call kept failing after 1000 allocations";
  return -1;
}

struct Inputs {
  Tensor q, k, v, grad_out;
};

Inputs make_inputs(int64_t heads_q, int64_t heads_kv, int64_t q_len, int64_t kv_len) {
  std::mt19937 rng(29);
  const int64_t E = 16;
  return {random_tensor({2, heads_q, q_len, E}, DType::kFloat32, Layout::kBHSD, rng),
          random_tensor({2, heads_kv, kv_len, E}, DType::kFloat32, Layout::kBHSD, rng),
          random_tensor({2, heads_kv, kv_len, E}, DType::kFloat32, Layout::kBHSD, rng),
          random_tensor({2, heads_q, q_len, E}, DType::kFloat32, Layout::kBHSD, rng)};
}

void forward_and_backward(const Inputs& in, const SDPAOptions& options) {
  const AttentionResult r = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, options);
  scaled_dot_product_attention_backward(in.grad_out, in.q, in.k, in.v, r.out, r.lse, options);
}

class AllocationFailure : public testing::TestWithParam<SDPBackend> {};

TEST_P(AllocationFailure, EveryAllocationOfACallEndsInAnError) {
  const ScopedThreads threads(2);
  const sdpa_kernel guard(GetParam());
  SDPAOptions gqa;
  gqa.enable_gqa = true;
  SDPAOptions causal = gqa;
  causal.is_causal = true;
  const Inputs prefill = make_inputs(4, 2, 130, 70);
  const Inputs decode = make_inputs(4, 2, 1, 1100);  // FLASH: split-KV chunks and merge
  EXPECT_GT(fail_each_allocation([&] { forward_and_backward(prefill, gqa); }), 0);
  EXPECT_GT(fail_each_allocation([&] { forward_and_backward(prefill, causal); }), 0);
  EXPECT_GT(fail_each_allocation(
                [&] { scaled_dot_product_attention(decode.q, decode.k, decode.v, gqa); }),
            0);
  const flex::Program soft_cap = flex::Program::from_score_mod(flex::mods::soft_cap(5.0));
  EXPECT_GT(fail_each_allocation([&] {
              flex_attention(prefill.q, prefill.k, prefill.v, soft_cap, nullptr, gqa);
            }),
            0);
}

INSTANTIATE_TEST_SUITE_P(Backends, AllocationFailure,
                         testing::Values(SDPBackend::FLASH_ATTENTION, SDPBackend::MATH),
                         [](const testing::TestParamInfo<SDPBackend>& info) {
                           return std::string(backend_name(info.param));
                         });

}  // namespace
}  // namespace sdpa::test
