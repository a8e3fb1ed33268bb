// The CUDNN backend's lowering of calls with a flex score_mod or BlockMask (cudnn::lower
// with its ScoreModGraph), checked without a GPU on CUDA tensor headers nothing dereferences:
// what is taken, what is refused with which reason, the derived backward program and the
// graph-cache key.

#include <gtest/gtest.h>

#include <string>

#include "cudnn/graph_build.h"
#include "cudnn/graph_key.h"
#include "cudnn/handle.h"
#include "cudnn/score_mod_graph.h"
#include "sdpa/attn_bias.h"
#include "sdpa/flex_mods.h"
#include "training/attention_test_util.h"

namespace sdpa_test {
namespace {

using sdpa::cudnn::GraphSpec;
using sdpa::cudnn::LoweredNode;
using sdpa::cudnn::PointwiseOp;
using sdpa::cudnn::ScoreModGraph;
using sdpa::flex::Expr;
using sdpa::flex::Program;

// bfloat16 q/k/v [2, 4, 37, 64] / [2, 4, 53, 64] headers on cuda:0 (16-byte aligned).
struct FakeCall {
  alignas(16) static inline unsigned char storage[16];
  static Tensor tensor(int64_t rows) {
    const sdpa::Shape shape{2, 4, rows, 64};
    return Tensor::from_blob(storage, shape, sdpa::contiguous_strides(shape), DType::kBFloat16,
                             sdpa::Device{sdpa::DeviceType::kCUDA, 0});
  }
  static sdpa::AttentionParams params(const sdpa::flex::ScoreMod& mod, bool backward = false) {
    const Tensor q = tensor(37), kv = tensor(53);
    sdpa::AttentionParams p = sdpa::make_params(q, kv, kv, {});
    p.mask.score_mod = std::make_shared<const Program>(Program::from_score_mod(mod));
    if (backward) {
      p.backward = true;
      p.out = q;
      p.grad_out = q;
      p.lse = Tensor::from_blob(storage, {2, 4, 37}, sdpa::contiguous_strides({2, 4, 37}),
                                DType::kFloat32, sdpa::Device{sdpa::DeviceType::kCUDA, 0});
    }
    return p;
  }
};

struct Lowered {
  bool ok = false;
  GraphSpec spec;
  std::shared_ptr<const ScoreModGraph> graph;
  std::string why;
};

Lowered lower(const sdpa::AttentionParams& p) {
  Lowered l;
  sdpa::Reasons reasons;
  sdpa::cudnn::ScoreModCall call;
  l.ok = sdpa::cudnn::lower(p, l.spec, reasons, &call);
  l.graph = call.graph;
  for (const std::string& r : reasons.items) l.why += r + "\n";
  return l;
}

bool has_op(const sdpa::cudnn::LoweredScoreMod& l, PointwiseOp op) {
  for (const LoweredNode& n : l.nodes) {
    if (n.live && n.kind == LoweredNode::Kind::kOp && n.op == op) return true;
  }
  return false;
}

TEST(ScoreModGraph, SoftCapLowersForwardAndItsDerivativeForTheBackward) {
  const Lowered f = lower(FakeCall::params(sdpa::flex::mods::soft_cap(30.0)));
  ASSERT_TRUE(f.ok) << f.why;
  ASSERT_NE(f.graph, nullptr);
  EXPECT_EQ(f.spec.has_score_mod, 1);
  EXPECT_TRUE(has_op(f.graph->forward, PointwiseOp::kTanh));
  EXPECT_TRUE(f.graph->derivative.nodes.empty());  // a forward needs no derivative

  const Lowered b = lower(FakeCall::params(sdpa::flex::mods::soft_cap(30.0), true));
  ASSERT_TRUE(b.ok) << b.why;
  // d/ds [c tanh(s / c)] = 1 - tanh(s / c)^2: the derivative recomputes tanh from score.
  const auto& d = b.graph->derivative;
  ASSERT_FALSE(d.nodes.empty());
  EXPECT_TRUE(has_op(d, PointwiseOp::kTanh)) << d.to_string();
  bool reads_score = false;
  for (const LoweredNode& n : d.nodes) reads_score |= n.live && n.kind == LoweredNode::Kind::kScore;
  EXPECT_TRUE(reads_score) << d.to_string();
  EXPECT_NE(b.spec.score_mod_fingerprint, f.spec.score_mod_fingerprint);
}

TEST(ScoreModGraph, TheCacheKeyFollowsTheProgramNotTheTrace) {
  const Lowered a = lower(FakeCall::params(sdpa::flex::mods::soft_cap(30.0)));
  const Lowered again = lower(FakeCall::params(sdpa::flex::mods::soft_cap(30.0)));
  const Lowered other = lower(FakeCall::params(sdpa::flex::mods::soft_cap(50.0)));
  ASSERT_TRUE(a.ok && again.ok && other.ok);
  EXPECT_EQ(a.spec, again.spec);  // re-traced: the same graph
  EXPECT_NE(a.spec.score_mod_fingerprint, other.spec.score_mod_fingerprint);
  EXPECT_FALSE(a.spec == other.spec);
}

TEST(ScoreModGraph, AlibiSlopesBecomeOneInputPerRead) {
  const Tensor slopes = randn({4}, DType::kFloat32, 3);
  const Lowered b = lower(FakeCall::params(sdpa::flex::mods::alibi(slopes)));
  ASSERT_TRUE(b.ok) << b.why;
  ASSERT_EQ(b.graph->inputs.size(), 1u);
  EXPECT_EQ(b.graph->inputs[0].dims, (std::array<int64_t, 4>{1, 4, 1, 1}));
  EXPECT_EQ(b.graph->inputs[0].strides, (std::array<int64_t, 4>{0, 1, 0, 0}));
  int reads = 0;
  for (int index : b.graph->forward_input) reads += index >= 0;
  EXPECT_EQ(reads, 1);
}

// cuDNN 9.19 on an H200 returned grad_v = 0 for these backwards (cudnn_flex_test.cpp).
TEST(ScoreModGraph, BackwardsReadingCapturedTensorsNeedAFinalMaskSelect) {
  const Tensor slopes = randn({4}, DType::kFloat32, 3);
  const Lowered plain = lower(FakeCall::params(sdpa::flex::mods::alibi(slopes), true));
  EXPECT_FALSE(plain.ok);
  EXPECT_NE(plain.why.find("wrong grad_v"), std::string::npos) << plain.why;
  const sdpa::flex::Captured c("slopes", slopes);
  const auto masked = [c](const Expr& s, const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
    return sdpa::flex::where(q >= kv, s - Expr(c[h]) * sdpa::flex::to_float(q - kv), Expr(-INFINITY));
  };
  const Lowered ok = lower(FakeCall::params(masked, true));
  EXPECT_TRUE(ok.ok) << ok.why;
  // No captured tensor: no select needed.
  EXPECT_TRUE(lower(FakeCall::params(sdpa::flex::mods::soft_cap(3.0), true)).ok);
}

TEST(ScoreModGraph, CapturedTensorsThatRequireGradKeepTheBackwardOffCudnn) {
  const sdpa::flex::Captured bias("bias", randn({4}, DType::kFloat32, 5), true);
  const auto mod = [bias](const Expr& s, const Expr&, const Expr& h, const Expr&, const Expr&) {
    return s + Expr(bias[h]);
  };
  EXPECT_TRUE(lower(FakeCall::params(mod)).ok);  // the forward needs no gradient
  const Lowered b = lower(FakeCall::params(mod, true));
  EXPECT_FALSE(b.ok);
  EXPECT_NE(b.why.find("'bias' requires grad"), std::string::npos) << b.why;
}

TEST(ScoreModGraph, OtherMaskPartsBesideAScoreModAreRefused) {
  sdpa::AttentionParams p = FakeCall::params(sdpa::flex::mods::soft_cap(30.0));
  p.mask.bands.push_back(sdpa::DiagonalBand{sdpa::DiagonalAlignment::kTopLeft, std::nullopt, 0});
  const Lowered l = lower(p);
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.why.find("takes a score_mod alone"), std::string::npos) << l.why;
}

TEST(ScoreModGraph, AScoreModIgnoringScoreIsRefused) {
  const auto mod = [](const Expr&, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    return sdpa::flex::to_float(q - kv);
  };
  const Lowered l = lower(FakeCall::params(mod));
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.why.find("does not read score"), std::string::npos) << l.why;
}

