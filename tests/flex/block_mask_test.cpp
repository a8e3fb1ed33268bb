// create_block_mask against dense evaluation of the mask_mod on small sizes: the kv-side
// lists (kv_num_blocks / kv_indices, full_*), their q-side transposes, broadcasting over b
// and h, density(), the to_string() block picture, the and_masks / or_masks / noop_mask
// combinators, and a 131072 x 131072 causal mask built in O(blocks) memory.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "flash_check.h"
#include "flex/node.h"
#include "flex_test_util.h"
#include "sdpa/flex_mods.h"

namespace flex_test {
namespace {

using sdpa::SDPBackend;
using sdpa::flex::BlockMask;
using sdpa::flex::Expr;
using sdpa::flex::MaskMod;
using sdpa::flex::Program;
namespace mods = sdpa::flex::mods;

enum : char { kEmptyBlock = '.', kPartialBlock = '+', kFullBlock = '#' };

// The mask evaluated by the scalar oracle at every element: [B][H][L * S].
struct DenseMask {
  int64_t B, H, L, S;
  std::vector<std::vector<std::vector<bool>>> keep;
  DenseMask(const Program& mask, int64_t B_, int64_t H_, int64_t L_, int64_t S_)
      : B(B_), H(H_), L(L_), S(S_),
        keep(B_, std::vector<std::vector<bool>>(H_, std::vector<bool>(L_ * S_))) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j < S; ++j) keep[b][h][i * S + j] = mask.evaluate(0.0, b, h, i, j) != 0.0;
  }
};

// Blocks of q_block query rows by kv_block keys.
struct Blocks {
  int64_t q, kv;
};

// Dense block states [nq][nkv] of (b, h).
std::vector<std::string> dense_states(const DenseMask& dense, int64_t b, int64_t h, Blocks block) {
  const int64_t L = dense.L, S = dense.S;
  const int64_t nq = (L + block.q - 1) / block.q, nkv = (S + block.kv - 1) / block.kv;
  std::vector<std::string> states(nq, std::string(nkv, kEmptyBlock));
  for (int64_t qb = 0; qb < nq; ++qb) {
    for (int64_t kb = 0; kb < nkv; ++kb) {
      bool any_true = false, any_false = false;
      for (int64_t i = qb * block.q; i < std::min(L, (qb + 1) * block.q); ++i) {
        for (int64_t j = kb * block.kv; j < std::min(S, (kb + 1) * block.kv); ++j) {
          (dense.keep[b][h][i * S + j] ? any_true : any_false) = true;
        }
      }
      states[qb][kb] = any_true && any_false ? kPartialBlock : any_true ? kFullBlock : kEmptyBlock;
    }
  }
  return states;
}

// Reads one list: the first num[row] entries of indices[row], checked ascending and in
// range; marks them `mark` in grid[row] (or grid[col][row] when `transposed`).
::testing::AssertionResult read_list(const Tensor& num, const Tensor& indices, int64_t key,
                                     int64_t rows, int64_t cols, char mark, bool transposed,
                                     std::vector<std::string>& grid, const char* what) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t n = num.data<int32_t>()[key * rows + r];
    if (n < 0 || n > cols) return ::testing::AssertionFailure() << what << " count " << n << " at row " << r;
    const int32_t* idx = indices.data<int32_t>() + (key * rows + r) * cols;
    for (int32_t e = 0; e < n; ++e) {
      if (idx[e] < 0 || idx[e] >= cols) {
        return ::testing::AssertionFailure() << what << " index " << idx[e] << " out of range at row " << r;
      }
      if (e > 0 && idx[e] <= idx[e - 1]) {
        return ::testing::AssertionFailure() << what << " not strictly ascending at row " << r;
      }
      char& cell = transposed ? grid[idx[e]][r] : grid[r][idx[e]];
      if (cell != kEmptyBlock) {
        return ::testing::AssertionFailure() << what << ": block listed twice (row " << r << ", " << idx[e] << ")";
      }
      cell = mark;
    }
  }
  return ::testing::AssertionSuccess();
}

