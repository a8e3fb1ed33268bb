// The registry against the example plugin (examples/external_backend): a simulated device
// whose memory is its own arena and which implements only the functional `attention`.

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <limits>
#include <random>
#include <string>

#include "arena_fixture.h"
#include "sdpa/registry.h"

namespace sdpa {
namespace {

using namespace arena_test;

TEST(Plugin, LoadsAndRegistersItsDevice) {
  const LoadedBackend loaded = load_backend(kPluginPath);
  ASSERT_EQ(loaded.keys, std::vector<std::string>{"arena"});
  EXPECT_EQ(loaded.devices.at(0).type, DeviceType::kExternal);
  // Loading again returns the first result instead of registering a second device.
  EXPECT_EQ(load_backend(kPluginPath).devices.at(0), loaded.devices.at(0));
  EXPECT_EQ(loaded_backends().size(), 1u);
  const std::vector<std::string> keys = dispatch_keys();
  EXPECT_EQ(keys, (std::vector<std::string>{"CPU", "CUDA", "arena"}));
  EXPECT_EQ(backend_for(arena()).name(), "arena");
  EXPECT_EQ(backend_named("arena").device(), arena());
  ASSERT_NE(arena_api().bytes_in_use, nullptr);
}

TEST(Plugin, LoadErrorsNameThePath) {
  const std::string missing = error_of([] { load_backend("/nonexistent/libnothing.so"); });
  EXPECT_TRUE(contains(missing, "load_backend: cannot load '/nonexistent/libnothing.so'"))
      << missing;
  // A shared library that is not a plugin: the C++ runtime this test links.
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&std::terminate), &info), 0);
  const std::string runtime = info.dli_fname;
  const std::string foreign = error_of([&] { load_backend(runtime); });
  EXPECT_TRUE(contains(foreign, "load_backend: '" + runtime + "' is not an sdpa backend plugin"))
      << foreign;
}

TEST(Ops, ListsSchemasAndHowEachKeyImplementsThem) {
  arena();
  EXPECT_EQ(implementation("attention", "arena").source, KernelSource::kKernel);
  EXPECT_EQ(implementation("attention.out", "arena").source, KernelSource::kDerived);
  EXPECT_EQ(implementation("attention.out", "arena").from, "attention");
  EXPECT_EQ(implementation("attention_", "arena").source, KernelSource::kDerived);
  EXPECT_EQ(implementation("attention_backward", "arena").source, KernelSource::kFallback);
  EXPECT_EQ(implementation("attention_backward.out", "arena").source, KernelSource::kFallback);
  EXPECT_EQ(implementation("merge_attention_states", "arena").source, KernelSource::kFallback);
  // CPU: explicit attention.out; the functional and in-place variants are derived.
  EXPECT_EQ(implementation("attention.out", "CPU").source, KernelSource::kKernel);
  EXPECT_EQ(implementation("attention", "CPU").source, KernelSource::kDerived);
  EXPECT_EQ(implementation("attention", "CPU").from, "attention.out");
  EXPECT_EQ(implementation("attention_", "CPU").source, KernelSource::kDerived);
  EXPECT_EQ(implementation("attention_backward", "CPU").source, KernelSource::kKernel);
  EXPECT_EQ(implementation("attention", "CUDA").source, KernelSource::kNone);

  const std::string text = describe_ops();
  EXPECT_TRUE(contains(text, "attention.out(Tensor query, Tensor key, Tensor value, Tensor? "
                             "attn_mask=None, float dropout_p=0.0, bool is_causal=False, float? "
                             "scale=None, bool enable_gqa=False, *, Tensor(a!) out, Tensor(b!) "
                             "lse) -> (Tensor(a!) out, Tensor(b!) lse)"))
      << text;
  EXPECT_TRUE(contains(text, "  arena: derived from attention\n")) << text;
  EXPECT_TRUE(contains(text, "  arena: CPU fallback\n")) << text;
}