TEST(ScoreModGraph, TheDerivativeLowersOnlyWhatItsResultReads) {
  // A derived program also computes the captured tensors' gradients; lowering the
  // d(score) output alone must not build (or be refused for) the rest.
  const Program p = Program::from_score_mod(sdpa::flex::mods::soft_cap(30.0));
  sdpa::cudnn::LoweredScoreMod l;
  sdpa::Reasons reasons;
  const auto& code = *p.compiled();
  ASSERT_TRUE(sdpa::cudnn::lower_instructions(code, 0, p.captured(), {2, 4, 37, 53}, l, reasons));
  int live = 0;
  for (const LoweredNode& n : l.nodes) live += n.live;
  EXPECT_EQ(live, 1);  // instruction 0 reads nothing
  EXPECT_EQ(l.to_string().find("TANH"), std::string::npos) << l.to_string();
}

sdpa::AttentionParams alibi_params(bool is_causal, int64_t q_rows, int64_t kv_rows,
                                   std::vector<float> slopes, bool backward = false) {
  const Tensor q = FakeCall::tensor(q_rows), kv = FakeCall::tensor(kv_rows);
  sdpa::SDPAOptions o;
  o.attn_mask = std::make_shared<sdpa::AlibiBias>(std::move(slopes));
  sdpa::AttentionParams p = sdpa::make_params(q, kv, kv, o);
  // A top-left causal band beside it (as a bias composition lowers to).
  if (is_causal) p.mask.bands.push_back({sdpa::DiagonalAlignment::kTopLeft, std::nullopt, 0});
  if (backward) {
    p.backward = true;
    p.out = q;
    p.grad_out = q;
    p.lse = Tensor::from_blob(FakeCall::storage, {2, 4, q_rows}, sdpa::contiguous_strides({2, 4, q_rows}),
                              DType::kFloat32, sdpa::Device{sdpa::DeviceType::kCUDA, 0});
  }
  return p;
}

