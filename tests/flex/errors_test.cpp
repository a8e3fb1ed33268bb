// Errors: out-of-range captured reads name the tensor and the index (forward on FLASH and
// MATH, backward, create_block_mask); type errors while tracing; backward of a score_mod
// that ignores score or reaches it only through comparisons; BlockMasks of other sizes;
// invalid create_block_mask arguments; integer division by zero inside kernels.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flex_test_util.h"
#include "sdpa/flex_mods.h"

namespace flex_test {
namespace {

using sdpa::SDPAOptions;
using sdpa::SDPBackend;
using sdpa::flex::BlockMask;
using sdpa::flex::Captured;
using sdpa::flex::Expr;
using sdpa::flex::MaskMod;
using sdpa::flex::Program;
using sdpa::flex::ScoreMod;
namespace mods = sdpa::flex::mods;

const std::vector<SDPBackend> kBackends = {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION};

struct Inputs {
  Tensor q, k, v, dout;
};
Inputs inputs(int64_t B, int64_t H, int64_t L, int64_t S, int64_t E = 8) {
  return {randn({B, H, L, E}, DType::kFloat32, 1), randn({B, H, S, E}, DType::kFloat32, 2),
          randn({B, H, S, E}, DType::kFloat32, 3), randn({B, H, L, E}, DType::kFloat32, 4)};
}

TEST(FlexErrors, OutOfRangeReadInScoreModNamesTensorAndIndex) {
  // L = 6 against a table of 5: only q_idx = 5 reads out of range, so the reported index
  // does not depend on which thread fails first.
  const Inputs in = inputs(1, 2, 6, 4);
  const Captured table("bias_table", randn({5}, DType::kFloat32, 9));
  const Program sm = Program::from_score_mod(
      [&](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr&) { return s + table[q]; });
  // Negative: only kv_idx = 0 reads index -1 of dimension 1.
  const Captured table2("rel_table", randn({2, 4}, DType::kFloat32, 10));
  const Program sm2 = Program::from_score_mod(
      [&](const Expr& s, const Expr&, const Expr& h, const Expr&, const Expr& kv) {
        return s + table2[h][kv - Expr(1)];
      });
  for (SDPBackend backend : kBackends) {
    SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
    sdpa::sdpa_kernel guard(backend);
    EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(in.q, in.k, in.v, sm); },
                                        {"bias_table", "index 5", "dimension 0", "size 5", "q_idx=5"}));
    EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(in.q, in.k, in.v, sm2); },
                                        {"rel_table", "index -1", "dimension 1", "kv_idx=0"}));
    // The backward evaluates the program (and its derivative) again: same report, given a
    // valid out / lse from a plain call.
    const auto plain = sdpa::flex_attention(in.q, in.k, in.v);
    EXPECT_TRUE(throws_error_containing(
        [&] { sdpa::flex_attention_backward(in.dout, in.q, in.k, in.v, plain.out, plain.lse, sm); },
        {"bias_table", "index 5", "q_idx=5"}));
  }
  // The oracle reports the same.
  EXPECT_TRUE(throws_error_containing([&] { sm.evaluate(0.0, 0, 0, 5, 0); }, {"bias_table", "index 5"}));
  EXPECT_NO_THROW(sm.evaluate(0.0, 0, 0, 4, 0));
}

TEST(FlexErrors, OutOfRangeReadInMaskModRaisesInCreateBlockMask) {
  // Document ids for 10 positions, used at L = S = 11: q_idx = 10 or kv_idx = 10 reads
  // index 10.
  std::vector<int64_t> ids(10, 0);
  for (int i = 5; i < 10; ++i) ids[i] = 1;
  const MaskMod doc = mods::document(int_tensor(ids));
  const Inputs in = inputs(1, 1, 11, 11);
  for (int64_t block : {1, 4, 16, 128}) {
    SCOPED_TRACE("block " + std::to_string(block));
    EXPECT_TRUE(throws_error_containing(
        [&] { sdpa::flex::create_block_mask(doc, 1, 1, 11, 11, block); },
        {"document_id", "index 10", "size 10"}));
    // Should a BlockMask come back anyway, the kernels must still report the read.
    std::optional<BlockMask> bm;
    try {
      bm = sdpa::flex::create_block_mask(doc, 1, 1, 11, 11, block);
    } catch (const sdpa::Error&) {
      continue;
    }
    for (SDPBackend backend : kBackends) {
      SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
      sdpa::sdpa_kernel guard(backend);
      EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(in.q, in.k, in.v, std::nullopt, &*bm); },
                                          {"document_id", "index 10"}));
    }
  }
  EXPECT_NO_THROW(sdpa::flex::create_block_mask(doc, 1, 1, 10, 10, 4));
}

