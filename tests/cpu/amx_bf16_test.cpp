// The AMX bf16 GEMM (src/cpu/amx_bf16.h) against a float64 product of the same bf16
// operands and against the vdpbf16ps kernel it replaces: odd m, odd depths (partial tiles
// of 1-15 pairs), every n up to five column tiles, the three A layouts the flash kernels
// pass (row-major, the backward's pair-packed transposes, a general pair stride), padded
// leading dimensions, overwrite and accumulate, and the C elements it must not touch.
// Skipped where the CPU or the OS has no AMX.

#include "cpu/amx_bf16.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace sdpa::cpu {
namespace {

uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

double from_bf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof x);
  return x;
}

enum class Layout { kRowMajor, kPairTranspose, kPairStride };

// Operands of one product: A [m, 2 depth] in `layout`, B pair-packed [depth][n][2], C
// [m, n] inside a wider buffer filled with a sentinel.
struct Problem {
  int64_t m, n, depth;
  Layout layout;
  std::vector<uint16_t> a, b;
  Bf16PairRows a_view{};
  int64_t ldc;
  std::vector<float> c0;  // C before the call

  Problem(int64_t m, int64_t n, int64_t depth, Layout layout, std::mt19937& rng)
      : m(m), n(n), depth(depth), layout(layout), ldc(n + 16) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Storage big enough for every layout; A elements never read stay NaN so that a read
    // outside the operand shows in C.
    const int64_t a_words = (m + 3) * (depth + 5) * 2 + 2 * m * depth + 64;
    a.assign(static_cast<size_t>(2 * a_words), 0x7FC1);
    switch (layout) {
      case Layout::kRowMajor:  // rows of depth + 3 pairs
        a_view = {a.data(), 2 * (depth + 3), 2};
        break;
      case Layout::kPairTranspose:  // [depth][m + 1][2], as the backward's P^T pairs
        a_view = {a.data(), 2, 2 * (m + 1)};
        break;
      case Layout::kPairStride:  // pairs two words apart, rows 4 depth + 2 elements apart
        a_view = {a.data(), 4 * depth + 2, 4};
        break;
    }
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t e = 0; e < 2 * depth; ++e) a_at(r, e) = to_bf16(normal(rng));
    }
    b.resize(static_cast<size_t>(2 * depth * n));
    for (uint16_t& x : b) x = to_bf16(normal(rng));
    c0.assign(static_cast<size_t>(m * ldc + 16), std::nanf(""));
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) c0[static_cast<size_t>(r * ldc + j)] = normal(rng);
    }
  }

  uint16_t& a_at(int64_t r, int64_t e) {
    return a[static_cast<size_t>(r * a_view.ld + (e / 2) * a_view.pair_stride + e % 2)];
  }
  double b_at(int64_t e, int64_t j) const {
    return from_bf16(b[static_cast<size_t>((e / 2) * 2 * n + 2 * j + e % 2)]);
  }

  // |C - expected| bound per element: float32 accumulation of 2 depth products.
  void check(const std::vector<float>& c, bool accumulate, const char* what) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = accumulate ? c0[static_cast<size_t>(r * ldc + j)] : 0.0, magnitude = 0.0;
        for (int64_t e = 0; e < 2 * depth; ++e) {
          const double product = from_bf16(a_at(r, e)) * b_at(e, j);
          sum += product;
          magnitude += std::abs(product);
        }
        if (accumulate) magnitude += std::abs(c0[static_cast<size_t>(r * ldc + j)]);
        const double bound = (2 * depth + 2) * std::ldexp(1.0, -23) * magnitude + 1e-30;
        const double got = c[static_cast<size_t>(r * ldc + j)];
        ASSERT_LE(std::abs(got - sum), bound)
            << what << " m " << m << " n " << n << " depth " << depth << " layout "
            << static_cast<int>(layout) << " accumulate " << accumulate << " at (" << r << ", " << j
            << ")";
      }
      for (int64_t j = n; j < ldc; ++j) {
        ASSERT_TRUE(std::isnan(c[static_cast<size_t>(r * ldc + j)]))
            << what << " wrote column " << j;
      }
    }
  }
};