TEST(ScoreModGraph, AlibiWithAnyBandsBecomesAScoreMod) {
  const Lowered l = lower(alibi_params(true, 37, 53, {0.5f, 0.25f, 0.125f, 0.0625f}));
  ASSERT_TRUE(l.ok) << l.why;
  EXPECT_EQ(l.spec.has_score_mod, 1);
  EXPECT_EQ(l.spec.has_band, 0);  // the causal band is a select in the score_mod
  EXPECT_TRUE(has_op(l.graph->forward, PointwiseOp::kSelect));
  EXPECT_TRUE(has_op(l.graph->forward, PointwiseOp::kAbs));
  // Other slopes: the same graph (the slopes are bound per call).
  const Lowered other = lower(alibi_params(true, 37, 53, {1.0f, 2.0f, 3.0f, 4.0f}));
  ASSERT_TRUE(other.ok);
  EXPECT_EQ(l.spec, other.spec);
  // The backward of ALiBi alone is not run on cuDNN (its final op is no mask select).
  EXPECT_TRUE(lower(alibi_params(true, 37, 53, {0.5f, 0.25f, 0.125f, 0.0625f}, true)).ok);
  EXPECT_FALSE(lower(alibi_params(false, 37, 53, {0.5f, 0.25f, 0.125f, 0.0625f}, true)).ok);
}

TEST(ScoreModGraph, AlibiBandsThatLeaveRowsWithoutKeysAreRefused) {
  // is_causal is top-left: with L > S every row keeps key 0.
  EXPECT_TRUE(lower(alibi_params(true, 53, 37, {1, 1, 1, 1})).ok);
  // Bottom-right causal with L > S leaves the first L - S rows without keys.
  sdpa::AttentionParams p = alibi_params(false, 53, 37, {1, 1, 1, 1});
  p.mask.bands.push_back({sdpa::DiagonalAlignment::kBottomRight, std::nullopt, 0});
  const Lowered l = lower(p);
  EXPECT_FALSE(l.ok);
  EXPECT_NE(l.why.find("keep no key"), std::string::npos) << l.why;
  // A window of 4 keys left of a top-left diagonal, L = 53 > S + 4: the last rows.
  p = alibi_params(false, 53, 37, {1, 1, 1, 1});
  p.mask.bands.push_back({sdpa::DiagonalAlignment::kTopLeft, 4, 0});
  EXPECT_FALSE(lower(p).ok);
  p.mask.bands.back().left = 16;  // 53 <= 37 + 16: every row keeps a key
  EXPECT_TRUE(lower(p).ok) << lower(p).why;
}

sdpa::AttentionParams bias_params(sdpa::AttnBiasPtr bias, bool backward = false) {
  sdpa::AttentionParams p = alibi_params(false, 37, 53, {1, 1, 1, 1}, backward);
  sdpa::SDPAOptions o;
  o.attn_mask = std::move(bias);
  sdpa::AttentionParams q = sdpa::make_params(p.q, p.k, p.v, o);
  q.backward = p.backward;
  q.out = p.out;
  q.grad_out = p.grad_out;
  q.lse = p.lse;
  return q;
}

