// score_mods that FLASH applies on the fused kernel's registers (score + X, score - X and
// score chains, on key tiles no mask touches: whole tiles, BlockMask interiors): FLASH
// float32 against a float64 reference written here, forward and backward, with chain
// operands that vary with the row, with the key or with neither, bias shapes per key,
// per diagonal and per element, and failed captured reads inside such tiles. S spans
// whole 64-key tiles and a tail, so every call mixes register tiles with masked ones.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "flash_check.h"
#include "sdpa/flex_mods.h"

namespace flex_test {
namespace {

using sdpa::flex::BlockMask;
using sdpa::flex::Captured;
using sdpa::flex::Expr;
using sdpa::flex::ScoreMod;
namespace mods = sdpa::flex::mods;

std::vector<float> ramp(int64_t n, float first, float step) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = first + step * static_cast<float>(i % 11);
  return v;
}

void check(const Inputs& in, const ScoreMod& mod, const RefMods& m, double scale,
           const BlockMask* bm = nullptr) {
  SDPAOptions opts;
  opts.enable_gqa = true;
  const Program sm = Program::from_score_mod(mod);
  check_flash_against(in, sm, bm, opts, reference_forward(in.q, in.k, in.v, scale, m),
                      reference_backward(in.dout, in.q, in.k, in.v, scale, m));
}

TEST(FlexRegisterScoreMod, ChainWithRowKeyAndUniformOperands) {
  // tanh(score * r[q] / 2) * c[kv]: a chain whose operands vary with the row (r), with
  // neither (the divisor) and with the key (c).
  const int64_t L = 130, S = 200;
  const std::vector<float> r = ramp(L, 0.5f, 0.25f), c = ramp(S, 0.75f, 0.125f);
  const Captured row_scale("row_scale", float_tensor(r)), key_scale("key_scale", float_tensor(c));
  const ScoreMod mod = [&](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    return sdpa::flex::tanh(s * row_scale[q] / 2.0) * key_scale[kv];
  };
  RefMods m;
  m.score = [&](double s, int64_t, int64_t, int64_t i, int64_t j) {
    return std::tanh(s * r[i] / 2.0) * c[j];
  };
  m.dscore = [&](double s, int64_t, int64_t, int64_t i, int64_t j) {
    const double t = std::tanh(s * r[i] / 2.0);
    return (1.0 - t * t) * r[i] / 2.0 * c[j];
  };
  check(inputs(2, 4, 2, L, S, 24, 9, 610), mod, m, 1.0 / std::sqrt(24.0));
}

TEST(FlexRegisterScoreMod, ChainDividingByARowValue) {
  // 4 sigmoid(score / d[q]): a divisor per row, so each row takes its own reciprocal.
  const int64_t L = 65, S = 129;
  const std::vector<float> dv = ramp(L, 0.5f, 0.375f);
  const Captured divisor("divisor", float_tensor(dv));
  const ScoreMod mod = [&](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr&) {
    return sdpa::flex::sigmoid(s / divisor[q]) * 4.0;
  };
  RefMods m;
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  m.score = [&](double s, int64_t, int64_t, int64_t i, int64_t) { return 4.0 * sig(s / dv[i]); };
  m.dscore = [&](double s, int64_t, int64_t, int64_t i, int64_t) {
    const double y = sig(s / dv[i]);
    return 4.0 * y * (1.0 - y) / dv[i];
  };
  check(inputs(1, 3, 1, L, S, 33, 16, 620), mod, m, 1.0 / std::sqrt(33.0));
}

TEST(FlexRegisterScoreMod, BiasPerElementPerDiagonalAndPerKey) {
  const int64_t L = 77, S = 192;
  const Tensor table_t = randn({L, S}, DType::kFloat32, 630);
  const std::vector<double> table = values(table_t);
  const std::vector<float> key_bias = ramp(S, -1.0f, 0.25f);
  const Captured full("full_bias", table_t), keys("key_bias", float_tensor(key_bias));
  struct Case {
    std::string name;
    ScoreMod mod;
    RefMods ref;
  };
  std::vector<Case> cases;
  {  // score + X[q][kv]: an element-shaped X
    RefMods m;
    m.score = [&](double s, int64_t, int64_t, int64_t i, int64_t j) {
      return s + table[static_cast<size_t>(i * S + j)];
    };
    m.dscore = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.0; };
    cases.push_back({"full", [&](const Expr& s, const Expr&, const Expr&, const Expr& q,
                                 const Expr& kv) { return s + full[q][kv]; }, m});
  }
  {  // score - 0.1 |q - kv| - 0.05 h: a diagonal X (ALiBi-like), per head
    RefMods m;
    m.score = [](double s, int64_t, int64_t h, int64_t i, int64_t j) {
      return s - (0.1 * std::abs(static_cast<double>(i - j)) + 0.05 * static_cast<double>(h));
    };
    m.dscore = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.0; };
    cases.push_back({"diagonal", [](const Expr& s, const Expr&, const Expr& h, const Expr& q,
                                    const Expr& kv) {
                       return s - (sdpa::flex::abs(q - kv) * 0.1 + h * 0.05);
                     }, m});
  }
  {  // X[kv] + score: a key-shaped X on the left
    RefMods m;
    m.score = [&](double s, int64_t, int64_t, int64_t, int64_t j) { return key_bias[j] + s; };
    m.dscore = [](double, int64_t, int64_t, int64_t, int64_t) { return 1.0; };
    cases.push_back({"key", [&](const Expr& s, const Expr&, const Expr&, const Expr&,
                                const Expr& kv) { return keys[kv] + s; }, m});
  }
  const Inputs in = inputs(2, 2, 2, L, S, 16, 16, 640);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    check(in, c.mod, c.ref, 0.25);
  }
}