// Checks every list of `bm` against dense evaluation of `mask` for B x H.
void check_block_mask(const BlockMask& bm, const Program& mask, const DenseMask& dense,
                      Blocks block) {
  const int64_t B = dense.B, H = dense.H, L = dense.L, S = dense.S;
  const auto& prog = *mask.compiled();
  EXPECT_EQ(bm.batch, prog.uses_batch ? B : 1);
  EXPECT_EQ(bm.num_heads, prog.uses_head ? H : 1);
  EXPECT_EQ(bm.q_len, L);
  EXPECT_EQ(bm.kv_len, S);
  EXPECT_EQ(bm.q_block_size, block.q);
  EXPECT_EQ(bm.kv_block_size, block.kv);
  const int64_t nq = bm.num_q_blocks(), nkv = bm.num_kv_blocks();
  EXPECT_EQ(nq, (L + block.q - 1) / block.q);
  EXPECT_EQ(nkv, (S + block.kv - 1) / block.kv);
  const Shape kv_num{bm.batch, bm.num_heads, nq}, kv_idx{bm.batch, bm.num_heads, nq, nkv};
  const Shape q_num{bm.batch, bm.num_heads, nkv}, q_idx{bm.batch, bm.num_heads, nkv, nq};
  for (const auto& [t, shape, name] :
       std::vector<std::tuple<const Tensor*, Shape, const char*>>{
           {&bm.kv_num_blocks, kv_num, "kv_num_blocks"}, {&bm.kv_indices, kv_idx, "kv_indices"},
           {&bm.full_kv_num_blocks, kv_num, "full_kv_num_blocks"},
           {&bm.full_kv_indices, kv_idx, "full_kv_indices"}, {&bm.q_num_blocks, q_num, "q_num_blocks"},
           {&bm.q_indices, q_idx, "q_indices"}, {&bm.full_q_num_blocks, q_num, "full_q_num_blocks"},
           {&bm.full_q_indices, q_idx, "full_q_indices"}}) {
    ASSERT_TRUE(t->defined()) << name;
    EXPECT_EQ(t->sizes(), shape) << name;
    EXPECT_EQ(t->dtype(), DType::kInt32) << name;
    ASSERT_TRUE(t->is_contiguous()) << name;
  }
  int64_t computed = 0;
  for (int64_t b = 0; b < bm.batch; ++b) {
    for (int64_t h = 0; h < bm.num_heads; ++h) {
      SCOPED_TRACE("b=" + std::to_string(b) + " h=" + std::to_string(h));
      const int64_t key = b * bm.num_heads + h;
      std::vector<std::string> kv_side(nq, std::string(nkv, kEmptyBlock));
      ASSERT_TRUE(read_list(bm.kv_num_blocks, bm.kv_indices, key, nq, nkv, kPartialBlock, false, kv_side, "kv_indices"));
      ASSERT_TRUE(read_list(bm.full_kv_num_blocks, bm.full_kv_indices, key, nq, nkv, kFullBlock, false, kv_side, "full_kv_indices"));
      std::vector<std::string> q_side(nq, std::string(nkv, kEmptyBlock));
      ASSERT_TRUE(read_list(bm.q_num_blocks, bm.q_indices, key, nkv, nq, kPartialBlock, true, q_side, "q_indices"));
      ASSERT_TRUE(read_list(bm.full_q_num_blocks, bm.full_q_indices, key, nkv, nq, kFullBlock, true, q_side, "full_q_indices"));
      EXPECT_EQ(kv_side, q_side) << "q-side lists are not the transpose of the kv-side lists";
      // Every broadcast (b, h) the mask stands for has the same dense states.
      for (int64_t bb = b; bb < (bm.batch == 1 ? B : b + 1); ++bb) {
        for (int64_t hh = h; hh < (bm.num_heads == 1 ? H : h + 1); ++hh) {
          EXPECT_EQ(kv_side, dense_states(dense, bb, hh, block)) << "block states differ from dense evaluation for b=" << bb
                                    << " h=" << hh;
        }
      }
      for (const std::string& row : kv_side) {
        for (char c : row) computed += c != kEmptyBlock;
      }
    }
  }
  EXPECT_NEAR(bm.density(),
              static_cast<double>(computed) / static_cast<double>(bm.batch * bm.num_heads * nq * nkv),
              1e-12);
}

struct NamedMask {
  std::string name;
  MaskMod mod;
  bool needs_square = false;
};