TEST_F(ArenaTest, FunctionalAttentionRunsOnTheDevice) {
  const Inputs host = host_inputs(2, 6, 3, 5, 7, 8, 12);
  const Inputs dev = on_arena(host);
  SDPAOptions options;
  options.enable_gqa = true;
  options.is_causal = true;
  const int64_t calls = arena_api().attention_calls();
  const AttentionResult r = scaled_dot_product_attention_with_lse(dev.q, dev.k, dev.v, options);
  EXPECT_EQ(r.backend, SDPBackend::OVERRIDEABLE);
  EXPECT_EQ(arena_api().attention_calls(), calls + 1);
  EXPECT_EQ(r.out.device(), arena());
  EXPECT_TRUE(arena_api().contains(r.out.data_ptr()));
  EXPECT_TRUE(arena_api().contains(r.lse.data_ptr()));
  const AttentionResult ref = reference(host.q, host.k, host.v, options);
  EXPECT_LT(max_diff(r.out, ref.out), 1e-5);
  EXPECT_LT(max_diff(r.lse, ref.lse), 1e-5);
}

TEST_F(ArenaTest, FunctionalAttentionTakesDenseMasksAndUnbatchedInputs) {
  const Inputs host = host_inputs(1, 3, 3, 4, 9, 5, 5, DType::kFloat64, 7);
  Tensor mask = randn({4, 9}, DType::kFloat64, 11);
  set(mask, {2, 3}, -kInf);
  SDPAOptions options;
  options.attn_mask = to_device(mask, arena());
  const Tensor q3 = to_device(host.q.squeeze(0), arena());
  const Tensor k3 = to_device(host.k.squeeze(0), arena());
  const Tensor v3 = to_device(host.v.squeeze(0), arena());
  const AttentionResult r = scaled_dot_product_attention_with_lse(q3, k3, v3, options);
  EXPECT_EQ(r.backend, SDPBackend::OVERRIDEABLE);
  EXPECT_EQ(r.out.sizes(), (Shape{3, 4, 5}));
  SDPAOptions host_options;
  host_options.attn_mask = mask;
  const AttentionResult ref = reference(host.q.squeeze(0), host.k.squeeze(0), host.v.squeeze(0),
                                        host_options);
  EXPECT_LT(max_diff(r.out, ref.out), 1e-12);
  EXPECT_LT(max_diff(r.lse, ref.lse), 1e-5);
}

TEST_F(ArenaTest, OutVariantIsDerivedAndWritesAnyLayout) {
  const Inputs host = host_inputs(2, 3, 3, 5, 7, 8, 6);
  const Inputs dev = on_arena(host);
  const AttentionResult ref = reference(host.q, host.k, host.v);
  // Contiguous outs: written in place.
  Tensor out = empty({2, 3, 5, 6}, DType::kFloat32, arena());
  Tensor lse = empty({2, 3, 5}, DType::kFloat32, arena());
  void* out_data = out.data_ptr();
  const int64_t calls = arena_api().attention_calls();
  const AttentionResult r = scaled_dot_product_attention_out(dev.q, dev.k, dev.v, out, lse);
  EXPECT_EQ(r.backend, SDPBackend::OVERRIDEABLE);
  EXPECT_EQ(arena_api().attention_calls(), calls + 1);  // derived from the functional kernel
  EXPECT_EQ(out.data_ptr(), out_data);
  EXPECT_LT(max_diff(out, ref.out), 1e-5);
  EXPECT_LT(max_diff(lse, ref.lse), 1e-5);

  // Other strides: a [B, L, H, Ev] buffer viewed as [B, H, L, Ev].
  Tensor blhe = empty({2, 5, 3, 6}, DType::kFloat32, arena());
  Tensor strided = blhe.transpose(1, 2);
  Tensor lse2;
  scaled_dot_product_attention_out(dev.q, dev.k, dev.v, strided, lse2);
  EXPECT_LT(max_diff(strided, ref.out), 1e-5);
  EXPECT_LT(max_diff(to_host(blhe).transpose(1, 2), ref.out), 1e-5);

  // Undefined and zero-element outs are replaced by new tensors on the device.
  ASSERT_TRUE(lse2.defined());
  EXPECT_EQ(lse2.sizes(), (Shape{2, 3, 5}));
  EXPECT_EQ(lse2.device(), arena());
  Tensor none;
  Tensor zero = empty({0}, DType::kFloat32, arena());
  scaled_dot_product_attention_out(dev.q, dev.k, dev.v, none, zero);
  EXPECT_EQ(none.device(), arena());
  EXPECT_EQ(zero.sizes(), (Shape{2, 3, 5}));
  EXPECT_LT(max_diff(none, ref.out), 1e-5);
  EXPECT_LT(max_diff(zero, ref.lse), 1e-5);
}

