// The lowering of flex score_mods to cuDNN pointwise nodes, checked on the description
// (no GPU needed): which programs lower, to what, and the reasons for the others.

#include <gtest/gtest.h>

#include <string>

#include "cudnn/score_mod_lowering.h"
#include "sdpa/cuda.h"
#include "sdpa/flex_mods.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::cudnn::LoweredNode;
using sdpa::cudnn::LoweredScoreMod;
using sdpa::cudnn::PointwiseOp;
using sdpa::flex::Expr;
using sdpa::flex::Program;

constexpr std::array<int64_t, 4> kSizes{2, 4, 37, 53};  // [B, Hq, L, S]

bool lower(const Program& program, LoweredScoreMod& lowered, std::string* why = nullptr,
           std::array<int64_t, 4> sizes = kSizes) {
  sdpa::Reasons reasons;
  const bool ok = sdpa::cudnn::lower_score_mod(program, sizes, lowered, reasons);
  if (why != nullptr) {
    for (const std::string& r : reasons.items) *why += r + "\n";
  }
  return ok;
}

int count(const LoweredScoreMod& l, PointwiseOp op) {
  int n = 0;
  for (const LoweredNode& node : l.nodes) n += node.kind == LoweredNode::Kind::kOp && node.op == op;
  return n;
}

TEST(ScoreModLowering, SoftCapIsDivTanhMul) {
  LoweredScoreMod l;
  ASSERT_TRUE(lower(Program::from_score_mod(sdpa::flex::mods::soft_cap(30.0)), l));
  EXPECT_EQ(count(l, PointwiseOp::kDiv), 1);
  EXPECT_EQ(count(l, PointwiseOp::kTanh), 1);
  EXPECT_EQ(count(l, PointwiseOp::kMul), 1);
  const LoweredNode& result = l.nodes.at(static_cast<size_t>(l.result));
  EXPECT_EQ(result.kind, LoweredNode::Kind::kOp);
  EXPECT_EQ(result.op, PointwiseOp::kMul);
  EXPECT_EQ(result.type, sdpa::flex::ValueType::kFloat);
  // Every operand comes before its use.
  for (size_t i = 0; i < l.nodes.size(); ++i) {
    for (int32_t a : l.nodes[i].args) EXPECT_LT(a, static_cast<int32_t>(i));
  }
  EXPECT_NE(l.to_string().find("TANH_FWD"), std::string::npos) << l.to_string();
}

TEST(ScoreModLowering, AlibiSlopesBecomeAHeadBroadcastTensor) {
  const Tensor slopes = randn({kSizes[1]}, DType::kFloat32, 7);
  LoweredScoreMod l;
  ASSERT_TRUE(lower(Program::from_score_mod(sdpa::flex::mods::alibi(slopes)), l));
  int tensors = 0, q_index = 0, kv_index = 0;
  for (const LoweredNode& n : l.nodes) {
    if (n.kind == LoweredNode::Kind::kTensor) {
      ++tensors;
      EXPECT_EQ(n.dims, (std::array<int64_t, 4>{1, kSizes[1], 1, 1}));
      EXPECT_EQ(n.strides, (std::array<int64_t, 4>{0, 1, 0, 0}));
    }
    if (n.kind == LoweredNode::Kind::kIndex) {
      q_index += n.axis == 2;
      kv_index += n.axis == 3;
      EXPECT_EQ(n.type, sdpa::flex::ValueType::kInt);
    }
  }
  EXPECT_EQ(tensors, 1);
  EXPECT_EQ(q_index, 1);
  EXPECT_EQ(kv_index, 1);
  EXPECT_EQ(count(l, PointwiseOp::kAbs), 1);
}

TEST(ScoreModLowering, MaskingScoreModUsesCompareAndSelect) {
  const Program p = Program::from_score_mod(
      [](const Expr& score, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return sdpa::flex::where(q >= kv, score, Expr(-INFINITY));
      });
  LoweredScoreMod l;
  ASSERT_TRUE(lower(p, l));
  EXPECT_EQ(count(l, PointwiseOp::kGe), 1);
  ASSERT_EQ(count(l, PointwiseOp::kSelect), 1);
  const LoweredNode& select = l.nodes.at(static_cast<size_t>(l.result));
  ASSERT_EQ(select.args.size(), 3u);
  EXPECT_EQ(l.nodes.at(static_cast<size_t>(select.args[0])).type, sdpa::flex::ValueType::kBool);
}

TEST(ScoreModLowering, GathersAreRefusedWithTheReason) {
  const Tensor table = randn({kSizes[1], 2 * 64 + 1}, DType::kFloat32, 3);
  LoweredScoreMod l;
  std::string why;
  EXPECT_FALSE(lower(Program::from_score_mod(sdpa::flex::mods::relative_position(table, 64)), l,
                     &why));
  EXPECT_NE(why.find("no gather"), std::string::npos) << why;
}

TEST(ScoreModLowering, IntegerFloorDivisionIsRefused) {
  const Program p = Program::from_score_mod(
      [](const Expr& score, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return score + sdpa::flex::to_float(sdpa::flex::floor_div(q - kv, Expr(int64_t{3})));
      });
  LoweredScoreMod l;
  std::string why;
  EXPECT_FALSE(lower(p, l, &why));
  EXPECT_NE(why.find("floor"), std::string::npos) << why;
}

TEST(ScoreModLowering, TooSmallCapturedTensorsAndHugeSizesAreRefused) {
  LoweredScoreMod l;
  std::string why;
  const Tensor few = randn({kSizes[1] - 1}, DType::kFloat32, 1);
  EXPECT_FALSE(lower(Program::from_score_mod(sdpa::flex::mods::alibi(few)), l, &why));
  EXPECT_NE(why.find("fewer than the call's 4"), std::string::npos) << why;
  why.clear();
  EXPECT_FALSE(lower(Program::from_score_mod(sdpa::flex::mods::soft_cap(5.0)), l, &why,
                     {1, 1, int64_t{1} << 32, 8}));
  EXPECT_NE(why.find("int32"), std::string::npos) << why;
}

}  // namespace
}  // namespace sdpa_test
