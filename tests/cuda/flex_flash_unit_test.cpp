// CUDA FLASH's forward kernel with flex programs as NVRTC units (cuda/flash/flex_unit.h).
// NVRTC compiles without a GPU: the units of the standard mods are compiled here for
// sm_80 and sm_90 and must export the entry point; running them is for a GPU.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/flash/flex_unit.h"
#include "cuda/nvrtc.h"
#include "sdpa/flex_mods.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::cuda::flash::flex_forward_unit;
using sdpa::flex::Program;

class FlexFlashUnit : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!sdpa::cuda::nvrtc_load_error().empty()) GTEST_SKIP() << sdpa::cuda::nvrtc_load_error();
    include_dir_ = sdpa::cuda::cuda_include_dir();
    if (include_dir_.empty()) GTEST_SKIP() << "no CUDA headers (cuda_bf16.h) found";
    // A cache of this test's own, so compilation really happens.
    dir_ = std::filesystem::temp_directory_path() /
           ("sdpa_flex_unit_test_" + std::to_string(::getpid()));
    setenv("SDPA_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("SDPA_CACHE_DIR");
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  void expect_compiles(const std::string& what, const Program* score_mod, const Program* mask_mod,
                       DType dtype, int tile, int arch) {
    SCOPED_TRACE(what + ", " + std::string(sdpa::dtype_name(dtype)) + ", tile " +
                 std::to_string(tile) + ", sm_" + std::to_string(arch));
    const std::string unit = flex_forward_unit(score_mod, mask_mod, dtype, tile);
    try {
      const sdpa::cuda::CompiledModule m =
          sdpa::cuda::compile_cubin(unit, arch, {"-I" + include_dir_});
      EXPECT_EQ(m.cubin.substr(0, 4), std::string("\177ELF"));
      // The entry point keeps its unmangled name for cudaLibraryGetKernel.
      EXPECT_NE(m.cubin.find(sdpa::cuda::flash::kFlexForwardEntry), std::string::npos);
    } catch (const sdpa::Error& e) {
      ADD_FAILURE() << e.what();
    }
  }

  std::string include_dir_;
  std::filesystem::path dir_;
};

TEST_F(FlexFlashUnit, EveryTileAndDtypeCompilesWithASoftCapAndACausalMask) {
  const Program soft_cap = Program::from_score_mod(sdpa::flex::mods::soft_cap(30.0));
  const Program causal = Program::from_mask_mod(sdpa::flex::mods::causal());
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (int tile : {32, 64, 128, 256}) {
      expect_compiles("soft_cap + causal", &soft_cap, &causal, dtype, tile, 80);
    }
  }
  expect_compiles("soft_cap + causal", &soft_cap, &causal, DType::kBFloat16, 128, 90);
}

TEST_F(FlexFlashUnit, CapturedTensorsAndAbsentProgramsCompile) {
  const Tensor slopes = randn({8}, DType::kFloat32, 1);
  const Tensor table = randn({8, 33}, DType::kBFloat16, 2);
  Tensor ids = Tensor::empty({64}, DType::kInt64);
  for (int64_t i = 0; i < 64; ++i) ids.data<int64_t>()[i] = i / 10;
  namespace mods = sdpa::flex::mods;
  const Program alibi = Program::from_score_mod(mods::alibi(slopes));
  const Program relative = Program::from_score_mod(mods::relative_position(table, 16));
  const Program documents = Program::from_mask_mod(mods::document(ids));
  const Program window = Program::from_mask_mod(mods::sliding_window(7));
  expect_compiles("alibi + documents", &alibi, &documents, DType::kBFloat16, 64, 80);
  expect_compiles("relative position + sliding window", &relative, &window, DType::kFloat16, 64,
                  90);
  expect_compiles("mask_mod only", nullptr, &documents, DType::kBFloat16, 128, 80);
  expect_compiles("score_mod only", &alibi, nullptr, DType::kFloat16, 32, 80);
}

TEST_F(FlexFlashUnit, TheUnitInstantiatesTheKernelWithTheProgramsHooks) {
  const Program soft_cap = Program::from_score_mod(sdpa::flex::mods::soft_cap(30.0));
  const std::string unit = flex_forward_unit(&soft_cap, nullptr, DType::kBFloat16, 64);
  EXPECT_NE(unit.find("forward_body<__nv_bfloat16, 64, sdpa::cuda::flash::GeneratedFlex>"),
            std::string::npos);
  EXPECT_NE(unit.find("__launch_bounds__(sdpa::cuda::flash::ForwardTile<64>::kThreads)"),
            std::string::npos);
  // The kernel sources come without their includes of each other.
  EXPECT_EQ(unit.find("#include \"cuda/"), std::string::npos);
  EXPECT_NE(unit.find("struct ForwardArgs"), std::string::npos);
  EXPECT_NE(unit.find("tanhf"), std::string::npos) << "the soft-cap's tanh";
}

TEST_F(FlexFlashUnit, ModulesAreFoundByProgramStructure) {
  using sdpa::cuda::flash::flex_forward_module;
  namespace mods = sdpa::flex::mods;
  const Program soft_cap = Program::from_score_mod(mods::soft_cap(30.0));
  const sdpa::cuda::CompiledModule& first =
      flex_forward_module(&soft_cap, nullptr, DType::kBFloat16, 64, 80);
  EXPECT_FALSE(first.from_cache) << "this test's cache folder starts empty";
  // A program traced again with the same structure finds the same module.
  const Program retraced = Program::from_score_mod(mods::soft_cap(30.0));
  EXPECT_EQ(&flex_forward_module(&retraced, nullptr, DType::kBFloat16, 64, 80), &first);
  // Its text is what compile_cubin keyed the module by.
  EXPECT_EQ(sdpa::cuda::compile_cubin(flex_forward_unit(&retraced, nullptr, DType::kBFloat16, 64),
                                      80, {"-I" + include_dir_})
                .key,
            first.key);
  // Another constant, dtype, tile, architecture or a mask_mod is another unit.
  const Program other_cap = Program::from_score_mod(mods::soft_cap(20.0));
  const Program causal = Program::from_mask_mod(mods::causal());
  for (const sdpa::cuda::CompiledModule* other :
       {&flex_forward_module(&other_cap, nullptr, DType::kBFloat16, 64, 80),
        &flex_forward_module(&soft_cap, nullptr, DType::kFloat16, 64, 80),
        &flex_forward_module(&soft_cap, nullptr, DType::kBFloat16, 32, 80),
        &flex_forward_module(&soft_cap, nullptr, DType::kBFloat16, 64, 90),
        &flex_forward_module(&soft_cap, &causal, DType::kBFloat16, 64, 80)}) {
    EXPECT_NE(other, &first);
    EXPECT_NE(other->key, first.key);
  }
}

TEST(FlexFlashUnitArguments, OtherDtypesAndTilesAreErrorsNamingTheArgument) {
  EXPECT_NE(error_message([] {
              flex_forward_unit(nullptr, nullptr, DType::kFloat32, 64);
            }).find("dtype must be float16 or bfloat16, got float32"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              flex_forward_unit(nullptr, nullptr, DType::kBFloat16, 96);
            }).find("head_dim_tile must be 32, 64, 128 or 256, got 96"),
            std::string::npos);
}

}  // namespace
}  // namespace sdpa_test