TEST(ScoreModGraph, DocumentsAndKeyPaddingBecomeRowIntervals) {
  // Documents with a causal band inside each (a band in the document frame): one [L] pair.
  const Lowered docs = lower(bias_params(std::make_shared<sdpa::BlockDiagonalBias>(
      std::vector<int64_t>{0, 10, 37}, std::vector<int64_t>{0, 20, 53}, true)));
  ASSERT_TRUE(docs.ok) << docs.why;
  ASSERT_EQ(docs.graph->inputs.size(), 2u);
  EXPECT_EQ(docs.graph->inputs[0].dims, (std::array<int64_t, 4>{1, 1, 37, 1}));
  EXPECT_EQ(docs.graph->inputs[0].dtype, DType::kInt32);
  // Key padding (per batch): [B, L].
  const Lowered padded = lower(bias_params(std::make_shared<sdpa::PaddedKeysBias>(
      std::vector<int64_t>{53, 40}, true)));
  ASSERT_TRUE(padded.ok) << padded.why;
  ASSERT_EQ(padded.graph->inputs.size(), 2u);
  EXPECT_EQ(padded.graph->inputs[1].dims, (std::array<int64_t, 4>{2, 1, 37, 1}));
  // A batch without keys leaves its rows empty.
  const Lowered empty = lower(bias_params(std::make_shared<sdpa::PaddedKeysBias>(
      std::vector<int64_t>{53, 0})));
  EXPECT_FALSE(empty.ok);
  EXPECT_NE(empty.why.find("keep no key"), std::string::npos) << empty.why;
}

// The frontend graphs themselves, built from the lowering as the backend builds them and
// taken through the frontend's validation and operation-graph construction (shape and type
// inference of every subgraph node, cuDNN's descriptors), which need cuDNN but no GPU.
// What remains for a GPU is cuDNN's engine support and the numbers (cudnn_flex_test.cpp).
TEST(ScoreModGraph, FrontendGraphsBuildForEveryLoweringRule) {
  if (!sdpa::cudnn::cudnn_load_error().empty()) GTEST_SKIP() << sdpa::cudnn::cudnn_load_error();
  using sdpa::flex::where;
  const Tensor slopes = randn({4}, DType::kFloat32, 3);
  const std::pair<const char*, sdpa::flex::ScoreMod> cases[] = {
      {"soft_cap", sdpa::flex::mods::soft_cap(1.5)},
      {"alibi", sdpa::flex::mods::alibi(slopes)},
      {"causal select", [](const Expr& s, const Expr&, const Expr&, const Expr& q,
                           const Expr& kv) { return where(q >= kv, s, Expr(-INFINITY)); }},
      {"logical and", [](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
         return where((q >= kv) && (q - kv <= Expr(16)), s, Expr(-INFINITY));
       }},
      {"constants first", [](const Expr& s, const Expr&, const Expr& h, const Expr& q,
                             const Expr& kv) {
         return where(Expr(5) < kv, Expr(0.5) * s, s) - Expr(0.02) * sdpa::flex::to_float(q - kv) +
                Expr(1.0) / (Expr(2.0) + sdpa::flex::to_float(h));
       }},
  };
  for (bool backward : {false, true}) {
    const Lowered padded = lower(bias_params(sdpa::compose(
        {std::make_shared<sdpa::PaddedKeysBias>(std::vector<int64_t>{53, 40}, true),
         std::make_shared<sdpa::AlibiBias>(4)}), backward));
    ASSERT_TRUE(padded.ok) << padded.why;
    const auto padded_graph = backward ? sdpa::cudnn::backward_graph(padded.spec, padded.graph, 90)
                                       : sdpa::cudnn::forward_graph(padded.spec, padded.graph, 90);
    ASSERT_TRUE(padded_graph->validate().is_good());
    EXPECT_TRUE(padded_graph->build_operation_graph(nullptr).is_good()) << "padding + ALiBi";
    const Lowered l = lower(alibi_params(true, 37, 53, {0.5f, 0.25f, 0.125f, 0.0625f}, backward));
    ASSERT_TRUE(l.ok) << l.why;
    const auto graph = backward ? sdpa::cudnn::backward_graph(l.spec, l.graph, 90)
                                : sdpa::cudnn::forward_graph(l.spec, l.graph, 90);
    ASSERT_TRUE(graph->validate().is_good());
    auto status = graph->build_operation_graph(nullptr);
    EXPECT_TRUE(status.is_good()) << "native ALiBi: " << status.get_message();
  }
  for (const auto& [name, mod] : cases) {
    for (bool backward : {false, true}) {
      SCOPED_TRACE(std::string(name) + (backward ? " backward" : " forward"));
      if (backward && std::string(name) == "alibi") continue;  // not run on cuDNN, above
      const Lowered l = lower(FakeCall::params(mod, backward));
      ASSERT_TRUE(l.ok) << l.why;
      const auto graph = backward ? sdpa::cudnn::backward_graph(l.spec, l.graph, 90)
                                  : sdpa::cudnn::forward_graph(l.spec, l.graph, 90);
      auto status = graph->validate();
      ASSERT_TRUE(status.is_good()) << status.get_message();
      status = graph->build_operation_graph(nullptr);
      EXPECT_TRUE(status.is_good()) << status.get_message();
    }
  }
}

