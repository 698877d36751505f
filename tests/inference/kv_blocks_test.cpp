// The block pool and prefix cache (inference/kv_blocks.h): refcounts, hits capped below the last
// token, sharing without copies, LRU eviction of released blocks.
#include <gtest/gtest.h>

#include <numeric>

#include "nxd/inference/kv_blocks.h"

using namespace nxd::inference;

namespace {
std::vector<int64_t> range(int64_t n, int64_t from = 0) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}
}  // namespace

TEST(BlockPool, FullBlocksAreSharedAndTheLastTokenIsNeverAHit) {
  BlockPool pool(8, 4, /*prefix_caching=*/true);
  const auto tokens = range(12);
  std::vector<int64_t> a;
  ASSERT_TRUE(pool.grow(a, 12));
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(pool.used_blocks(), 3);
  EXPECT_EQ(pool.register_full(a, tokens, 12, 0), 3);
  // 12 tokens: at most (12 - 1) / 4 = 2 blocks hit (the last token is computed)
  const auto hits = pool.lookup(tokens);
  ASSERT_EQ(hits, (std::vector<int64_t>{a[0], a[1]}));
  std::vector<int64_t> b;
  ASSERT_TRUE(pool.can_grow(b, hits, 12));
  pool.take(b, hits);
  ASSERT_TRUE(pool.grow(b, 12));
  EXPECT_EQ(b[0], a[0]);
  EXPECT_NE(b[2], a[2]);
  EXPECT_EQ(pool.used_blocks(), 4);  // two shared, two own
  // a different second block breaks the chain there
  auto other = tokens;
  other[5] = 99;
  EXPECT_EQ(pool.lookup(other).size(), 1u);
  pool.release(a);
  EXPECT_EQ(pool.used_blocks(), 3);  // b still holds the shared two and its own
  pool.release(b);
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.lookup(tokens).size(), 2u);  // released blocks stay cached until reused
}

TEST(BlockPool, EvictsTheLeastRecentlyReleasedAndGrowFailsWithoutTakingAnything) {
  BlockPool pool(4, 2, true);
  const auto x = range(5, 0), y = range(5, 100);
  std::vector<int64_t> a, b;
  ASSERT_TRUE(pool.grow(a, 5));  // 3 blocks
  pool.register_full(a, x, 5, 0);
  pool.release(a);               // free queue: 3 (uncached) ... then a's blocks, its last first
  ASSERT_TRUE(pool.grow(b, 3));  // 2 blocks: the never-used one, then a's last (not cached)
  pool.register_full(b, y, 3, 0);
  EXPECT_EQ(pool.lookup(x).size(), 2u);  // a's two full blocks survive
  std::vector<int64_t> c;
  ASSERT_TRUE(pool.grow(c, 2));  // takes the least recently released: a's second block
  EXPECT_EQ(pool.lookup(x).size(), 1u);
  std::vector<int64_t> d;
  EXPECT_FALSE(pool.grow(d, 4));  // 2 blocks needed, 1 free
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(pool.free_blocks(), 1);
}

TEST(BlockPool, WithoutPrefixCachingNothingHits) {
  BlockPool pool(4, 2, false);
  const auto x = range(5);
  std::vector<int64_t> a;
  ASSERT_TRUE(pool.grow(a, 5));
  pool.register_full(a, x, 5, 0);
  EXPECT_TRUE(pool.lookup(x).empty());
}