TEST(FlexRegisterScoreMod, SoftCapInsideDocumentAndCausalBlockMask) {
  // Interior tiles of the BlockMask (kept whole by every row) run on registers, the
  // diagonal and document-edge tiles on the masked path.
  const int64_t L = 300, S = 300;
  std::vector<int64_t> ids(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) ids[static_cast<size_t>(i)] = i < 170 ? 0 : 1;
  const double cap = 2.0;
  RefMods m;
  m.score = [&](double s, int64_t, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); };
  m.dscore = [&](double s, int64_t, int64_t, int64_t, int64_t) {
    const double t = std::tanh(s / cap);
    return 1.0 - t * t;
  };
  m.keep = [&](int64_t, int64_t, int64_t i, int64_t j) {
    return j <= i && ids[static_cast<size_t>(i)] == ids[static_cast<size_t>(j)];
  };
  const auto mask = sdpa::flex::and_masks({mods::document(int_tensor(ids)), mods::causal()});
  for (int64_t block : {64, 128}) {
    SCOPED_TRACE("block " + std::to_string(block));
    const BlockMask bm = sdpa::flex::create_block_mask(mask, 1, 1, L, S, block);
    check(inputs(1, 2, 2, L, S, 32, 32, 650), mods::soft_cap(cap), m, 1.0 / std::sqrt(32.0), &bm);
  }
}

TEST(FlexRegisterScoreMod, FailedReadInsideAWholeTileIsReported) {
  // L = 70 rows against tables of 69: only q_idx = 69 reads out of range, in whole key
  // tiles (S = 128) that FLASH computes on registers.
  const Inputs in = inputs(1, 2, 2, 70, 128, 8, 8, 660);
  const Captured table("row_table", randn({69}, DType::kFloat32, 661));
  const Program bias = Program::from_score_mod(
      [&](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr&) { return s + table[q]; });
  const Program chain = Program::from_score_mod(
      [&](const Expr& s, const Expr&, const Expr&, const Expr& q, const Expr&) {
        return sdpa::flex::tanh(s * table[q]);
      });
  sdpa::sdpa_kernel guard(SDPBackend::FLASH_ATTENTION);
  for (const Program* p : {&bias, &chain}) {
    EXPECT_TRUE(throws_error_containing([&] { sdpa::flex_attention(in.q, in.k, in.v, *p); },
                                        {"row_table", "index 69", "size 69", "q_idx=69"}));
  }
}

}  // namespace
}  // namespace flex_test
