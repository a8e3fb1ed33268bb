// Backend selection: names, default order, the sdpa_kernel guard (restriction, priority,
// nesting, thread-locality), process-wide flags, can_use / explain / select_backend
// agreeing with what runs, and the error listing every backend when nothing fits.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "sdpa/sdpa.h"

namespace sdpa {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

using B = SDPBackend;

Tensor filled(const Shape& shape, DType dtype = DType::kFloat32) {
  Tensor t = Tensor::empty(shape, dtype);
  Tensor flat = t.view({t.numel()});
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t idx[1] = {i};
    flat.set_item(idx, std::cos(0.37 * static_cast<double>(i)));
  }
  return t;
}

struct Qkv {
  Tensor q, k, v;
};
Qkv qkv(DType dtype = DType::kFloat32) {
  return {filled({1, 2, 5, 16}, dtype), filled({1, 2, 6, 16}, dtype), filled({1, 2, 6, 16}, dtype)};
}

AttentionParams params_for(DType dtype = DType::kFloat32, const SDPAOptions& o = {}) {
  const Qkv t = qkv(dtype);
  return make_params(t.q, t.k, t.v, o);
}

B ran(DType dtype = DType::kFloat32, const SDPAOptions& o = {}) {
  const Qkv t = qkv(dtype);
  return scaled_dot_product_attention_with_lse(t.q, t.k, t.v, o).backend;
}

// head_dim 0, which only MATH serves (an empty dot product).
Qkv qkv_head_dim_0() {
  return {Tensor::empty({1, 2, 5, 0}, DType::kFloat32), Tensor::empty({1, 2, 6, 0}, DType::kFloat32),
          Tensor::empty({1, 2, 6, 0}, DType::kFloat32)};
}
AttentionParams params_head_dim_0() {
  const Qkv t = qkv_head_dim_0();
  return make_params(t.q, t.k, t.v, {});
}
B ran_head_dim_0() {
  const Qkv t = qkv_head_dim_0();
  return scaled_dot_product_attention_with_lse(t.q, t.k, t.v).backend;
}

// Restores the process-wide flags (tests flip them).
struct FlagsReset {
  ~FlagsReset() {
    backends::enable_math_sdp(true);
    backends::enable_flash_sdp(true);
    backends::enable_mem_efficient_sdp(true);
    backends::enable_cudnn_sdp(true);
    backends::enable_overrideable_sdp(true);
  }
};

// ---- names and order ----------------------------------------------------------------

TEST(BackendNames, ValuesNamesAndParsing) {
  EXPECT_EQ(static_cast<int>(B::ERROR), -1);
  EXPECT_EQ(static_cast<int>(B::MATH), 0);
  EXPECT_EQ(static_cast<int>(B::FLASH_ATTENTION), 1);
  EXPECT_EQ(static_cast<int>(B::EFFICIENT_ATTENTION), 2);
  EXPECT_EQ(static_cast<int>(B::CUDNN_ATTENTION), 3);
  EXPECT_EQ(static_cast<int>(B::OVERRIDEABLE), 4);
  for (B b : {B::MATH, B::FLASH_ATTENTION, B::EFFICIENT_ATTENTION, B::CUDNN_ATTENTION,
              B::OVERRIDEABLE}) {
    const std::string name(backend_name(b));
    EXPECT_EQ(parse_backend(name), b);
    std::string lower = name;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(ch));
    EXPECT_EQ(parse_backend(lower), b);
  }
  EXPECT_EQ(backend_name(B::FLASH_ATTENTION), "FLASH_ATTENTION");
  EXPECT_EQ(backend_name(B::MATH), "MATH");
  EXPECT_EQ(parse_backend("flash"), B::FLASH_ATTENTION);
  EXPECT_EQ(parse_backend("math"), B::MATH);
  EXPECT_EQ(parse_backend("efficient"), B::EFFICIENT_ATTENTION);
  EXPECT_EQ(parse_backend("cudnn"), B::CUDNN_ATTENTION);
  for (const char* bad : {"", "warp", "ERROR", "flash2", " math"}) {
    EXPECT_THROW(parse_backend(bad), Error) << "'" << bad << "'";
  }
}

TEST(BackendNames, DefaultPriorityOrder) {
  EXPECT_THAT(default_priority_order(),
              ElementsAre(B::OVERRIDEABLE, B::CUDNN_ATTENTION, B::FLASH_ATTENTION,
                          B::EFFICIENT_ATTENTION, B::MATH));
}

