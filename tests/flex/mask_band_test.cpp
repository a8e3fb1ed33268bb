// Diagonal bands of mask_mods (src/flex/mask_band.h): which programs are bands, checked
// element by element against the program itself, and whether a BlockMask's lists follow
// its band.

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "flex/mask_band.h"
#include "sdpa/flex_mods.h"

namespace sdpa::flex {
namespace {

std::optional<DiagonalBand> band_of(const MaskMod& mod) {
  return band_of_mask_mod(Program::from_mask_mod(mod));
}

// The band keeps exactly the (q_idx, kv_idx) the program keeps, on a grid wider than any
// bound used below.
void expect_band_is_program(const MaskMod& mod, const DiagonalBand& band) {
  const Program program = Program::from_mask_mod(mod);
  for (int64_t q = 0; q < 48; ++q) {
    for (int64_t kv = 0; kv < 48; ++kv) {
      const bool in_band = (!band.left || kv >= q - *band.left) && (!band.right || kv <= q + *band.right);
      ASSERT_EQ(program.evaluate(0.0, 0, 0, q, kv) != 0.0, in_band) << "q " << q << " kv " << kv;
    }
  }
}

struct BandCase {
  MaskMod mod;
  std::optional<int64_t> left, right;
};

TEST(MaskBand, BandsAreRecognizedExactly) {
  const auto q_minus_kv = [](const Expr& q, const Expr& kv) { return q - kv; };
  const std::vector<BandCase> cases = {
      {mods::causal(), std::nullopt, 0},
      {mods::sliding_window(7), 7, 0},
      {[](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return kv <= q; }, std::nullopt, 0},
      {[&](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return q_minus_kv(q, kv) < 5; },
       4, std::nullopt},
      {[](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return q + 5 >= kv + 2; },
       std::nullopt, 3},
      {[](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return q == kv; }, 0, 0},
      {[](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
         return (kv - q > -10) && !(kv > q + 2);
       },
       9, 2},
      {[](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
         return (q - kv <= 3) || (q - kv >= 2);
       },
       std::nullopt, std::nullopt},
      {noop_mask(), std::nullopt, std::nullopt},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    const std::optional<DiagonalBand> band = band_of(cases[i].mod);
    ASSERT_TRUE(band.has_value());
    EXPECT_EQ(band->alignment, DiagonalAlignment::kTopLeft);
    EXPECT_EQ(band->frame, BandFrame::kSequence);
    EXPECT_EQ(band->left, cases[i].left);
    EXPECT_EQ(band->right, cases[i].right);
    expect_band_is_program(cases[i].mod, *band);
  }
}

TEST(MaskBand, OtherMasksAreNotBands) {
  Tensor ids = Tensor::empty({48}, DType::kInt64);
  for (int64_t i = 0; i < 48; ++i) ids.data<int64_t>()[i] = i / 10;
  const std::vector<MaskMod> others = {
      mods::document(ids),
      mods::prefix_lm(10),
      and_masks({mods::causal(), mods::document(ids)}),
      [](const Expr& b, const Expr&, const Expr& q, const Expr& kv) { return (q >= kv) && (b == 0); },
      [](const Expr&, const Expr& h, const Expr& q, const Expr& kv) { return q - kv <= h; },
      [](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return q >= kv * 2; },
      [](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return q - kv != 3; },
      [](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return (q - kv <= 1) || (q - kv >= 5);  // two rays
      },
      [](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return !((q - kv >= 1) && (q - kv <= 3));  // a hole
      },
      [](const Expr&, const Expr&, const Expr&, const Expr& kv) { return kv < 10; },
      // 2 d <= 6 or 4 <= d <= 9 keeps d <= 9, but a coefficient of 2 is not read.
      [](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return ((q - kv) * 2 <= 6) || (q - kv >= 4 && q - kv <= 9);
      },
      [](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return q % 2 == kv % 2; },
      // Coefficients past the analysis' bounds are not folded (int64 arithmetic wraps).
      [](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
        return q * Expr(int64_t{1} << 21) * Expr(int64_t{1} << 21) + q - kv >= 0;
      },
      // Keeps nothing.
      [](const Expr&, const Expr&, const Expr& q, const Expr& kv) { return (q > kv) && (kv > q); },
  };
  for (size_t i = 0; i < others.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_FALSE(band_of(others[i]).has_value());
  }
}

TEST(MaskBand, BlockListsFollowTheBandOfTheirMaskMod) {
  for (auto [qbs, kbs] : {std::pair<int64_t, int64_t>{16, 16}, {8, 24}, {32, 8}}) {
    SCOPED_TRACE(qbs * 100 + kbs);
    for (const BandCase& c : {BandCase{mods::causal(), std::nullopt, 0},
                              BandCase{mods::sliding_window(20), 20, 0}}) {
      const BlockMask blocks =
          create_block_mask(Program::from_mask_mod(c.mod), 2, 3, 101, 77, qbs, kbs);
      const std::optional<DiagonalBand> band = band_of_mask_mod(*blocks.mask_mod);
      ASSERT_TRUE(band.has_value());
      EXPECT_TRUE(block_lists_follow_band(blocks, *band));
      // The same lists under a band that reaches further: a block it meets is missing.
      DiagonalBand wider = *band;
      wider.right = 9;
      EXPECT_FALSE(block_lists_follow_band(blocks, wider));
    }
  }
}

// Lists made by hand (torch's BlockMask.from_kv_blocks): [1, 1, 4 q blocks] of 16 x 16
// blocks over L = S = 64, causal mask_mod.
BlockMask causal_lists(const std::vector<std::vector<int32_t>>& partial,
                       const std::vector<std::vector<int32_t>>& full) {
  const auto lists = [](const std::vector<std::vector<int32_t>>& rows, Tensor& num, Tensor& idx) {
    num = Tensor::zeros({1, 1, 4}, DType::kInt32);
    idx = Tensor::zeros({1, 1, 4, 4}, DType::kInt32);
    for (size_t r = 0; r < rows.size(); ++r) {
      num.data<int32_t>()[r] = static_cast<int32_t>(rows[r].size());
      for (size_t n = 0; n < rows[r].size(); ++n) idx.data<int32_t>()[r * 4 + n] = rows[r][n];
    }
  };
  KvBlocks blocks;
  lists(partial, blocks.num, blocks.indices);
  lists(full, blocks.full_num, blocks.full_indices);
  return block_mask_from_kv_blocks(blocks, 64, 64, 16, 16, Program::from_mask_mod(mods::causal()));
}

TEST(MaskBand, HandMadeListsAreCheckedBlockByBlock) {
  const DiagonalBand causal = *band_of(mods::causal());
  // Diagonal blocks partial, the blocks left of them full: exactly causal.
  EXPECT_TRUE(block_lists_follow_band(causal_lists({{0}, {1}, {2}, {3}}, {{}, {0}, {0, 1}, {0, 1, 2}}),
                                      causal));
  // Everything partial is causal too (the mask_mod decides each element).
  EXPECT_TRUE(block_lists_follow_band(
      causal_lists({{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}}, {{}, {}, {}, {}}), causal));
  // A partial block above the diagonal keeps nothing: harmless.
  EXPECT_TRUE(block_lists_follow_band(
      causal_lists({{0, 3}, {1}, {2}, {3}}, {{}, {0}, {0, 1}, {0, 1, 2}}), causal));
  // A block of the band left out.
  EXPECT_FALSE(block_lists_follow_band(
      causal_lists({{0}, {1}, {2}, {3}}, {{}, {0}, {1}, {0, 1, 2}}), causal));
  // A diagonal block marked full keeps keys above the diagonal.
  EXPECT_FALSE(block_lists_follow_band(
      causal_lists({{0}, {}, {2}, {3}}, {{}, {0, 1}, {0, 1}, {0, 1, 2}}), causal));
}

}  // namespace
}  // namespace sdpa::flex
