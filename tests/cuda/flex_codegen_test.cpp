// Flex programs as CUDA C++ (cuda/flex_codegen.h) compiled by NVRTC (cuda/nvrtc.h). NVRTC
// compiles without a GPU, so every standard mod, their derivatives and a few hundred
// random programs are compiled here for sm_80 and sm_90; running them is for a GPU.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cuda/flex_codegen.h"
#include "cuda/nvrtc.h"
#include "flex/program_gen.h"
#include "sdpa/cuda.h"
#include "sdpa/flex_mods.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::flex::Expr;
using sdpa::flex::Program;

#define SKIP_WITHOUT_NVRTC() \
  if (!sdpa::cuda::nvrtc_load_error().empty()) GTEST_SKIP() << sdpa::cuda::nvrtc_load_error()

// A kernel that calls every generated function, so NVRTC compiles them for real.
std::string with_kernel(const std::string& unit) {
  return unit +
         "extern \"C\" __global__ void sdpa_flex_probe(float* out, const SdpaCapturedTensor* c,\n"
         "    const SdpaCapturedTensor* m, SdpaFlexStatus* status) {\n"
         "  const long long j = threadIdx.x;\n"
         "  out[j] = sdpa_score_mod(0.5f, 0, 1, 2, j, c, status) *\n"
         "           sdpa_score_mod_grad(0.5f, 0, 1, 2, j, c, status) +\n"
         "           (sdpa_mask_mod(0.0f, 0, 1, 2, j, m, status) ? 1.0f : 0.0f);\n"
         "}\n";
}

void expect_compiles(const std::string& what, const Program* score_mod, const Program* mask_mod) {
  SCOPED_TRACE(what);
  const std::string source = with_kernel(sdpa::cuda::flex_translation_unit(score_mod, mask_mod, true));
  for (int arch : {80, 90}) {
    try {
      const sdpa::cuda::CompiledModule m = sdpa::cuda::compile_cubin(source, arch);
      EXPECT_GT(m.cubin.size(), 0u);
      EXPECT_EQ(m.cubin.compare(0, 4, "\x7f" "ELF"), 0);
    } catch (const sdpa::Error& e) {
      ADD_FAILURE() << "sm_" << arch << ": " << e.what() << "\n" << source;
    }
  }
}