std::vector<NamedMask> standard_masks(int64_t L) {
  std::vector<int64_t> ids, unsorted, pairs;
  for (int64_t i = 0; i < L; ++i) ids.push_back(i < 3 ? 0 : i < 40 ? 1 : i < 41 ? 2 : 3 + i / 50);
  // Document ids that jump around, and a table of which (q / 16, kv / 16) pairs attend:
  // interval analysis reads ranges of them over whole regions of blocks.
  for (int64_t i = 0; i < L; ++i) unsorted.push_back((i / 9 * 7919) % 5);
  const int64_t cells = L / 16 + 1;
  for (int64_t i = 0; i < cells * cells; ++i) pairs.push_back((i * 2654435761u >> 7) % 3 == 0);
  const Tensor doc = int_tensor(ids);
  const sdpa::flex::Captured table("pairs", int_tensor(pairs).view({cells, cells}));
  return {
      {"unsorted document ids", mods::document(int_tensor(unsorted)), true},
      {"table of block pairs",
       [table](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
         return table[sdpa::flex::floor_div(q, 16)][sdpa::flex::floor_div(kv, 16)] != 0;
       }},
      {"causal", mods::causal()},
      {"sliding_window(0)", mods::sliding_window(0)},
      {"sliding_window(5)", mods::sliding_window(5)},
      {"sliding_window(37)", mods::sliding_window(37)},
      {"prefix_lm(20)", mods::prefix_lm(20)},
      {"document", mods::document(doc), true},
      {"and(causal, document)", sdpa::flex::and_masks({mods::causal(), mods::document(doc)}), true},
      {"or(prefix_lm(7), sliding_window(3))", sdpa::flex::or_masks({mods::prefix_lm(7), mods::sliding_window(3)})},
      {"noop", sdpa::flex::noop_mask()},
      {"head and batch dependent",
       [](const Expr& b, const Expr& h, const Expr& q, const Expr& kv) {
         return ((q + h * 3) % Expr(5) != kv % Expr(4)) | ((b == Expr(1)) & (kv > q));
       }},
      {"head dependent window",
       [](const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
         return sdpa::flex::abs(q - kv) <= h * 16;
       }},
  };
}

TEST(FlexBlockMask, StandardMasksMatchDenseEvaluation) {
  // Hundreds of tiny masks: one thread avoids a fork/join per (b, h) item dominating on a
  // loaded machine. The threaded build is compared with this one below.
  OmpThreadsGuard one_thread(1);
  const int64_t B = 2, H = 3;
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1}, {7, 63}, {65, 63}, {130, 130}, {200, 70}};
  for (const auto& [L, S] : sizes) {
    for (const NamedMask& m : standard_masks(std::max(L, S))) {
      if (m.needs_square && L != S) continue;
      const Program mask = Program::from_mask_mod(m.mod);
      const DenseMask dense(mask, B, H, L, S);
      // Square blocks, and torch's non-square BLOCK_SIZE=(q, kv) both ways.
      for (const Blocks block : {Blocks{1, 1}, Blocks{16, 16}, Blocks{64, 64}, Blocks{128, 128},
                                 Blocks{16, 64}, Blocks{128, 7}}) {
        if (block.q * block.kv == 1 && L * S > 5000) continue;
        SCOPED_TRACE(m.name + " L=" + std::to_string(L) + " S=" + std::to_string(S) +
                     " block=" + std::to_string(block.q) + "x" + std::to_string(block.kv));
        const BlockMask bm = sdpa::flex::create_block_mask(mask, B, H, L, S, block.q, block.kv);
        check_block_mask(bm, mask, dense, block);
        if (block.q != block.kv) continue;
        // The square overloads build the same mask.
        const BlockMask again = sdpa::flex::create_block_mask(m.mod, B, H, L, S, block.q);
        EXPECT_EQ(values(again.kv_indices), values(bm.kv_indices));
        EXPECT_EQ(values(again.full_kv_indices), values(bm.full_kv_indices));
      }
    }
  }
}

// Blocks of 16 over 300 keys classify in one thread's grain; blocks of 4 over 1000 also
// fill their lists on several threads (250 x 250 blocks).
TEST(FlexBlockMask, SameListsForAnyThreadCount) {
  for (const auto& [length, block] : {std::pair<int64_t, int64_t>{300, 16}, {1000, 4}}) {
    for (const NamedMask& m : standard_masks(length)) {
      SCOPED_TRACE(m.name + " L " + std::to_string(length));
      std::vector<std::vector<double>> lists;
      for (int threads : {1, 2, 3}) {
        OmpThreadsGuard guard(threads);
        const BlockMask bm = sdpa::flex::create_block_mask(m.mod, 2, 3, length, length, block);
        lists.push_back(values(bm.kv_num_blocks));
        for (const Tensor* t : {&bm.kv_indices, &bm.full_kv_num_blocks, &bm.full_kv_indices,
                                &bm.q_num_blocks, &bm.q_indices, &bm.full_q_num_blocks,
                                &bm.full_q_indices}) {
          const std::vector<double> v = values(*t);
          lists.back().insert(lists.back().end(), v.begin(), v.end());
        }
      }
      EXPECT_EQ(lists[0], lists[1]);
      EXPECT_EQ(lists[0], lists[2]);
    }
  }
}