TEST(FlexErrors, TypeErrorsWhileTracing) {
  const Captured table("t", randn({2, 3}, DType::kFloat32, 1));
  const Captured ints("ints", int_tensor({1, 2, 3}));
  const Expr q = Expr(int64_t{3}), kv = Expr(int64_t{2}), f = Expr(0.5), yes = Expr(true);
  // mask_mod returning a float / an int; score_mod returning a bool.
  EXPECT_TRUE(throws_error_containing(
      [] {
        Program::from_mask_mod([](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
          return sdpa::flex::to_float(q - kv) * 0.5;
        });
      },
      {"mask_mod", "bool"}));
  EXPECT_TRUE(throws_error_containing(
      [] {
        Program::from_mask_mod([](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return q - kv; });
      },
      {"mask_mod", "bool"}));
  EXPECT_TRUE(throws_error_containing(
      [] {
        Program::from_score_mod([](const Expr& s, const Expr&, const Expr&, const Expr&, const Expr&) {
          return s > 0.0;
        });
      },
      {"score_mod"}));
  // Bool arithmetic and other operand-type errors.
  const std::vector<std::pair<std::string, std::function<void()>>> bad = {
      {"bool + int", [&] { (void)((q > kv) + Expr(1)); }},
      {"bool * float", [&] { (void)(yes * f); }},
      {"-bool", [&] { (void)(-yes); }},
      {"abs(bool)", [&] { (void)sdpa::flex::abs(yes); }},
      {"exp(bool)", [&] { (void)sdpa::flex::exp(yes); }},
      {"minimum(bool, int)", [&] { (void)sdpa::flex::minimum(yes, q); }},
      {"bool < int", [&] { (void)((q > kv) < Expr(1)); }},
      {"float % int", [&] { (void)(f % Expr(2)); }},
      {"floor_div(float, int)", [&] { (void)sdpa::flex::floor_div(f, Expr(2)); }},
      {"int & bool", [&] { (void)(q & yes); }},
      {"float | int", [&] { (void)(f | q); }},
      {"float ^ float", [&] { (void)(f ^ f); }},
      {"int << float", [&] { (void)(q << f); }},
      {"~float", [&] { (void)(~f); }},
      {"floor(bool)", [&] { (void)sdpa::flex::floor(yes); }},
      {"sin(bool)", [&] { (void)sdpa::flex::sin(yes); }},
      {"!int", [&] { (void)(!q); }},
      {"where(int, ...)", [&] { (void)sdpa::flex::where(q, f, f); }},
      {"where(bool, bool, float)", [&] { (void)sdpa::flex::where(yes, yes, f); }},
      {"read indexed by float", [&] { (void)static_cast<Expr>(table[f][q]); }},
      {"read with too few indices", [&] { (void)static_cast<Expr>(table[q]); }},
      {"read with too many indices", [&] { (void)static_cast<Expr>(ints[q][kv]); }},
      {"int tensor requires grad", [] { Captured("ids", int_tensor({1, 2}), true); }},
      {"undefined tensor", [] { Captured("none", Tensor()); }},
  };
  for (const auto& [name, fn] : bad) {
    EXPECT_THROW(fn(), sdpa::Error) << name;
  }
  // Tensor-read errors name the tensor.
  EXPECT_TRUE(throws_error_containing([&] { (void)static_cast<Expr>(table[q]); }, {"'t'"}));
  // Valid neighbours of the above do not throw.
  EXPECT_NO_THROW((void)((q > kv) == yes));
  EXPECT_NO_THROW((void)(q / kv));  // true division: float
  EXPECT_NO_THROW((void)static_cast<Expr>(table[q % Expr(2)][kv]));
}

TEST(FlexErrors, ProgramsOfTheWrongKindAreRejected) {
  const Inputs in = inputs(1, 1, 8, 8);
  const Program mask = Program::from_mask_mod(mods::causal());
  const Program score = Program::from_score_mod(mods::soft_cap(5.0));
  EXPECT_TRUE(mask.is_mask());
  EXPECT_FALSE(score.is_mask());
  EXPECT_THROW(sdpa::flex_attention(in.q, in.k, in.v, mask), sdpa::Error);
  EXPECT_THROW(sdpa::flex::create_block_mask(score, 1, 1, 8, 8), sdpa::Error);
}

