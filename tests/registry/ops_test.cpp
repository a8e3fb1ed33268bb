// merge_attention_states and materialize_bias on the host and on the example plugin's
// device, and plugins loaded from the SDPA_BACKENDS environment variable.

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "arena_fixture.h"

namespace sdpa {
namespace {

using namespace arena_test;

// Attention over keys [0, S) equals merging attention over [0, split) and [split, S).
void expect_merge_matches(DType dtype, SDPBackend backend, double tolerance) {
  const int64_t b = 2, h = 3, l = 5, s = 13, split = 6, e = 7;
  const Inputs in = host_inputs(b, h, h, l, s, e, e, dtype, 21);
  Tensor mask = Tensor::full({b, h, l, s}, 1.0, DType::kBool);
  std::mt19937 rng(5);
  for (int64_t i = 0; i < mask.numel(); ++i) mask.data<bool>()[i] = rng() % 3 != 0;
  for (int64_t j = 0; j < s; ++j) {
    set(mask, {0, 0, 0, j}, j >= split);  // row masked in the first half only
    set(mask, {0, 1, 1, j}, j < split);   // row masked in the second half only
    set(mask, {1, 2, 4, j}, false);       // row masked everywhere
  }
  sdpa_kernel guard(backend);
  SDPAOptions all;
  all.attn_mask = mask;
  const AttentionResult full = scaled_dot_product_attention_with_lse(in.q, in.k, in.v, all);
  SDPAOptions first, second;
  first.attn_mask = mask.slice(3, 0, split);
  second.attn_mask = mask.slice(3, split, s);
  const AttentionResult a = scaled_dot_product_attention_with_lse(
      in.q, in.k.slice(2, 0, split), in.v.slice(2, 0, split), first);
  const AttentionResult c = scaled_dot_product_attention_with_lse(
      in.q, in.k.slice(2, split, s), in.v.slice(2, split, s), second);
  EXPECT_EQ(a.lse.item({0, 0, 0}), -kInf);
  EXPECT_EQ(c.lse.item({0, 1, 1}), -kInf);
  const AttentionState merged = merge_attention_states(a.out, a.lse, c.out, c.lse);
  EXPECT_EQ(merged.out.dtype(), dtype);
  EXPECT_LT(max_diff(merged.out, full.out), tolerance);
  EXPECT_LT(max_diff(merged.lse, full.lse), 1e-5);
  EXPECT_EQ(merged.lse.item({1, 2, 4}), -kInf);
  for (int64_t j = 0; j < e; ++j) EXPECT_EQ(merged.out.item({1, 2, 4, j}), 0.0);
}

// The float32 lse bounds the accuracy of a merge, also for float64 outputs.
TEST(Merge, TwoHalvesOfTheKeysEqualAttentionOverAll) {
  expect_merge_matches(DType::kFloat64, SDPBackend::MATH, 1e-6);
  expect_merge_matches(DType::kFloat32, SDPBackend::FLASH_ATTENTION, 2e-6);
}

// The NaN rule of online_softmax.h: a NaN lse on either side makes its row NaN, also
// beside a fully masked side (std::max(-inf, NaN) would have dropped it); a fully masked
// side's out is not read, even when it holds infinities.
TEST(Merge, NanLseMakesTheRowNanAndAMaskedSideIsNotRead) {
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  const Tensor out_a = randn({3, 5}, DType::kFloat32, 1);
  Tensor out_b = randn({3, 5}, DType::kFloat32, 2);
  Tensor lse_a = randn({3}, DType::kFloat32, 3), lse_b = randn({3}, DType::kFloat32, 4);
  set(lse_a, {0}, -kInf);
  set(lse_b, {0}, kNan);  // masked beside NaN
  set(lse_a, {1}, kNan);  // NaN beside finite
  set(lse_b, {2}, -kInf);  // masked side holding infinities
  for (int64_t j = 0; j < 5; ++j) set(out_b, {2, j}, kInf);
  const AttentionState merged = merge_attention_states(out_a, lse_a, out_b, lse_b);
  for (int64_t row = 0; row < 2; ++row) {
    EXPECT_TRUE(std::isnan(merged.lse.item({row}))) << "row " << row;
    for (int64_t j = 0; j < 5; ++j) EXPECT_TRUE(std::isnan(merged.out.item({row, j})));
  }
  EXPECT_EQ(merged.lse.item({2}), lse_a.item({2}));
  for (int64_t j = 0; j < 5; ++j) EXPECT_NEAR(merged.out.item({2, j}), out_a.item({2, j}), 1e-6);
}

TEST(Merge, RejectsInconsistentInputs) {
  const Tensor out = randn({2, 3, 4}, DType::kFloat32, 1);
  const Tensor lse = randn({2, 3}, DType::kFloat32, 2);
  std::string e = error_of([&] { merge_attention_states(out, lse.to(DType::kFloat64), out, lse); });
  EXPECT_TRUE(contains(e, "lse_a: expected dtype float32, got float64")) << e;
  e = error_of([&] { merge_attention_states(out, lse, out.slice(1, 0, 2), lse); });
  EXPECT_TRUE(contains(e, "out_b: expected shape [2, 3, 4] (the out_a shape), got [2, 2, 4]"))
      << e;
}

TEST_F(ArenaTest, MergeOnTheDeviceFallsBackToCpu) {
  const Tensor out_a = randn({3, 4, 5}, DType::kFloat32, 1);
  const Tensor out_b = randn({3, 4, 5}, DType::kFloat32, 2);
  Tensor lse_a = randn({3, 4}, DType::kFloat32, 3);
  const Tensor lse_b = randn({3, 4}, DType::kFloat32, 4);
  set(lse_a, {1, 1}, -kInf);
  const AttentionState host = merge_attention_states(out_a, lse_a, out_b, lse_b);
  reset_fallback_counts();
  ::testing::internal::CaptureStderr();
  const AttentionState dev =
      merge_attention_states(to_device(out_a, arena()), to_device(lse_a, arena()),
                             to_device(out_b, arena()), to_device(lse_b, arena()));
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(fallback_counts()["merge_attention_states"], 1);
  EXPECT_EQ(dev.out.device(), arena());
  EXPECT_EQ(max_diff(dev.out, host.out), 0.0);
  EXPECT_EQ(max_diff(dev.lse, host.lse), 0.0);
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(host.out.item({1, 1, j}), out_b.item({1, 1, j}));
}

TEST_F(ArenaTest, MaterializeBias) {
  const Inputs host = host_inputs(1, 2, 2, 3, 4, 8, 8);
  SDPAOptions causal;
  causal.is_causal = true;
  const Tensor bias = materialize_bias(host.q, host.k, host.v, causal);
  EXPECT_EQ(bias.sizes(), (Shape{1, 2, 3, 4}));
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(bias.item({0, 1, i, j}), j <= i ? 0.0 : -kInf) << i << "," << j;
    }
  }
  // A bool mask on the device, through the CPU fallback.
  Tensor keep = Tensor::full({3, 4}, 1.0, DType::kBool);
  set(keep, {1, 2}, 0.0);
  SDPAOptions masked;
  masked.attn_mask = to_device(keep, arena());
  const Inputs dev = on_arena(host);
  ::testing::internal::CaptureStderr();
  const Tensor dev_bias = materialize_bias(dev.q, dev.k, dev.v, masked);
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(dev_bias.device(), arena());
  const Tensor b = to_host(dev_bias);
  EXPECT_EQ(b.item({0, 0, 1, 2}), -kInf);
  EXPECT_EQ(b.item({0, 1, 1, 1}), 0.0);
}

