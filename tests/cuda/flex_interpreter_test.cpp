// The CUDA kernels' flex interpreter (cuda/flex_interpreter.cuh), run on the host: random
// programs and the standard mods flattened (cuda/flex_device_program.h) give what the
// CPU's float64 evaluator gives at every index, and failures are recorded as the CPU
// raises them.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/flex_device_program.h"
#include "flex/autodiff.h"
#include "flex/eval_scalar.h"
#include "flex/node.h"
#include "flex/program_gen.h"
#include "sdpa/flex_mods.h"

namespace sdpa_test {
namespace {

namespace fi = sdpa::cuda::flex_interp;
using flex_test::DType;
using flex_test::randn;
using flex_test::Tensor;
using sdpa::flex::Expr;
using sdpa::flex::Program;

// The program as the interpreter runs it, reading host memory.
struct HostProgram {
  explicit HostProgram(const Program& p)
      : flat(sdpa::cuda::flatten(*p.compiled(), p.compiled()->result)) {
    for (const sdpa::flex::Captured& c : p.captured()) {
      captured.push_back(sdpa::cuda::describe_captured(c.tensor()));
    }
    view = {flat.code.data(), flat.args.data(), captured.data(), static_cast<int>(flat.code.size()),
            flat.result};
  }
  double run(double score, int64_t b, int64_t h, int64_t q, int64_t kv, fi::Status& status) {
    double values[fi::kMaxInstructions];
    return fi::evaluate(view, score, fi::Site{b, h, q, kv, &status}, values);
  }
  sdpa::cuda::FlatProgram flat;
  std::vector<fi::CapturedTensor> captured;
  fi::Program view{};
};

// Equal as the CPU evaluator's doubles are, NaN included.
bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

void expect_matches_cpu(const Program& p, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(sdpa::cuda::interpreter_unsupported(p), "");
  HostProgram interpreted(p);
  sdpa::flex::ScalarEvaluator cpu(*p.compiled(), p.captured());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t q = 0; q < 17; q += 3) {
        for (int64_t kv = 0; kv < 19; kv += 2) {
          const double score = 0.37 * static_cast<double>(q) - 0.21 * static_cast<double>(kv) - 0.4;
          fi::Status status{};
          const double got = interpreted.run(score, b, h, q, kv, status);
          EXPECT_EQ(status.code, 0);
          const double want = cpu.run(score, b, h, q, kv);
          ASSERT_TRUE(same(got, want)) << "b " << b << " h " << h << " q " << q << " kv " << kv
                                       << ": " << got << " vs " << want << "\n"
                                       << p.to_string();
        }
      }
    }
  }
}

TEST(FlexInterpreter, RandomProgramsMatchTheCpuEvaluator) {
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    flex_test::ProgramGen gen(seed, {2, 3, 17, 19}, true);
    expect_matches_cpu(gen.score_mod(4), "score_mod");
    expect_matches_cpu(gen.mask_mod(4), "mask_mod");
    expect_matches_cpu(gen.int_score_mod(3), "int score_mod");
  }
}

TEST(FlexInterpreter, StandardModsOfEveryCapturedDtypeMatchTheCpuEvaluator) {
  namespace mods = sdpa::flex::mods;
  Tensor ids = Tensor::empty({32}, DType::kInt32);
  for (int64_t i = 0; i < 32; ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(i / 5);
  expect_matches_cpu(Program::from_score_mod(mods::soft_cap(1.5)), "soft_cap");
  expect_matches_cpu(Program::from_score_mod(mods::alibi(randn({3}, DType::kFloat16, 3))),
                     "alibi, float16 slopes");
  expect_matches_cpu(
      Program::from_score_mod(mods::relative_position(randn({3, 41}, DType::kBFloat16, 4), 20)),
      "relative position, bfloat16 table");
  expect_matches_cpu(Program::from_mask_mod(mods::document(ids)), "documents, int32 ids");
  expect_matches_cpu(Program::from_mask_mod(mods::sliding_window(4)), "window");
  // A strided (transposed) float64 table.
  const Tensor table = randn({20, 3}, DType::kFloat64, 5).transpose(0, 1);
  const sdpa::flex::Captured t("t", table);
  expect_matches_cpu(Program::from_score_mod([t](const Expr& s, const Expr&, const Expr& h,
                                                 const Expr& q, const Expr&) {
                       return s * Expr(t(std::vector<Expr>{h, q}));
                     }),
                     "strided float64 table");
}

TEST(FlexInterpreter, FailuresAreRecordedWhereTheCpuRaises) {
  const sdpa::flex::Captured small("small", randn({4}, DType::kFloat32, 6));
  const Program read =
      Program::from_score_mod([small](const Expr& s, const Expr&, const Expr&, const Expr&,
                                      const Expr& kv) { return s + Expr(small[kv]); });
  HostProgram interpreted(read);
  fi::Status status{};
  EXPECT_EQ(interpreted.run(1.0, 0, 1, 2, 3, status), 1.0 + read.evaluate(0.0, 0, 1, 2, 3));
  EXPECT_EQ(status.code, 0);
  interpreted.run(1.0, 0, 1, 2, 9, status);
  EXPECT_EQ(status.code, 1);
  EXPECT_EQ(status.slot, 0);
  EXPECT_EQ(status.dim, 0);
  EXPECT_EQ(status.index, 9);
  EXPECT_EQ(status.kv_idx, 9);
  // The first failure stays.
  interpreted.run(1.0, 0, 1, 2, 12, status);
  EXPECT_EQ(status.index, 9);

  const Program divide = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return s + sdpa::flex::to_float(sdpa::flex::floor_div(q, kv - Expr(2)));
      });
  HostProgram by_zero(divide);
  fi::Status zero{};
  by_zero.run(0.5, 1, 0, 7, 2, zero);
  EXPECT_EQ(zero.code, 2);
  EXPECT_EQ(zero.q_idx, 7);
}