TEST(FlexErrors, BackwardOfNonDifferentiableScoreModRaises) {
  const Inputs in = inputs(1, 2, 9, 9);
  // Ignores score: a pure positional bias (forward is fine).
  const Program ignores = Program::from_score_mod(
      [](const Expr&, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return sdpa::flex::to_float(q - kv) * 0.1;
      });
  // Reaches score only through comparisons.
  const Program compares = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return sdpa::flex::where(s > 0.0, Expr(1.0), sdpa::flex::to_float(q - kv));
      });
  EXPECT_FALSE(ignores.uses_score());
  EXPECT_TRUE(compares.uses_score());
  for (SDPBackend backend : kBackends) {
    SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
    sdpa::sdpa_kernel guard(backend);
    const auto r1 = sdpa::flex_attention(in.q, in.k, in.v, ignores);
    EXPECT_TRUE(throws_error_containing(
        [&] { sdpa::flex_attention_backward(in.dout, in.q, in.k, in.v, r1.out, r1.lse, ignores); },
        {"ignores score"}));
    const auto r2 = sdpa::flex_attention(in.q, in.k, in.v, compares);
    EXPECT_TRUE(throws_error_containing(
        [&] { sdpa::flex_attention_backward(in.dout, in.q, in.k, in.v, r2.out, r2.lse, compares); },
        {"not differentiable", "comparisons"}));
  }
}

TEST(FlexErrors, BlockMaskOfOtherSizesRaises) {
  const int64_t B = 2, H = 2, L = 20, S = 24;
  const Inputs in = inputs(B, H, L, S);
  const MaskMod uses_b_and_h = [](const Expr& b, const Expr& h, const Expr& q, const Expr& kv) {
    return (q + b + h) >= kv;
  };
  const std::vector<std::pair<std::string, BlockMask>> wrong = {
      {"Q_LEN", sdpa::flex::create_block_mask(mods::causal(), 1, 1, L + 1, S, 16)},
      {"KV_LEN", sdpa::flex::create_block_mask(mods::causal(), 1, 1, L, S - 1, 16)},
      {"swapped lengths", sdpa::flex::create_block_mask(mods::causal(), 1, 1, S, L, 16)},
      {"batch", sdpa::flex::create_block_mask(uses_b_and_h, 3, H, L, S, 16)},
      {"heads", sdpa::flex::create_block_mask(uses_b_and_h, B, 3, L, S, 16)},
  };
  const auto ok = sdpa::flex_attention(in.q, in.k, in.v);
  for (const auto& [name, wrong_mask] : wrong) {
    SCOPED_TRACE(name);
    const BlockMask& bm = wrong_mask;  // lambdas below capture it (clang < 16: no bindings)
    for (SDPBackend backend : kBackends) {
      SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
      sdpa::sdpa_kernel guard(backend);
      EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(in.q, in.k, in.v, std::nullopt, &bm); },
                                          {"block_mask"}));
      EXPECT_TRUE(throws_error_containing(
          [&] { sdpa::flex_attention_backward(in.dout, in.q, in.k, in.v, ok.out, ok.lse, std::nullopt, &bm); },
          {"block_mask"}));
    }
  }
  // Matching sizes, and B = H = 1 broadcast, are accepted.
  const BlockMask right = sdpa::flex::create_block_mask(uses_b_and_h, B, H, L, S, 16);
  const BlockMask broadcast = sdpa::flex::create_block_mask(mods::causal(), 1, 1, L, S, 16);
  EXPECT_NO_THROW(sdpa::flex_attention(in.q, in.k, in.v, std::nullopt, &right));
  EXPECT_NO_THROW(sdpa::flex_attention(in.q, in.k, in.v, std::nullopt, &broadcast));
}