// A call of FakeCall's sizes with a BlockMask of `mask_mod` (blocks of 16 x 16, broadcast
// over batch and heads) and, when given, a score_mod.
sdpa::AttentionParams block_mask_params(const sdpa::flex::MaskMod& mask_mod,
                                        const sdpa::flex::ScoreMod* score_mod = nullptr,
                                        int64_t q_len = 37) {
  const Tensor q = FakeCall::tensor(q_len), kv = FakeCall::tensor(53);
  sdpa::AttentionParams p = sdpa::make_params(q, kv, kv, {});
  p.mask.block_mask = std::make_shared<const sdpa::flex::BlockMask>(
      sdpa::flex::create_block_mask(Program::from_mask_mod(mask_mod), 1, 1, q_len, 53, 16));
  if (score_mod != nullptr) {
    p.mask.score_mod = std::make_shared<const Program>(Program::from_score_mod(*score_mod));
  }
  return p;
}

TEST(ScoreModGraph, ABlockMaskOfABandBecomesCudnnsBand) {
  const Lowered causal = lower(block_mask_params(sdpa::flex::mods::causal()));
  ASSERT_TRUE(causal.ok) << causal.why;
  EXPECT_TRUE(causal.spec.has_band && !causal.spec.bottom_right && !causal.spec.has_left);
  EXPECT_TRUE(causal.spec.has_right && causal.spec.right == 0);
  EXPECT_FALSE(causal.spec.has_score_mod);
  const Lowered window = lower(block_mask_params(sdpa::flex::mods::sliding_window(9)));
  ASSERT_TRUE(window.ok) << window.why;
  EXPECT_TRUE(window.spec.has_left && window.spec.left == 9 && window.spec.right == 0);
  EXPECT_NE(sdpa::cudnn::describe(window.spec).find("band(top-left, left 9, right 0)"),
            std::string::npos);
  // Every key: no mask at all.
  const Lowered all = lower(block_mask_params(sdpa::flex::noop_mask()));
  ASSERT_TRUE(all.ok) << all.why;
  EXPECT_FALSE(all.spec.has_band);
}

TEST(ScoreModGraph, ABlockMaskBesideAScoreModJoinsItsSubgraph) {
  const sdpa::flex::ScoreMod cap = sdpa::flex::mods::soft_cap(30.0);
  for (bool backward : {false, true}) {
    sdpa::AttentionParams p = block_mask_params(sdpa::flex::mods::sliding_window(5), &cap);
    if (backward) {
      const sdpa::AttentionParams plain = FakeCall::params(cap, true);
      p.backward = true;
      p.out = plain.out;
      p.grad_out = plain.grad_out;
      p.lse = plain.lse;
    }
    const Lowered l = lower(p);
    ASSERT_TRUE(l.ok) << l.why;
    EXPECT_FALSE(l.spec.has_band);
    ASSERT_TRUE(l.spec.has_score_mod);
    // The band's two bounds, then where(band, capped score, -inf).
    EXPECT_TRUE(has_op(l.graph->forward, PointwiseOp::kSelect)) << l.graph->forward.to_string();
    EXPECT_TRUE(has_op(l.graph->forward, PointwiseOp::kTanh)) << l.graph->forward.to_string();
    EXPECT_TRUE(has_op(l.graph->forward, PointwiseOp::kGe)) << l.graph->forward.to_string();
    EXPECT_TRUE(has_op(l.graph->forward, PointwiseOp::kLe)) << l.graph->forward.to_string();
    // The frontend's checks need cuDNN (not a GPU), as in FrontendGraphsBuildForEveryLoweringRule.
    if (!sdpa::cudnn::cudnn_load_error().empty()) continue;
    const auto graph = backward ? sdpa::cudnn::backward_graph(l.spec, l.graph, 90)
                                : sdpa::cudnn::forward_graph(l.spec, l.graph, 90);
    ASSERT_TRUE(graph->validate().is_good());
    EXPECT_TRUE(graph->build_operation_graph(nullptr).is_good());
  }
  // Another band, another program: another graph.
  const Lowered a = lower(block_mask_params(sdpa::flex::mods::sliding_window(5), &cap));
  const Lowered b = lower(block_mask_params(sdpa::flex::mods::sliding_window(6), &cap));
  EXPECT_NE(a.spec.score_mod_fingerprint, b.spec.score_mod_fingerprint);
}