TEST(CpuVariants, OutWithOtherStridesAndInPlace) {
  const Inputs host = host_inputs(2, 4, 4, 9, 11, 16, 16);
  const AttentionResult ref = reference(host.q, host.k, host.v);
  Tensor blhe = Tensor::empty({2, 9, 4, 16}, DType::kFloat32);
  Tensor out = blhe.transpose(1, 2);
  Tensor lse;
  const AttentionResult r = scaled_dot_product_attention_out(host.q, host.k, host.v, out, lse);
  EXPECT_EQ(r.backend, SDPBackend::FLASH_ATTENTION);
  EXPECT_LT(max_diff(blhe.transpose(1, 2), ref.out), 1e-5);
  EXPECT_LT(max_diff(lse, ref.lse), 1e-5);
  Tensor q = host.q.clone();
  scaled_dot_product_attention_(q, host.k, host.v);
  EXPECT_LT(max_diff(q, ref.out), 1e-5);
}

TEST_F(ArenaTest, InPlaceVariantIsDerived) {
  const Inputs host = host_inputs(1, 2, 2, 6, 6, 8, 8);
  const Inputs dev = on_arena(host);
  const AttentionResult ref = reference(host.q, host.k, host.v);
  Tensor q = dev.q;
  const Tensor result = scaled_dot_product_attention_(q, dev.k, dev.v);
  EXPECT_EQ(result.data_ptr(), dev.q.data_ptr());
  EXPECT_LT(max_diff(dev.q, ref.out), 1e-5);

  // Self-attention with q = k = v: the functional result is complete before q is written.
  Tensor x = to_device(host.q, arena());
  const AttentionResult self_ref = reference(host.q, host.q, host.q);
  scaled_dot_product_attention_(x, x, x);
  EXPECT_LT(max_diff(x, self_ref.out), 1e-5);

  // Ev != E cannot be written into the query.
  const Inputs wide = on_arena(host_inputs(1, 2, 2, 6, 6, 8, 4));
  const std::string e = error_of([&] { scaled_dot_product_attention_(wide.q, wide.k, wide.v); });
  EXPECT_TRUE(contains(e, "attention_: query: the result [1, 2, 6, 4]")) << e;
  EXPECT_TRUE(contains(e, "Ev == E")) << e;
}

