// Generator: seeding, per-call offsets, the process default, thread safety.

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "sdpa/generator.h"

namespace sdpa {
namespace {

TEST(Generator, SeedAndOffsetAdvance) {
  Generator g(5);
  EXPECT_EQ(g.initial_seed(), 5u);
  const PhiloxState a = g.next();
  const PhiloxState b = g.next();
  EXPECT_EQ(a.seed, 5u);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(b.seed, 5u);
  EXPECT_EQ(b.offset, 1u);
}

TEST(Generator, ManualSeedResetsTheOffset) {
  Generator g(1);
  g.next();
  g.next();
  g.manual_seed(77);
  EXPECT_EQ(g.initial_seed(), 77u);
  const PhiloxState s = g.next();
  EXPECT_EQ(s.seed, 77u);
  EXPECT_EQ(s.offset, 0u);
}

TEST(Generator, SameSeedSameSequence) {
  Generator a(123), b(123);
  for (int i = 0; i < 5; ++i) {
    const PhiloxState x = a.next(), y = b.next();
    EXPECT_EQ(x.seed, y.seed);
    EXPECT_EQ(x.offset, y.offset);
  }
}

TEST(Generator, FullWidthSeedsAreKept) {
  Generator g(0xfedcba9876543210ull);
  EXPECT_EQ(g.next().seed, 0xfedcba9876543210ull);
}

TEST(Generator, DefaultGeneratorIsSeededByManualSeed) {
  manual_seed(4242);
  EXPECT_EQ(default_generator().initial_seed(), 4242u);
  EXPECT_EQ(default_generator().next().offset, 0u);
  EXPECT_EQ(default_generator().next().offset, 1u);
  EXPECT_EQ(&default_generator(), &default_generator());
}

TEST(Generator, ConcurrentNextHandsOutEveryOffsetOnce) {
  Generator g(9);
  constexpr int kThreads = 4, kPerThread = 2000;
  std::vector<std::vector<uint64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) seen[t].push_back(g.next().offset);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<uint64_t> all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), size_t{kThreads * kPerThread});
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], i);
}

}  // namespace
}  // namespace sdpa