// Interval analysis decides the blocks of the standard masks without evaluating them, and
// full blocks are reported as full (so the kernels skip mask_mod there).
TEST(FlexBlockMask, CausalBlocksBelowDiagonalAreFull) {
  const BlockMask bm = sdpa::flex::create_block_mask(mods::causal(), 1, 1, 512, 512, 128);
  for (int64_t qb = 0; qb < 4; ++qb) {
    EXPECT_EQ(bm.full_kv_num_blocks.data<int32_t>()[qb], qb);
    EXPECT_EQ(bm.kv_num_blocks.data<int32_t>()[qb], 1);
    EXPECT_EQ(bm.kv_indices.data<int32_t>()[qb * 4], qb);
  }
  EXPECT_DOUBLE_EQ(bm.density(), 10.0 / 16.0);
}

std::vector<std::string> picture_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream is(text);
  std::string line;
  std::getline(is, line);  // header
  while (std::getline(is, line)) lines.push_back(line);
  return lines;
}

TEST(FlexBlockMask, ToStringShowsBlockPictureAndDensity) {
  const BlockMask bm = sdpa::flex::create_block_mask(mods::causal(), 1, 1, 512, 512, 128);
  const std::string text = bm.to_string();
  EXPECT_NE(text.find("density 62.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("sparsity 37.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("512"), std::string::npos) << text;
  EXPECT_EQ(picture_lines(text), (std::vector<std::string>{"+...", "#+..", "##+.", "###+"})) << text;

  // Head-dependent masks show the requested head; out-of-range (b, h) throws.
  const MaskMod by_head = [](const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
    return (h == Expr(0)) | (q >= kv);
  };
  const BlockMask heads = sdpa::flex::create_block_mask(by_head, 1, 2, 256, 256, 128);
  EXPECT_EQ(picture_lines(heads.to_string(0, 0)), (std::vector<std::string>{"##", "##"}));
  EXPECT_EQ(picture_lines(heads.to_string(0, 1)), (std::vector<std::string>{"+.", "#+"}));
  EXPECT_THROW(heads.to_string(0, 2), sdpa::Error);
  EXPECT_THROW(heads.to_string(0, -1), sdpa::Error);

  // Beyond max_size blocks the picture is subsampled.
  const BlockMask big = sdpa::flex::create_block_mask(mods::causal(), 1, 1, 100 * 128, 100 * 128, 128);
  const std::string big_text = big.to_string(0, 0, 64);
  const std::vector<std::string> big_lines = picture_lines(big_text);
  EXPECT_EQ(big_lines.size(), 50u) << big_text;
  for (const std::string& l : big_lines) EXPECT_EQ(l.size(), 50u) << big_text;
  EXPECT_NE(big_text.find("every 2x2"), std::string::npos) << big_text;
  EXPECT_EQ(big_lines.front().front(), kPartialBlock);
  EXPECT_EQ(big_lines.front().back(), kEmptyBlock);
  EXPECT_EQ(big_lines.back().front(), kFullBlock);
}

TEST(FlexBlockMask, CombinatorsMatchLogic) {
  const MaskMod a = mods::sliding_window(4), b = mods::prefix_lm(3);
  const MaskMod c = [](const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
    return (q + kv + h) % Expr(3) == Expr(0);
  };
  const Program pa = Program::from_mask_mod(a), pb = Program::from_mask_mod(b), pc = Program::from_mask_mod(c);
  const Program all = Program::from_mask_mod(sdpa::flex::and_masks({a, b, c}));
  const Program any = Program::from_mask_mod(sdpa::flex::or_masks({a, b, c}));
  const Program noop = Program::from_mask_mod(sdpa::flex::noop_mask());
  const Program and_none = Program::from_mask_mod(sdpa::flex::and_masks({}));
  const Program or_none = Program::from_mask_mod(sdpa::flex::or_masks({}));
  EXPECT_TRUE(all.is_mask());
  EXPECT_TRUE(any.is_mask());
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 20; ++i) {
      for (int64_t j = 0; j < 20; ++j) {
        const bool x = pa.evaluate(0, 0, h, i, j) != 0, y = pb.evaluate(0, 0, h, i, j) != 0,
                   z = pc.evaluate(0, 0, h, i, j) != 0;
        EXPECT_EQ(all.evaluate(0, 0, h, i, j) != 0, x && y && z) << h << " " << i << " " << j;
        EXPECT_EQ(any.evaluate(0, 0, h, i, j) != 0, x || y || z) << h << " " << i << " " << j;
        EXPECT_EQ(noop.evaluate(0, 0, h, i, j), 1.0);
        EXPECT_EQ(and_none.evaluate(0, 0, h, i, j), 1.0);
        EXPECT_EQ(or_none.evaluate(0, 0, h, i, j), 0.0);
      }
    }
  }
  // noop: every block full, nothing partial, density 1.
  const BlockMask bm = sdpa::flex::create_block_mask(sdpa::flex::noop_mask(), 2, 3, 100, 77, 16);
  EXPECT_EQ(bm.batch, 1);
  EXPECT_EQ(bm.num_heads, 1);
  EXPECT_DOUBLE_EQ(bm.density(), 1.0);
  for (int64_t qb = 0; qb < bm.num_q_blocks(); ++qb) {
    EXPECT_EQ(bm.kv_num_blocks.data<int32_t>()[qb], 0);
    EXPECT_EQ(bm.full_kv_num_blocks.data<int32_t>()[qb], bm.num_kv_blocks());
  }
  // or_masks({}) masks everything: no block computed.
  const BlockMask none = sdpa::flex::create_block_mask(sdpa::flex::or_masks({}), 1, 1, 100, 77, 16);
  EXPECT_DOUBLE_EQ(none.density(), 0.0);
}