TEST_F(ArenaTest, ExplicitOutRegisteredLaterWins) {
  const Inputs host = host_inputs(1, 2, 2, 3, 5, 4, 4);
  const Inputs dev = on_arena(host);
  int explicit_calls = 0;
  BackendHandle arena_key = backend_for(arena());
  arena_key.impl(op::attention_out, [&](const AttentionParams& p, const Tensor& out,
                                        const Tensor& lse) {
    ++explicit_calls;
    EXPECT_TRUE(out.is_contiguous());
    const AttentionResult r = reference(p.q, p.k, p.v);
    copy(out, r.out);
    copy(lse, r.lse);
  });
  struct Unregister {
    BackendHandle key;
    ~Unregister() { key.remove("attention.out"); }
  } unregister{arena_key};
  EXPECT_EQ(implementation("attention.out", "arena").source, KernelSource::kKernel);

  const int64_t calls = arena_api().attention_calls();
  Tensor out, lse;
  scaled_dot_product_attention_out(dev.q, dev.k, dev.v, out, lse);
  EXPECT_EQ(explicit_calls, 1);
  EXPECT_EQ(arena_api().attention_calls(), calls);  // the functional kernel did not run
  const AttentionResult ref = reference(host.q, host.k, host.v);
  EXPECT_LT(max_diff(out, ref.out), 1e-6);
  EXPECT_LT(max_diff(lse, ref.lse), 1e-6);
  // An out with other strides: the kernel writes a contiguous temporary, copied back.
  Tensor blhe = empty({1, 3, 2, 4}, DType::kFloat32, arena());
  Tensor strided = blhe.transpose(1, 2);
  scaled_dot_product_attention_out(dev.q, dev.k, dev.v, strided, lse);
  EXPECT_EQ(explicit_calls, 2);
  EXPECT_LT(max_diff(to_host(blhe).transpose(1, 2), ref.out), 1e-6);
  // The functional op keeps its own explicit kernel.
  scaled_dot_product_attention(dev.q, dev.k, dev.v);
  EXPECT_EQ(arena_api().attention_calls(), calls + 1);
  EXPECT_EQ(explicit_calls, 2);

  EXPECT_TRUE(arena_key.remove("attention.out"));
  EXPECT_EQ(implementation("attention.out", "arena").source, KernelSource::kDerived);
}

TEST_F(ArenaTest, BackwardRunsThroughTheCountedCpuFallback) {
  const Inputs host = host_inputs(2, 4, 2, 5, 7, 8, 6);
  const Inputs dev = on_arena(host);
  SDPAOptions options;
  options.enable_gqa = true;
  const AttentionResult fwd = scaled_dot_product_attention_with_lse(dev.q, dev.k, dev.v, options);
  const Tensor grad_out = to_device(randn({2, 4, 5, 6}, DType::kFloat32, 99), arena());

  reset_fallback_counts();
  ::testing::internal::CaptureStderr();
  const AttentionGradients g = scaled_dot_product_attention_backward(
      grad_out, dev.q, dev.k, dev.v, fwd.out, fwd.lse, options);
  const AttentionGradients g2 = scaled_dot_product_attention_backward(
      grad_out, dev.q, dev.k, dev.v, fwd.out, fwd.lse, options);
  const std::string warnings = ::testing::internal::GetCapturedStderr();

  EXPECT_EQ(fallback_counts()["attention_backward"], 2);
  const std::string warning = "arena (" + device_name(arena()) + ") has no kernel for "
                              "attention_backward; running it on CPU";
  const size_t first = warnings.find(warning);
  EXPECT_NE(first, std::string::npos) << warnings;
  EXPECT_EQ(warnings.find(warning, first + 1), std::string::npos) << "warned twice: " << warnings;
  EXPECT_NE(g.backend, SDPBackend::OVERRIDEABLE);  // a CPU backend ran it
  EXPECT_EQ(g.grad_q.device(), arena());
  EXPECT_TRUE(arena_api().contains(g.grad_k.data_ptr()));

  // Reference: the float64 MATH backward on the host.
  const AttentionResult ref_fwd = reference(host.q, host.k, host.v, options);
  const AttentionGradients ref = [&] {
    sdpa_kernel guard(SDPBackend::MATH);
    return scaled_dot_product_attention_backward(
        to_host(grad_out).to(DType::kFloat64), host.q.to(DType::kFloat64),
        host.k.to(DType::kFloat64), host.v.to(DType::kFloat64), ref_fwd.out, ref_fwd.lse,
        options);
  }();
  EXPECT_LT(max_diff(g.grad_q, ref.grad_q), 2e-5);
  EXPECT_LT(max_diff(g.grad_k, ref.grad_k), 2e-5);
  EXPECT_LT(max_diff(g.grad_v, ref.grad_v), 2e-5);
  EXPECT_EQ(max_diff(g.grad_q, g2.grad_q), 0.0);

  // The .out variant falls back too (the plugin has neither), counted under its own name.
  Tensor gq, gk, gv;
  scaled_dot_product_attention_backward_out(grad_out, dev.q, dev.k, dev.v, fwd.out, fwd.lse,
                                            gq, gk, gv, options);
  EXPECT_EQ(fallback_counts()["attention_backward.out"], 1);
  EXPECT_EQ(gk.device(), arena());
  EXPECT_LT(max_diff(gk, ref.grad_k), 2e-5);
}