TEST(BackendNames, VersionIsSemVer) {
  const std::string v = version();
  EXPECT_THAT(v, ::testing::MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+"));
}

// ---- default choice -----------------------------------------------------------------

TEST(Selection, DefaultPicksFlashForEveryDtypeOnCpu) {
  EXPECT_THAT(active_backends(), ElementsAre(B::OVERRIDEABLE, B::CUDNN_ATTENTION,
                                             B::FLASH_ATTENTION, B::EFFICIENT_ATTENTION, B::MATH));
  // float64 too, as torch's CPU flash kernel (it accumulates in float64).
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64}) {
    EXPECT_EQ(select_backend(params_for(d)), B::FLASH_ATTENTION) << dtype_name(d);
    EXPECT_EQ(ran(d), B::FLASH_ATTENTION) << dtype_name(d);
  }
  // With masks, causal, GQA and dropout too.
  SDPAOptions o;
  o.attn_mask = Tensor::full({5, 6}, 1, DType::kBool);
  EXPECT_EQ(ran(DType::kFloat32, o), B::FLASH_ATTENTION);
  o = {};
  o.is_causal = true;
  o.dropout_p = 0.2;
  EXPECT_EQ(ran(DType::kFloat32, o), B::FLASH_ATTENTION);
}

TEST(Selection, HeadDim0FallsBackToMath) {
  EXPECT_EQ(select_backend(params_head_dim_0()), B::MATH);
  EXPECT_EQ(ran_head_dim_0(), B::MATH);
}

TEST(Selection, GuardRestrictsToMath) {
  sdpa_kernel guard(B::MATH);
  EXPECT_THAT(active_backends(), ElementsAre(B::MATH));
  EXPECT_EQ(select_backend(params_for()), B::MATH);
  EXPECT_EQ(ran(), B::MATH);
  EXPECT_TRUE(backends::math_sdp_enabled());
  EXPECT_FALSE(backends::flash_sdp_enabled());
  EXPECT_FALSE(backends::mem_efficient_sdp_enabled());
}

TEST(Selection, WithoutPriorityTheDefaultOrderApplies) {
  sdpa_kernel guard({B::MATH, B::FLASH_ATTENTION});
  EXPECT_THAT(active_backends(), ElementsAre(B::FLASH_ATTENTION, B::MATH));
  EXPECT_EQ(ran(), B::FLASH_ATTENTION);
}

TEST(Selection, SetPriorityUsesTheGivenOrder) {
  {
    sdpa_kernel guard({B::MATH, B::FLASH_ATTENTION}, /*set_priority=*/true);
    EXPECT_THAT(active_backends(), ElementsAre(B::MATH, B::FLASH_ATTENTION));
    EXPECT_EQ(select_backend(params_for()), B::MATH);
    EXPECT_EQ(ran(), B::MATH);
    const Explanation e = explain(params_for());
    EXPECT_EQ(e.chosen, B::MATH);
    ASSERT_GE(e.verdicts.size(), 2u);
    EXPECT_EQ(e.verdicts[0].backend, B::MATH);
    EXPECT_EQ(e.verdicts[1].backend, B::FLASH_ATTENTION);
  }
  {
    // The first listed backend that does not fit is passed over.
    sdpa_kernel guard({B::EFFICIENT_ATTENTION, B::FLASH_ATTENTION, B::MATH}, true);
    EXPECT_EQ(ran(), B::FLASH_ATTENTION);
    EXPECT_EQ(ran_head_dim_0(), B::MATH);
  }
}

TEST(Selection, GuardsNestAndRestore) {
  const auto defaults = active_backends();
  {
    sdpa_kernel outer(B::MATH);
    EXPECT_EQ(ran(), B::MATH);
    {
      sdpa_kernel inner(B::FLASH_ATTENTION);
      EXPECT_THAT(active_backends(), ElementsAre(B::FLASH_ATTENTION));
      EXPECT_EQ(ran(), B::FLASH_ATTENTION);
      {
        sdpa_kernel innermost({B::FLASH_ATTENTION, B::MATH}, true);
        EXPECT_THAT(active_backends(), ElementsAre(B::FLASH_ATTENTION, B::MATH));
      }
      EXPECT_THAT(active_backends(), ElementsAre(B::FLASH_ATTENTION));
    }
    EXPECT_THAT(active_backends(), ElementsAre(B::MATH));
    EXPECT_EQ(ran(), B::MATH);
  }
  EXPECT_EQ(active_backends(), defaults);
  EXPECT_EQ(ran(), B::FLASH_ATTENTION);
}