TEST(FlexErrors, CreateBlockMaskRejectsInvalidArguments) {
  const MaskMod m = mods::causal();
  EXPECT_THROW(sdpa::flex::create_block_mask(m, 0, 1, 8, 8), sdpa::Error);
  EXPECT_THROW(sdpa::flex::create_block_mask(m, 1, 0, 8, 8), sdpa::Error);
  EXPECT_THROW(sdpa::flex::create_block_mask(m, 1, 1, -1, 8), sdpa::Error);
  EXPECT_THROW(sdpa::flex::create_block_mask(m, 1, 1, 8, -1), sdpa::Error);
  EXPECT_THROW(sdpa::flex::create_block_mask(m, 1, 1, 8, 8, 0), sdpa::Error);
  EXPECT_THROW(sdpa::flex::create_block_mask(m, 1, 1, 8, 8, -16), sdpa::Error);
  EXPECT_TRUE(throws_error_containing([&] { sdpa::flex::create_block_mask(m, 1, 1, -3, 8); },
                                      {"Q_LEN", "-3"}));
  EXPECT_TRUE(throws_error_containing([&] { sdpa::flex::create_block_mask(m, 1, 1, 8, 8, 0); },
                                      {"BLOCK_SIZE", "0"}));
  // Zero lengths are a defined, empty result (PyTorch accepts them too).
  const BlockMask empty_q = sdpa::flex::create_block_mask(m, 1, 1, 0, 8);
  EXPECT_EQ(empty_q.num_q_blocks(), 0);
  EXPECT_EQ(empty_q.num_kv_blocks(), 1);
  // Several kv blocks and no q block: the q-side lists are rows of count 0.
  const BlockMask no_rows = sdpa::flex::create_block_mask(m, 1, 1, 0, 300);
  ASSERT_EQ(no_rows.num_kv_blocks(), 3);
  for (int64_t kb = 0; kb < 3; ++kb) {
    EXPECT_EQ(no_rows.q_num_blocks.item({0, 0, kb}), 0.0);
    EXPECT_EQ(no_rows.full_q_num_blocks.item({0, 0, kb}), 0.0);
  }
  const BlockMask empty_kv = sdpa::flex::create_block_mask(m, 2, 1, 8, 0);
  EXPECT_EQ(empty_kv.num_kv_blocks(), 0);
  EXPECT_EQ(empty_kv.kv_num_blocks.item({0, 0, 0}), 0.0);
  EXPECT_THROW(mods::sliding_window(-1), sdpa::Error);
  EXPECT_THROW(mods::prefix_lm(-1), sdpa::Error);
  EXPECT_THROW(mods::soft_cap(0.0), sdpa::Error);
  EXPECT_THROW(mods::document(randn({4}, DType::kFloat32, 1)), sdpa::Error);
  EXPECT_THROW(mods::relative_position(randn({2, 5}, DType::kFloat32, 1), 3), sdpa::Error);
}

// An integer division by zero inside a kernel surfaces as sdpa::Error (not a crash out of
// an OpenMP region), on every backend and in create_block_mask.
TEST(FlexErrors, IntegerDivisionByZeroRaises) {
  const Inputs in = inputs(1, 2, 8, 8);
  const Program div = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return s + sdpa::flex::to_float(sdpa::flex::floor_div(q, kv));
      });
  const Program mod = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return s + sdpa::flex::to_float(q % kv);
      });
  for (SDPBackend backend : kBackends) {
    SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
    sdpa::sdpa_kernel guard(backend);
    EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(in.q, in.k, in.v, div); }, {"division by zero"}));
    EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(in.q, in.k, in.v, mod); }, {"division by zero"}));
  }
  const MaskMod mask = [](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    return q % kv == Expr(0);
  };
  EXPECT_TRUE(throws_error_containing([&] { sdpa::flex::create_block_mask(mask, 1, 1, 8, 8, 4); },
                                      {"division by zero"}));
}

// A captured tensor on a GPU is read there by the GPU backends only: CPU work that would
// read it (a CPU call, create_block_mask, evaluate) names it instead of touching device
// memory (the header below is never dereferenced).
TEST(FlexErrors, CapturedDeviceTensorsAreRefusedWhereTheCpuWouldReadThem) {
  alignas(16) static float storage[4];
  const Tensor on_gpu = Tensor::from_blob(storage, {4}, {1}, DType::kFloat32,
                                          sdpa::Device{sdpa::DeviceType::kCUDA, 0});
  const Program alibi = Program::from_score_mod(mods::alibi(on_gpu));
  const Inputs in = inputs(1, 4, 8, 8);
  EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(in.q, in.k, in.v, alibi); },
                                      {"'alibi_slopes' is on cuda:0", "reads captured tensors on cpu"}));
  EXPECT_TRUE(throws_error_containing([&] { alibi.evaluate(0.5, 0, 0, 1, 1); },
                                      {"'alibi_slopes' is on cuda:0", "Program::evaluate"}));
  const Captured ids("ids", Tensor::from_blob(storage, {4}, {1}, DType::kInt32,
                                              sdpa::Device{sdpa::DeviceType::kCUDA, 0}));
  const Program same_id = Program::from_mask_mod(
      [&](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return ids[q] == ids[kv]; });
  EXPECT_TRUE(throws_error_containing([&] { sdpa::flex::create_block_mask(same_id, 1, 1, 4, 4); },
                                      {"'ids' is on cuda:0", "create_block_mask"}));
}

}  // namespace
}  // namespace flex_test