TEST(ScoreModGraph, BlockMasksCudnnCannotRunAreRefusedWithTheReason) {
  Tensor ids = Tensor::empty({53}, DType::kInt64);
  for (int64_t i = 0; i < 53; ++i) ids.data<int64_t>()[i] = i / 10;
  const Lowered documents = lower(block_mask_params(sdpa::flex::mods::document(ids)));
  EXPECT_FALSE(documents.ok);
  EXPECT_NE(documents.why.find("is not one"), std::string::npos) << documents.why;
  // A band right of the diagonal leaves the first rows without keys.
  const auto ahead = [](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    return kv <= q - 2;
  };
  const Lowered empty_rows = lower(block_mask_params(ahead));
  EXPECT_FALSE(empty_rows.ok);
  EXPECT_NE(empty_rows.why.find("without keys"), std::string::npos) << empty_rows.why;
  // A window that ends before the last queries (q_len > kv_len + window).
  const Lowered past = lower(block_mask_params(sdpa::flex::mods::sliding_window(3), nullptr, 60));
  EXPECT_FALSE(past.ok);
  // Lists without a mask_mod.
  sdpa::AttentionParams lists = block_mask_params(sdpa::flex::mods::causal());
  sdpa::flex::BlockMask without = *lists.mask.block_mask;
  without.mask_mod.reset();
  lists.mask.block_mask = std::make_shared<const sdpa::flex::BlockMask>(without);
  const Lowered bare = lower(lists);
  EXPECT_FALSE(bare.ok);
  EXPECT_NE(bare.why.find("only block lists"), std::string::npos) << bare.why;
  // ALiBi beside a BlockMask.
  sdpa::AttentionParams alibi = block_mask_params(sdpa::flex::mods::causal());
  alibi.mask.alibi_slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  EXPECT_FALSE(lower(alibi).ok);
}

// The verdict on a BlockMask is reused within a call (block_mask_band's thread-local last
// answer): asked again, a refused BlockMask still gives its reason, and a new BlockMask,
// even one made where a freed one lived, gets a verdict of its own.
TEST(ScoreModGraph, TheBlockMaskVerdictBelongsToItsBlockMask) {
  sdpa::AttentionParams wrong_lists = block_mask_params(sdpa::flex::mods::causal());
  sdpa::flex::BlockMask windowed = *wrong_lists.mask.block_mask;
  windowed.mask_mod = Program::from_mask_mod(sdpa::flex::mods::sliding_window(5));
  wrong_lists.mask.block_mask = std::make_shared<const sdpa::flex::BlockMask>(windowed);
  for (int ask = 0; ask < 2; ++ask) {
    const Lowered refused = lower(wrong_lists);
    EXPECT_FALSE(refused.ok);
    EXPECT_NE(refused.why.find("do not follow"), std::string::npos) << refused.why;
  }
  for (int round = 0; round < 4; ++round) {
    const bool causal = round % 2 == 0;
    const Lowered l = lower(causal ? block_mask_params(sdpa::flex::mods::causal())
                                   : block_mask_params(sdpa::flex::mods::sliding_window(9)));
    ASSERT_TRUE(l.ok) << l.why;
    EXPECT_EQ(l.spec.has_left, !causal);
    EXPECT_EQ(l.spec.left, causal ? 0 : 9);
  }
  EXPECT_FALSE(lower(wrong_lists).ok);
}

}  // namespace
}  // namespace sdpa_test