// FlexAttention's dense creation runs out of memory at 96k (pytorch #134756): ours is
// O(blocks). No timing assertion; memory and density only.
TEST(FlexBlockMask, CausalAt131072InBlockMemory) {
  constexpr int64_t kLen = 131072;
  sdpa::reset_peak_memory();
  const int64_t before = sdpa::memory_stats().current_bytes;
  const BlockMask bm = sdpa::flex::create_block_mask(mods::causal(), 1, 1, kLen, kLen);
  const int64_t peak_growth = sdpa::memory_stats().peak_bytes - before;
  const int64_t nb = kLen / 128;
  EXPECT_EQ(bm.num_q_blocks(), nb);
  // Density (nb (nb + 1) / 2) / nb^2 = 0.500488...
  EXPECT_NEAR(bm.density(), 0.5 * (nb + 1) / nb, 1e-12);
  EXPECT_NEAR(bm.density(), 0.5, 1e-3);
  EXPECT_LT(peak_growth, int64_t{64} << 20) << "create_block_mask grew peak memory by " << peak_growth << " bytes";
  // Spot checks: row qb has qb full blocks and its diagonal block partial.
  for (int64_t qb : {int64_t{0}, int64_t{1}, nb / 2, nb - 1}) {
    EXPECT_EQ(bm.full_kv_num_blocks.data<int32_t>()[qb], qb);
    EXPECT_EQ(bm.kv_num_blocks.data<int32_t>()[qb], 1);
    EXPECT_EQ(bm.kv_indices.data<int32_t>()[qb * nb], qb);
    EXPECT_EQ(bm.q_num_blocks.data<int32_t>()[qb], 1);
    EXPECT_EQ(bm.full_q_num_blocks.data<int32_t>()[qb], nb - 1 - qb);
  }
  // A sliding window of 256 at the same length: 2 to 3 blocks per row.
  const BlockMask window = sdpa::flex::create_block_mask(mods::sliding_window(256), 1, 1, kLen, kLen);
  EXPECT_NEAR(window.density(), 3.0 / static_cast<double>(nb), 1.0 / static_cast<double>(nb));
}

struct Naive {
  double out = 0, dq = 0, dk = 0, dv = 0;
};