// An inner guard may allow a backend the outer one did not (the innermost wins).
TEST(Selection, InnerGuardOverridesRatherThanIntersects) {
  sdpa_kernel outer(B::FLASH_ATTENTION);
  sdpa_kernel inner(B::MATH);
  EXPECT_EQ(ran(), B::MATH);
}

TEST(Selection, GuardIsRestoredWhenAnExceptionUnwinds) {
  try {
    sdpa_kernel guard(B::EFFICIENT_ATTENTION);
    ran();
    FAIL() << "EFFICIENT_ATTENTION ran on CPU";
  } catch (const Error&) {
  }
  EXPECT_EQ(ran(), B::FLASH_ATTENTION);
}

// ---- thread-locality ----------------------------------------------------------------

TEST(Selection, GuardDoesNotLeakIntoOtherThreads) {
  const auto defaults = active_backends();
  std::mutex mu;
  std::condition_variable cv;
  int stage = 0;  // 1: thread A holds its guard; 2: thread B has checked
  std::vector<B> seen_in_a, seen_in_b;
  B ran_in_a = B::ERROR, ran_in_b = B::ERROR;

  std::thread a([&] {
    sdpa_kernel guard(B::MATH);
    seen_in_a = active_backends();
    ran_in_a = ran();
    {
      std::lock_guard<std::mutex> lock(mu);
      stage = 1;
    }
    cv.notify_all();
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stage == 2; });
    // Still restricted here after B ran.
    EXPECT_EQ(ran(), B::MATH);
  });
  std::thread b([&] {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stage == 1; });
    }
    seen_in_b = active_backends();
    ran_in_b = ran();
    {
      std::lock_guard<std::mutex> lock(mu);
      stage = 2;
    }
    cv.notify_all();
  });
  a.join();
  b.join();
  EXPECT_THAT(seen_in_a, ElementsAre(B::MATH));
  EXPECT_EQ(ran_in_a, B::MATH);
  EXPECT_EQ(seen_in_b, defaults);
  EXPECT_EQ(ran_in_b, B::FLASH_ATTENTION);
}

TEST(Selection, MainThreadGuardDoesNotReachANewThread) {
  sdpa_kernel guard(B::MATH);
  B in_thread = B::ERROR;
  std::vector<B> active;
  std::thread t([&] {
    in_thread = ran();
    active = active_backends();
  });
  t.join();
  EXPECT_EQ(in_thread, B::FLASH_ATTENTION);
  EXPECT_EQ(active, default_priority_order());
  EXPECT_EQ(ran(), B::MATH);
}

// ---- process-wide flags -------------------------------------------------------------

TEST(Flags, DisablingFlashFallsBackToMath) {
  FlagsReset reset;
  EXPECT_TRUE(backends::flash_sdp_enabled());
  backends::enable_flash_sdp(false);
  EXPECT_FALSE(backends::flash_sdp_enabled());
  EXPECT_TRUE(backends::math_sdp_enabled());
  EXPECT_THAT(active_backends(), ::testing::Not(::testing::Contains(B::FLASH_ATTENTION)));
  EXPECT_EQ(ran(), B::MATH);
  Reasons r;
  EXPECT_FALSE(can_use(B::FLASH_ATTENTION, params_for(), &r));
  EXPECT_FALSE(r.items.empty());
  const Explanation e = explain(params_for());
  EXPECT_EQ(e.chosen, B::MATH);
  for (const auto& v : e.verdicts) {
    if (v.backend == B::FLASH_ATTENTION) {
      EXPECT_FALSE(v.allowed);
      EXPECT_TRUE(v.supported) << "disabled, but its checks pass";
      EXPECT_FALSE(v.reasons.empty());
    }
  }
  backends::enable_flash_sdp(true);
  EXPECT_EQ(ran(), B::FLASH_ATTENTION);
}

TEST(Flags, FlagsApplyInEveryThread) {
  FlagsReset reset;
  backends::enable_flash_sdp(false);
  B in_thread = B::ERROR;
  std::thread t([&] { in_thread = ran(); });
  t.join();
  EXPECT_EQ(in_thread, B::MATH);
}