TEST_F(ArenaTest, StrictModeTurnsTheFallbackIntoAnError) {
  const Inputs dev = on_arena(host_inputs(1, 2, 2, 3, 4, 8, 8));
  const AttentionResult fwd = scaled_dot_product_attention_with_lse(dev.q, dev.k, dev.v);
  reset_fallback_counts();
  ScopedEnv strict("SDPA_STRICT_BACKENDS", "1");
  const std::string e = error_of([&] {
    scaled_dot_product_attention_backward(fwd.out, dev.q, dev.k, dev.v, fwd.out, fwd.lse);
  });
  EXPECT_TRUE(contains(e, "attention_backward: arena (" + device_name(arena()) +
                              ") has no kernel for it and SDPA_STRICT_BACKENDS=1 forbids the "
                              "CPU fallback"))
      << e;
  EXPECT_TRUE(fallback_counts().empty());
  // The plugin's own kernel is unaffected.
  EXPECT_NO_THROW(scaled_dot_product_attention(dev.q, dev.k, dev.v));
}

TEST_F(ArenaTest, WrongOutsGiveErrorsNamingTheArgument) {
  const Inputs dev = on_arena(host_inputs(2, 3, 3, 5, 7, 8, 8));
  auto out_error = [&](Tensor out, Tensor lse) {
    return error_of([&] { scaled_dot_product_attention_out(dev.q, dev.k, dev.v, out, lse); });
  };
  const Tensor good_lse = empty({2, 3, 5}, DType::kFloat32, arena());
  const Tensor good_out = empty({2, 3, 5, 8}, DType::kFloat32, arena());
  std::string e = out_error(empty({2, 3, 5, 8}, DType::kFloat64, arena()), good_lse);
  EXPECT_TRUE(contains(e, "attention.out: out: expected dtype float32, got float64")) << e;
  e = out_error(good_out, Tensor::empty({2, 3, 5}, DType::kFloat32));
  EXPECT_TRUE(contains(e, "attention.out: lse: expected device " + device_name(arena()) +
                              " (the inputs' device), got cpu"))
      << e;
  e = out_error(empty({2, 3, 5, 9}, DType::kFloat32, arena()), good_lse);
  EXPECT_TRUE(contains(e, "attention.out: out: expected shape [2, 3, 5, 8], got [2, 3, 5, 9]"))
      << e;
  // An out that is the query's memory.
  e = out_error(dev.q, good_lse);
  EXPECT_TRUE(contains(e, "attention.out: out overlaps query (they share memory)")) << e;
  // Outs overlapping each other.
  Tensor buffer = empty({2 * 3 * 5 * 8 + 30}, DType::kFloat32, arena());
  Tensor out = buffer.slice(0, 0, 240).view({2, 3, 5, 8});
  Tensor lse = buffer.slice(0, 230, 260).view({2, 3, 5});
  e = out_error(out, lse);
  EXPECT_TRUE(contains(e, "attention.out: lse overlaps out")) << e;
  // The same checks guard CPU calls.
  const Inputs host = host_inputs(1, 2, 2, 3, 4, 8, 8);
  Tensor cpu_out = host.v.slice(2, 0, 3);
  Tensor cpu_lse;
  e = error_of([&] { scaled_dot_product_attention_out(host.q, host.k, host.v, cpu_out, cpu_lse); });
  EXPECT_TRUE(contains(e, "attention.out: out overlaps value")) << e;
  // Gradient outs name the schema's arguments.
  const AttentionResult fwd = scaled_dot_product_attention_with_lse(dev.q, dev.k, dev.v);
  Tensor gq = empty({2, 3, 5, 8}, DType::kFloat32, arena());
  Tensor gk = empty({2, 3, 7, 9}, DType::kFloat32, arena());
  Tensor gv;
  e = error_of([&] {
    scaled_dot_product_attention_backward_out(fwd.out, dev.q, dev.k, dev.v, fwd.out, fwd.lse, gq,
                                              gk, gv);
  });
  EXPECT_TRUE(contains(e, "attention_backward.out: grad_key: expected shape [2, 3, 7, 8]")) << e;
}