class FlexCodegen : public ::testing::Test {
 protected:
  void SetUp() override {
    // A cache of this test's own, so compilation really happens.
    dir_ = std::filesystem::temp_directory_path() /
           ("sdpa_nvrtc_test_" + std::to_string(::getpid()));
    setenv("SDPA_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("SDPA_CACHE_DIR");
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
};

TEST_F(FlexCodegen, StandardModsAndTheirDerivativesCompile) {
  SKIP_WITHOUT_NVRTC();
  const Tensor slopes = randn({8}, DType::kFloat32, 1);
  const Tensor table = randn({8, 33}, DType::kBFloat16, 2);
  Tensor ids = Tensor::empty({64}, DType::kInt64);
  for (int64_t i = 0; i < 64; ++i) ids.data<int64_t>()[i] = i / 10;
  namespace mods = sdpa::flex::mods;
  const Program soft_cap = Program::from_score_mod(mods::soft_cap(30.0));
  const Program alibi = Program::from_score_mod(mods::alibi(slopes));
  const Program relative = Program::from_score_mod(mods::relative_position(table, 16));
  const Program causal = Program::from_mask_mod(mods::causal());
  const Program window = Program::from_mask_mod(mods::sliding_window(7));
  const Program prefix = Program::from_mask_mod(mods::prefix_lm(5));
  const Program documents = Program::from_mask_mod(mods::document(ids));
  expect_compiles("none", nullptr, nullptr);
  expect_compiles("soft_cap + causal", &soft_cap, &causal);
  expect_compiles("alibi + sliding window", &alibi, &window);
  expect_compiles("relative position (a gather) + prefix-LM", &relative, &prefix);
  expect_compiles("documents", nullptr, &documents);
}

TEST_F(FlexCodegen, RandomProgramsCompile) {
  SKIP_WITHOUT_NVRTC();
  // Many programs in one unit keeps NVRTC's per-call cost down; each function gets its
  // own name.
  std::string unit = sdpa::cuda::flex_prelude();
  int count = 0;
  for (uint64_t seed = 1; seed <= 120; ++seed) {
    flex_test::ProgramGen gen(seed, {2, 3, 17, 19}, true);
    const Program score = gen.score_mod(4);
    const Program mask = gen.mask_mod(4);
    const Program ints = gen.int_score_mod(3);
    for (const Program* p : {&score, &mask, &ints}) {
      unit += sdpa::cuda::emit_device_function(*p->compiled(), p->compiled()->result, p->captured(),
                                               "sdpa_random_" + std::to_string(count++));
    }
  }
  unit += "extern \"C\" __global__ void sdpa_random_probe(float* out, const SdpaCapturedTensor* c,\n"
          "    SdpaFlexStatus* status) {\n  float acc = 0.0f;\n";
  for (int i = 0; i < count; ++i) {
    unit += "  acc += static_cast<float>(sdpa_random_" + std::to_string(i) +
            "(0.25f, 1, 2, threadIdx.x, threadIdx.y, c, status));\n";
  }
  unit += "  out[threadIdx.x] = acc;\n}\n";
  try {
    EXPECT_GT(sdpa::cuda::compile_cubin(unit, 90).cubin.size(), 0u);
  } catch (const sdpa::Error& e) {
    FAIL() << e.what();
  }
}

TEST_F(FlexCodegen, TheGeneratedCodeFollowsTheCpuSemantics) {
  const Program p = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
        return sdpa::flex::where(sdpa::flex::floor_div(q - kv, Expr(3)) % Expr(2) == Expr(0),
                                 sdpa::flex::minimum(s, Expr(0.1)), s / Expr(3.0)) +
               sdpa::flex::to_float(h);
      });
  const std::string f = sdpa::cuda::emit_device_function(*p.compiled(), p.compiled()->result,
                                                         p.captured(), "f");
  // Python's floor division and modulo, min as (a < b ? a : b), exact float literals.
  EXPECT_NE(f.find("sdpa_floor_div(at, "), std::string::npos) << f;
  EXPECT_NE(f.find("sdpa_floor_mod(at, "), std::string::npos) << f;
  EXPECT_NE(f.find(" < "), std::string::npos) << f;
  EXPECT_NE(f.find("0x1.99999ap-4f"), std::string::npos) << f;  // 0.1f
  EXPECT_NE(f.find("__device__ __forceinline__ float f("), std::string::npos) << f;
  // Absent programs are identities.
  const std::string none = sdpa::cuda::flex_translation_unit(nullptr, nullptr, true);
  EXPECT_NE(none.find("return score;"), std::string::npos);
  EXPECT_NE(none.find("return 1.0f;"), std::string::npos);
  EXPECT_NE(none.find("return true;"), std::string::npos);
}

TEST_F(FlexCodegen, CompiledCodeIsCachedInMemoryAndOnDisk) {
  SKIP_WITHOUT_NVRTC();
  const Program soft_cap = Program::from_score_mod(sdpa::flex::mods::soft_cap(11.0));
  const std::string source = with_kernel(sdpa::cuda::flex_translation_unit(&soft_cap, nullptr, true));
  const sdpa::cuda::CompiledModule first = sdpa::cuda::compile_cubin(source, 80);
  EXPECT_FALSE(first.from_cache);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "nvrtc")) {
    files += entry.path().extension() == ".cubin";
  }
  EXPECT_EQ(files, 1);
  const sdpa::cuda::CompiledModule again = sdpa::cuda::compile_cubin(source, 80);
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.cubin, first.cubin);
  EXPECT_NE(sdpa::cuda::runtime_compiler_description().find(dir_.string()), std::string::npos);
}

TEST_F(FlexCodegen, SourceThatDoesNotCompileGivesNvrtcsLog) {
  SKIP_WITHOUT_NVRTC();
  const std::string message =
      error_message([] { sdpa::cuda::compile_cubin("__global__ void k() { undeclared(); }", 80); });
  EXPECT_NE(message.find("nvrtcCompileProgram (sm_80)"), std::string::npos) << message;
  EXPECT_NE(message.find("undeclared"), std::string::npos) << message;
}

}  // namespace
}  // namespace sdpa_test