// Child-process bodies of the SDPA_BACKENDS tests: exit 0 when everything holds.
void load_from_env_twice_listed() {
  const std::string twice = std::string(kPluginPath) + ":" + kPluginPath;
  setenv("SDPA_BACKENDS", twice.c_str(), 1);
  const std::vector<std::string> keys = dispatch_keys();  // the first use loads
  const bool ok = keys == std::vector<std::string>{"CPU", "CUDA", "arena"} &&
                  loaded_backends().size() == 1 &&
                  load_backend(kPluginPath).keys == std::vector<std::string>{"arena"} &&
                  dispatch_keys().size() == 3;
  std::exit(ok ? 0 : 1);
}

void report_bad_env_path_once() {
  setenv("SDPA_BACKENDS", "/nonexistent/libx.so", 1);
  const std::string first = error_of([] { dispatch_keys(); });
  const bool ok = contains(first, "SDPA_BACKENDS: cannot load '/nonexistent/libx.so'") &&
                  error_of([] { dispatch_keys(); }) == "(no error)";
  std::exit(ok ? 0 : 1);
}

// SDPA_BACKENDS is read once, at the first use, so each case runs in a fresh process.
TEST(PluginEnv, BackendsFromTheEnvironmentLoadOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(load_from_env_twice_listed(), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(report_bad_env_path_once(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace sdpa