TEST(Flags, AGuardTakesPrecedenceOverTheFlags) {
  FlagsReset reset;
  backends::enable_flash_sdp(false);
  sdpa_kernel guard(B::FLASH_ATTENTION);
  EXPECT_TRUE(backends::flash_sdp_enabled());
  EXPECT_EQ(ran(), B::FLASH_ATTENTION);
}

TEST(Flags, EveryFlagRoundTrips) {
  FlagsReset reset;
  const std::pair<void (*)(bool), bool (*)()> flags[] = {
      {backends::enable_math_sdp, backends::math_sdp_enabled},
      {backends::enable_flash_sdp, backends::flash_sdp_enabled},
      {backends::enable_mem_efficient_sdp, backends::mem_efficient_sdp_enabled},
      {backends::enable_cudnn_sdp, backends::cudnn_sdp_enabled},
      {backends::enable_overrideable_sdp, backends::overrideable_sdp_enabled}};
  for (const auto& [set, get] : flags) {
    EXPECT_TRUE(get());
    set(false);
    EXPECT_FALSE(get());
    set(true);
    EXPECT_TRUE(get());
  }
}

TEST(Flags, AllCpuBackendsDisabledIsAnErrorListingEveryBackend) {
  FlagsReset reset;
  backends::enable_flash_sdp(false);
  backends::enable_math_sdp(false);
  try {
    ran();
    FAIL() << "ran with every CPU backend disabled";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("MATH"), HasSubstr("FLASH_ATTENTION")));
  }
}

// ---- nothing fits -------------------------------------------------------------------

TEST(NothingFits, ErrorListsEveryBackendWithReasons) {
  sdpa_kernel guard(B::EFFICIENT_ATTENTION);
  const Qkv t = qkv();
  try {
    scaled_dot_product_attention(t.q, t.k, t.v);
    FAIL() << "EFFICIENT_ATTENTION ran on CPU";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (B b : default_priority_order()) {
      EXPECT_THAT(msg, HasSubstr(std::string(backend_name(b)) + " is not supported because"))
          << msg;
    }
  }
  EXPECT_THROW(select_backend(params_for()), Error);
}

TEST(NothingFits, HeadDim0WithOnlyFlashAllowedNamesTheHeadDim) {
  sdpa_kernel guard(B::FLASH_ATTENTION);
  try {
    ran_head_dim_0();
    FAIL() << "FLASH_ATTENTION ran head_dim 0";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("FLASH_ATTENTION is not supported because"),
                                HasSubstr("head_dim 0")));
  }
}

// ---- can_use / explain / select agree with what runs ---------------------------------

TEST(CanUse, FlashRejectsHeadDim0WithAReason) {
  Reasons r;
  EXPECT_FALSE(can_use(B::FLASH_ATTENTION, params_head_dim_0(), &r));
  ASSERT_FALSE(r.items.empty());
  bool mentions = false;
  for (const auto& s : r.items) mentions |= s.find("head_dim 0") != std::string::npos;
  EXPECT_TRUE(mentions) << ::testing::PrintToString(r.items);
  EXPECT_TRUE(can_use(B::MATH, params_head_dim_0()));
  EXPECT_TRUE(can_use(B::FLASH_ATTENTION, params_for()));
  EXPECT_TRUE(can_use(B::FLASH_ATTENTION, params_for(DType::kFloat64)));
  EXPECT_FALSE(can_use(B::FLASH_ATTENTION, params_head_dim_0(), nullptr));
}

TEST(CanUse, GpuBackendsAreNotSupportedOnCpuWithReasons) {
  for (B b : {B::EFFICIENT_ATTENTION, B::CUDNN_ATTENTION, B::OVERRIDEABLE}) {
    Reasons r;
    EXPECT_FALSE(can_use(b, params_for(), &r)) << backend_name(b);
    EXPECT_FALSE(r.items.empty()) << backend_name(b);
  }
}

TEST(CanUse, RespectsTheCallingThreadsGuard) {
  sdpa_kernel guard(B::MATH);
  Reasons r;
  EXPECT_FALSE(can_use(B::FLASH_ATTENTION, params_for(), &r));
  EXPECT_FALSE(r.items.empty());
  EXPECT_TRUE(can_use(B::MATH, params_for()));
}

TEST(CanUse, ReasonsAreNotCollectedWhenCollectIsOff) {
  Reasons r;
  r.collect = false;
  EXPECT_FALSE(can_use(B::FLASH_ATTENTION, params_head_dim_0(), &r));
  EXPECT_TRUE(r.items.empty());
}