// Rows whose every block is empty give zeros and lse = -inf, and no gradient.
TEST(FlexBlockMask, FullyMaskedRowsGiveZeros) {
  const int64_t B = 1, H = 2, L = 70, S = 50, E = 8;
  // Rows q < 40 see nothing.
  const MaskMod late = [](const Expr&, const Expr&, const Expr& q, const Expr& kv) {
    return (q >= Expr(40)) & (kv <= q);
  };
  const BlockMask bm = sdpa::flex::create_block_mask(late, B, H, L, S, 16);
  const Tensor q = randn({B, H, L, E}, DType::kFloat32, 1), k = randn({B, H, S, E}, DType::kFloat32, 2);
  const Tensor v = randn({B, H, S, E}, DType::kFloat32, 3), dout = randn({B, H, L, E}, DType::kFloat32, 4);
  RefMods ref;
  ref.keep = [](int64_t, int64_t, int64_t i, int64_t j) { return i >= 40 && j <= i; };
  const RefForward gold = reference_forward(q, k, v, 1.0 / std::sqrt(8.0), ref);
  const RefGrads ggold = reference_backward(dout, q, k, v, 1.0 / std::sqrt(8.0), ref);
  // Naive errors: MATH in float32 (the first pass), then FLASH held to them.
  Naive naive;
  for (SDPBackend backend : {SDPBackend::MATH, SDPBackend::FLASH_ATTENTION}) {
    SCOPED_TRACE(std::string(sdpa::backend_name(backend)));
    sdpa::sdpa_kernel guard(backend);
    const auto r = sdpa::flex_attention(q, k, v, std::nullopt, &bm);
    EXPECT_EQ(r.backend, backend);
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < 40; ++i) {
        EXPECT_EQ(r.lse.item({0, h, i}), -std::numeric_limits<double>::infinity());
        for (int64_t e = 0; e < E; ++e) EXPECT_EQ(r.out.item({0, h, i, e}), 0.0);
      }
    }
    const auto g = sdpa::flex_attention_backward(dout, q, k, v, r.out, r.lse, std::nullopt, &bm);
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < 40; ++i) {
        for (int64_t e = 0; e < E; ++e) EXPECT_EQ(g.grad_q.item({0, h, i, e}), 0.0);
      }
    }
    if (backend == SDPBackend::MATH) {
      naive = {max_abs_diff(r.out, gold.out), max_abs_diff(g.grad_q, ggold.dq),
               max_abs_diff(g.grad_k, ggold.dk), max_abs_diff(g.grad_v, ggold.dv)};
    }
    EXPECT_TRUE(all_close(r.out, gold.out, tolerance(DType::kFloat32, naive.out, kFudgeOut), "out"));
    EXPECT_TRUE(all_close(g.grad_q, ggold.dq, tolerance(DType::kFloat32, naive.dq, kFudgeGradQ), "grad_q"));
    EXPECT_TRUE(all_close(g.grad_k, ggold.dk, tolerance(DType::kFloat32, naive.dk, kFudgeGradK), "grad_k"));
    EXPECT_TRUE(all_close(g.grad_v, ggold.dv, tolerance(DType::kFloat32, naive.dv, kFudgeGradV), "grad_v"));
  }
}

// Non-square blocks (torch's BLOCK_SIZE=(q, kv)): FLASH and MATH read them in the forward
// and the backward (whose q-side lists transpose the grid) as the reference says.
TEST(FlexBlockMask, NonSquareBlocksAttendAsTheReference) {
  const int64_t B = 2, Hq = 4, Hkv = 2, L = 130, S = 97;
  const Inputs in = inputs(B, Hq, Hkv, L, S, 16, 8, 600);
  const MaskMod band = [](const Expr&, const Expr& h, const Expr& q, const Expr& kv) {
    return (kv <= q) & (q - kv <= Expr(40) + h * 5);
  };
  RefMods ref;
  ref.keep = [](int64_t, int64_t h, int64_t i, int64_t j) { return j <= i && i - j <= 40 + h * 5; };
  SDPAOptions opts;
  opts.enable_gqa = true;
  const double scale = 1.0 / std::sqrt(16.0);
  const RefForward gold = reference_forward(in.q, in.k, in.v, scale, ref);
  const RefGrads ggold = reference_backward(in.dout, in.q, in.k, in.v, scale, ref);
  for (const Blocks block : {Blocks{16, 64}, Blocks{64, 16}, Blocks{128, 7}}) {
    SCOPED_TRACE(std::to_string(block.q) + "x" + std::to_string(block.kv));
    const BlockMask bm =
        sdpa::flex::create_block_mask(Program::from_mask_mod(band), B, Hq, L, S, block.q, block.kv);
    check_flash_against(in, std::nullopt, &bm, opts, gold, ggold);
  }
}