TEST(AmxBf16Gemm, MatchesFloat64AndVdpbf16psOnOddShapes) {
  if (!amx_available()) GTEST_SKIP() << "no AMX-BF16 on this CPU / OS";
  const AmxTiles tiles(true);
  ASSERT_TRUE(tiles.active());
  std::mt19937 rng(7);
  int checked = 0;
  for (int64_t m : {1, 7, 15, 16, 17, 33, 64}) {
    for (int64_t n : {16, 32, 48, 80}) {
      for (int64_t depth : {1, 7, 16, 17, 32, 40}) {
        for (Layout layout : {Layout::kRowMajor, Layout::kPairTranspose, Layout::kPairStride}) {
          for (bool accumulate : {false, true}) {
            Problem p(m, n, depth, layout, rng);
            const GemmOutput output = accumulate ? GemmOutput::kAccumulate : GemmOutput::kOverwrite;
            std::vector<float> amx = p.c0, dot = p.c0;
            AmxBf16Gemm({m, n, depth}, p.a_view, p.b.data(), {amx.data(), p.ldc}, output);
            p.check(amx, accumulate, "AMX");
            Bf16Gemm({m, n, depth}, p.a_view, p.b.data(), {dot.data(), p.ldc}, output);
            p.check(dot, accumulate, "vdpbf16ps");
            if (HasFatalFailure()) return;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 7 * 4 * 6 * 3 * 2);
}

// B in groups of 32 pairs held apart (the flash forward's value tiles): the float64 bound of
// the one-buffer product, bit for bit its result (the same k-steps in the same order), and
// nothing written past C's columns; A rows as the forward's P group holds them.
TEST(AmxBf16Gemm, GroupsOfBMatchOneBuffer) {
  if (!amx_available()) GTEST_SKIP() << "no AMX-BF16 on this CPU / OS";
  const AmxTiles tiles(true);
  std::mt19937 rng(13);
  for (int64_t m : {1, 17, 37, 64}) {
    for (int64_t n : {16, 80, 128}) {
      for (int64_t groups : {1, 2, 3, 4}) {
        Problem p(m, n, 32 * groups, Layout::kRowMajor, rng);
        // The groups apart, with a NaN gap after each.
        std::vector<std::vector<uint16_t>> apart;
        std::vector<const uint16_t*> bases;
        const size_t words = static_cast<size_t>(64 * n);
        for (int64_t g = 0; g < groups; ++g) {
          apart.emplace_back(p.b.begin() + static_cast<std::ptrdiff_t>(g * words),
                             p.b.begin() + static_cast<std::ptrdiff_t>((g + 1) * words));
          apart.back().resize(words + 64, 0x7FC1);
        }
        for (const auto& group : apart) bases.push_back(group.data());
        std::vector<float> one = p.c0, grouped = p.c0;
        AmxBf16Gemm({m, n, p.depth}, p.a_view, p.b.data(), {one.data(), p.ldc},
                    GemmOutput::kAccumulate);
        AmxBf16GemmGroups({m, n, p.depth}, p.a_view, bases.data(), 32, {grouped.data(), p.ldc},
                          GemmOutput::kAccumulate);
        p.check(grouped, true, "AMX groups");
        if (HasFatalFailure()) return;
        ASSERT_EQ(std::memcmp(one.data(), grouped.data(), one.size() * sizeof(float)), 0)
            << "m " << m << " n " << n << " groups " << groups;
      }
    }
  }
}

TEST(AmxBf16Gemm, ZeroDepthOverwritesWithZerosAndAccumulatesNothing) {
  if (!amx_available()) GTEST_SKIP() << "no AMX-BF16 on this CPU / OS";
  const AmxTiles tiles(true);
  std::vector<float> c(3 * 16, 2.5f);
  const uint16_t unused = 0;
  AmxBf16Gemm({3, 16, 0}, {&unused, 0, 2}, &unused, {c.data(), 16}, GemmOutput::kAccumulate);
  for (float x : c) ASSERT_EQ(x, 2.5f);
  AmxBf16Gemm({3, 16, 0}, {&unused, 0, 2}, &unused, {c.data(), 16}, GemmOutput::kOverwrite);
  for (float x : c) ASSERT_EQ(x, 0.0f);
}

// The palette of the thread's current tile configuration (0: released).
__attribute__((target("amx-tile"))) int current_palette() {
  alignas(64) uint8_t config[64] = {};
  _tile_storeconfig(config);
  return config[0];
}

TEST(AmxTiles, NestedScopesKeepTheOutermostConfigurationUntilItEnds) {
  if (!amx_available()) GTEST_SKIP() << "no AMX-BF16 on this CPU / OS";
  EXPECT_EQ(current_palette(), 0);
  {
    const AmxTiles outer(true);
    EXPECT_EQ(current_palette(), 1);
    { const AmxTiles inner(true); }
    // Still configured: a product after the inner scope ended.
    EXPECT_EQ(current_palette(), 1);
    std::mt19937 rng(11);
    Problem p(17, 32, 17, Layout::kRowMajor, rng);
    std::vector<float> c = p.c0;
    AmxBf16Gemm({p.m, p.n, p.depth}, p.a_view, p.b.data(), {c.data(), p.ldc},
                GemmOutput::kOverwrite);
    p.check(c, false, "AMX after a nested scope");
  }
  EXPECT_EQ(current_palette(), 0);
  const AmxTiles disabled(false);
  EXPECT_FALSE(disabled.active());
  EXPECT_EQ(current_palette(), 0);
}

}  // namespace
}  // namespace sdpa::cpu