TEST(FlexInterpreter, ProgramsThatCannotFailAreRecognised) {
  namespace mods = sdpa::flex::mods;
  using sdpa::cuda::program_may_fail;
  // No read, no integer division: nothing to check after a launch.
  EXPECT_FALSE(program_may_fail(Program::from_score_mod(mods::soft_cap(2.0)), 2, 8, 100, 300));
  // slopes[h]: in bounds for 8 heads, not for 9.
  const Program alibi = Program::from_score_mod(mods::alibi(randn({8}, DType::kFloat32, 7)));
  EXPECT_FALSE(program_may_fail(alibi, 2, 8, 100, 300));
  EXPECT_TRUE(program_may_fail(alibi, 2, 9, 100, 300));
  // A relative-position table covers |q_idx - kv_idx| <= 20 only.
  const Program relative =
      Program::from_score_mod(mods::relative_position(randn({2, 41}, DType::kFloat32, 8), 20));
  EXPECT_FALSE(program_may_fail(relative, 1, 2, 21, 21));
  EXPECT_TRUE(program_may_fail(relative, 1, 2, 21, 22));
  // Integer division by a nonzero constant cannot fail; by a computed value it may.
  const auto divided_by = [](Expr divisor) {
    return Program::from_score_mod(
        [divisor](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr&) {
          return s + sdpa::flex::to_float(sdpa::flex::floor_div(q, divisor) % Expr(3));
        });
  };
  EXPECT_FALSE(program_may_fail(divided_by(Expr(5)), 1, 1, 50, 50));
  EXPECT_TRUE(program_may_fail(Program::from_score_mod([](const Expr& s, const Expr&, const Expr&,
                                                          const Expr& q, const Expr& kv) {
                                 return s + sdpa::flex::to_float(
                                                sdpa::flex::floor_div(q, kv + Expr(1)));
                               }),
                               1, 1, 50, 50));
  // A gather through a captured index table: the indices' values bound the second read.
  Tensor ids = Tensor::empty({30}, DType::kInt64);
  for (int64_t i = 0; i < 30; ++i) ids.data<int64_t>()[i] = i % 4;
  const sdpa::flex::Captured id("ids", ids), bias("bias", randn({4}, DType::kFloat32, 9));
  const Program gather =
      Program::from_score_mod([id, bias](const Expr& s, const Expr&, const Expr&, const Expr&,
                                         const Expr& kv) { return s + Expr(bias[Expr(id[kv])]); });
  EXPECT_FALSE(program_may_fail(gather, 1, 1, 10, 30));
  EXPECT_TRUE(program_may_fail(gather, 1, 1, 10, 31));
  // The derivative of a program is checked as a program of its own (derived programs
  // carry no uses_batch / uses_head flags: the check reads the instructions).
  const Program alibi9 = Program::from_score_mod(mods::alibi(randn({9}, DType::kFloat32, 10)));
  const sdpa::flex::GradientProgram d = sdpa::flex::differentiate(alibi9);
  EXPECT_FALSE(program_may_fail(d.in_slots_of(alibi9.captured()), alibi9.captured(), 1, 9, 5, 5));
  EXPECT_TRUE(program_may_fail(*alibi9.compiled(), alibi9.captured(), 1, 10, 5, 5));
}

TEST(FlexInterpreter, LongProgramsAreRefusedWithTheReason) {
  const Program long_program = Program::from_score_mod(
      [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr&) {
        Expr x = s;
        for (int i = 0; i < 200; ++i) x = x * Expr(1.0001) + sdpa::flex::to_float(q);
        return x;
      });
  EXPECT_NE(sdpa::cuda::interpreter_unsupported(long_program).find("interprets up to 128"),
            std::string::npos);
}

}  // namespace
}  // namespace sdpa_test