// BlockMasks from block lists (torch's BlockMask.from_kv_blocks): the lists of a built mask
// give back the same mask; without a mask_mod, listed blocks are kept whole, which FLASH
// and MATH follow; bad lists are errors naming the list.
TEST(FlexBlockMask, FromKvBlocksRoundTripsAndKeepsListedBlocksWhole) {
  const Program window = Program::from_mask_mod(mods::sliding_window(20));
  const BlockMask built = sdpa::flex::create_block_mask(window, 1, 2, 100, 90, 16, 32);
  const BlockMask again = sdpa::flex::block_mask_from_kv_blocks(
      {built.kv_num_blocks, built.kv_indices, built.full_kv_num_blocks, built.full_kv_indices},
      100, 90, 16, 32, window);
  for (const auto& [a, b] : {std::pair{&built.kv_indices, &again.kv_indices},
                             {&built.full_kv_num_blocks, &again.full_kv_num_blocks},
                             {&built.q_indices, &again.q_indices},
                             {&built.full_q_indices, &again.full_q_indices}}) {
    EXPECT_EQ(values(*a), values(*b));
  }

  // Per q block of 16 rows: kv blocks of 32 listed in reverse order, row 3 listing none.
  const int64_t B = 1, H = 2, L = 70, S = 90, nq = 5;
  Tensor num = Tensor::zeros({1, 1, nq}, DType::kInt32).expand({B, H, nq});
  Tensor idx = Tensor::zeros({B, H, nq, 3}, DType::kInt64);
  const std::vector<std::vector<int64_t>> listed = {{0}, {2, 0}, {1}, {}, {2, 1, 0}};
  Tensor counts = Tensor::empty({B, H, nq}, DType::kInt32);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t qb = 0; qb < nq; ++qb) {
      counts.set_item(Shape{0, h, qb}, static_cast<double>(listed[qb].size()));
      for (size_t e = 0; e < listed[qb].size(); ++e) {
        idx.set_item(Shape{0, h, qb, static_cast<int64_t>(e)}, static_cast<double>(listed[qb][e]));
      }
    }
  }
  const BlockMask blocks = sdpa::flex::block_mask_from_kv_blocks({counts, idx, {}, {}}, L, S, 16, 32);
  const Inputs in = inputs(B, H, H, L, S, 8, 8, 700);
  RefMods ref;
  ref.keep = [&](int64_t, int64_t, int64_t i, int64_t j) {
    const auto& kv = listed[i / 16];
    return std::find(kv.begin(), kv.end(), j / 32) != kv.end();
  };
  const double scale = 1.0 / std::sqrt(8.0);
  check_flash_against(in, std::nullopt, &blocks, {}, reference_forward(in.q, in.k, in.v, scale, ref),
                      reference_backward(in.dout, in.q, in.k, in.v, scale, ref));

  auto error = [&](const sdpa::flex::KvBlocks& b) {
    try {
      (void)sdpa::flex::block_mask_from_kv_blocks(b, L, S, 16, 32);
    } catch (const sdpa::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Tensor twice = idx.clone();
  twice.set_item(Shape{0, 0, 1, 1}, 2.0);
  EXPECT_NE(error({counts, twice, {}, {}}).find("kv block 2 is listed twice for q block 1"),
            std::string::npos);
  Tensor far = idx.clone();
  far.set_item(Shape{0, 1, 0, 0}, 3.0);
  EXPECT_NE(error({counts, far, {}, {}}).find("kv_indices: expected kv block indices in [0, 3), got 3"),
            std::string::npos);
  EXPECT_NE(error({num.slice(2, 0, 4), idx, {}, {}}).find("expected kv_num_blocks of shape [1, 2, 5]"),
            std::string::npos);
  EXPECT_NE(error({counts, idx, counts, {}}).find("or neither"), std::string::npos);
  // Lists are read on the host: a device tensor is refused before any read.
  const Tensor on_gpu = Tensor::from_blob(counts.data_ptr(), counts.sizes(), counts.strides(),
                                          DType::kInt32, sdpa::Device{sdpa::DeviceType::kCUDA, 0});
  EXPECT_NE(error({on_gpu, idx, {}, {}}).find("expected block lists on cpu, got cuda:0"),
            std::string::npos);
}

}  // namespace
}  // namespace flex_test