TEST(Explain, ListsEveryBackendWithVerdictsInPriorityOrder) {
  const Explanation e = explain(params_head_dim_0());
  EXPECT_EQ(e.chosen, B::MATH);
  std::vector<B> listed;
  for (const auto& v : e.verdicts) listed.push_back(v.backend);
  EXPECT_EQ(listed, default_priority_order());
  for (const auto& v : e.verdicts) {
    EXPECT_TRUE(v.allowed) << backend_name(v.backend);
    if (v.backend == B::MATH) {
      EXPECT_TRUE(v.supported);
    } else {
      EXPECT_FALSE(v.supported) << backend_name(v.backend);
      EXPECT_FALSE(v.reasons.empty()) << backend_name(v.backend);
    }
  }
  const std::string text = e.to_string();
  EXPECT_THAT(text, HasSubstr("chosen: MATH"));
  EXPECT_THAT(text, HasSubstr("MATH: supported"));
  for (B b : {B::OVERRIDEABLE, B::CUDNN_ATTENTION, B::FLASH_ATTENTION, B::EFFICIENT_ATTENTION}) {
    EXPECT_THAT(text, HasSubstr(std::string(backend_name(b)) + " is not supported because"));
  }
  EXPECT_THAT(text, HasSubstr("head_dim 0"));
}

TEST(Explain, ReportsGuardRestrictionsAndNeverThrows) {
  sdpa_kernel guard(B::EFFICIENT_ATTENTION);
  Explanation e;
  ASSERT_NO_THROW(e = explain(params_for()));
  EXPECT_EQ(e.chosen, B::ERROR);
  EXPECT_EQ(e.verdicts.size(), default_priority_order().size());
  for (const auto& v : e.verdicts) {
    EXPECT_EQ(v.allowed, v.backend == B::EFFICIENT_ATTENTION) << backend_name(v.backend);
    if (!v.allowed) {
      EXPECT_FALSE(v.reasons.empty()) << backend_name(v.backend);
    }
  }
}

TEST(Explain, MaskHandlingIsDescribed) {
  SDPAOptions o;
  o.attn_mask = Tensor::full({5, 6}, 1, DType::kBool);
  const Explanation e = explain(params_for(DType::kFloat32, o));
  for (const auto& v : e.verdicts) {
    if (v.backend == B::MATH || v.backend == B::FLASH_ATTENTION) {
      EXPECT_FALSE(v.bias_handling.empty()) << backend_name(v.backend);
    }
  }
  const Explanation none = explain(params_for());
  for (const auto& v : none.verdicts) EXPECT_TRUE(v.bias_handling.empty());
}

// "Supported" and "ran" cannot disagree: over a spread of calls and guards, explain(),
// select_backend(), can_use() and the backend that actually ran all agree.
TEST(Agreement, ExplainSelectCanUseAndRunAgree) {
  const std::vector<std::vector<B>> guards = {
      default_priority_order(), {B::MATH}, {B::FLASH_ATTENTION}, {B::MATH, B::FLASH_ATTENTION}};
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
    for (int variant = 0; variant < 4; ++variant) {
      SDPAOptions o;
      if (variant == 1) o.is_causal = true;
      if (variant == 2) o.attn_mask = Tensor::zeros({5, 6}, d);
      if (variant == 3) o.dropout_p = 0.5;
      for (size_t g = 0; g < guards.size(); ++g) {
        for (bool priority : {false, true}) {
          sdpa_kernel guard(guards[g], priority);
          const AttentionParams p = params_for(d, o);
          const Explanation e = explain(p);
          B first_usable = B::ERROR;
          for (B b : active_backends()) {
            if (can_use(b, p)) {
              first_usable = b;
              break;
            }
          }
          EXPECT_EQ(e.chosen, first_usable) << dtype_name(d) << " variant " << variant;
          if (first_usable == B::ERROR) {
            EXPECT_THROW(select_backend(p), Error);
            EXPECT_THROW(ran(d, o), Error);
          } else {
            EXPECT_EQ(select_backend(p), first_usable);
            EXPECT_EQ(ran(d, o), first_usable) << dtype_name(d) << " variant " << variant;
          }
          for (const auto& v : e.verdicts) {
            EXPECT_EQ(v.allowed && v.supported, can_use(v.backend, p))
                << backend_name(v.backend) << " " << dtype_name(d) << " variant " << variant;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace sdpa