TEST_F(ArenaTest, OverrideableIsChosenWithThePluginsReasons) {
  const Inputs dev = on_arena(host_inputs(1, 2, 2, 3, 4, 8, 8));
  const Explanation chosen = explain(make_params(dev.q, dev.k, dev.v));
  EXPECT_EQ(chosen.chosen, SDPBackend::OVERRIDEABLE);
  EXPECT_EQ(select_backend(make_params(dev.q, dev.k, dev.v)), SDPBackend::OVERRIDEABLE);
  std::string text = chosen.to_string();
  EXPECT_TRUE(contains(text, "OVERRIDEABLE: supported (chosen)")) << text;
  EXPECT_TRUE(contains(text, "tensors are on " + device_name(arena()) +
                                 "; this backend runs on cpu"))
      << text;

  // The plugin's checks reject dropout, half types and biases it cannot run.
  SDPAOptions dropout;
  dropout.dropout_p = 0.25;
  const Explanation rejected = explain(make_params(dev.q, dev.k, dev.v, dropout));
  EXPECT_EQ(rejected.chosen, SDPBackend::ERROR);
  text = rejected.to_string();
  EXPECT_TRUE(contains(text, "OVERRIDEABLE is not supported because:\n  - arena: dropout is "
                             "not supported"))
      << text;
  const std::string e = error_of([&] { scaled_dot_product_attention(dev.q, dev.k, dev.v, dropout); });
  EXPECT_TRUE(contains(e, "arena: dropout is not supported")) << e;

  const Inputs half = on_arena(host_inputs(1, 2, 2, 3, 4, 8, 8, DType::kFloat16));
  SDPAOptions alibi;
  alibi.attn_mask = std::make_shared<AlibiBias>(2);
  text = explain(make_params(half.q, half.k, half.v, alibi)).to_string();
  EXPECT_TRUE(contains(text, "arena: dtype float16 is not supported")) << text;
  EXPECT_TRUE(contains(text, "arena: mask parts not supported: ALiBi")) << text;

  // A device nobody registered, and CPU tensors, keep the built-in reason.
  float host_memory[8] = {};
  const Tensor stray = Tensor::from_blob(host_memory, {1, 1, 1, 8}, {8, 8, 8, 1},
                                         DType::kFloat32, Device{DeviceType::kExternal, 77});
  text = explain(make_params(stray, stray, stray)).to_string();
  EXPECT_TRUE(contains(text, "no external backend is registered for external:77")) << text;
  const Inputs host = host_inputs(1, 2, 2, 3, 4, 8, 8);
  text = explain(make_params(host.q, host.k, host.v)).to_string();
  EXPECT_TRUE(contains(text, "no external backend is registered for cpu")) << text;
}

}  // namespace
}  // namespace sdpa
