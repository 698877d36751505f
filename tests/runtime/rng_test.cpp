#include <gtest/gtest.h>

#include <cmath>

#include "nxd/runtime/init.h"
#include "support/compare.h"
#include "support/threads.h"

using namespace nxd;

TEST(Philox, KnownAnswer) {
  // Random123's known-answer test for philox4x32-10 with counter 0 and key 0.
  auto r = philox4x32(0, 0, 0);
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

TEST(Init, ShardEqualsSliceOfFullTensor) {
  RngStream s{1234, stream_id("layers.0.mlp.weight")};
  Tensor full = empty({12, 10});
  init::normal(full, s, 0.0, 0.02);
  for (int parts : {2, 3, 4}) {
    for (int dim : {0, 1}) {
      if (full.size(dim) % parts) continue;
      int64_t len = full.size(dim) / parts;
      for (int r = 0; r < parts; ++r) {
        Shape sh = full.shape();
        sh[dim] = len;
        Tensor shard = empty(sh);
        Shape start{0, 0};
        start[dim] = r * len;
        init::Region region{full.shape(), start};
        init::normal(shard, s, 0.0, 0.02, &region);
        EXPECT_BITWISE_EQ(shard, full.narrow(dim, r * len, len).contiguous());
      }
    }
  }
  // a non-contiguous destination view gets the same values
  Tensor t = empty({10, 12});
  init::normal(t.t(), s, 0.0, 0.02);
  EXPECT_BITWISE_EQ(t.t().contiguous(), full);
}

TEST(Init, Distributions) {
  RngStream s{7, 1};
  Tensor u = empty({100000});
  init::uniform(u, s, -2, 3);
  auto v = u.to_vector();
  double mn = 1e9, mx = -1e9, mean = 0;
  for (double x : v) mn = std::min(mn, x), mx = std::max(mx, x), mean += x;
  mean /= v.size();
  EXPECT_GE(mn, -2);
  EXPECT_LT(mx, 3);
  EXPECT_NEAR(mean, 0.5, 0.03);
  Tensor n = empty({100000}, DType::f64);
  init::normal(n, s, 1.0, 2.0);
  auto w = n.to_vector();
  double m = 0, var = 0;
  for (double x : w) m += x;
  m /= w.size();
  for (double x : w) var += (x - m) * (x - m);
  var /= w.size();
  EXPECT_NEAR(m, 1.0, 0.03);
  EXPECT_NEAR(std::sqrt(var), 2.0, 0.03);
  Tensor k = empty({256, 64});
  init::kaiming_uniform(k, s, 64);
  double bound = std::sqrt(2.0 / 6.0) * std::sqrt(3.0 / 64);
  for (double x : k.to_vector()) ASSERT_LE(std::fabs(x), bound);
}

TEST(Generator, StreamsDifferAndRepeat) {
  Generator a(5), b(5);
  EXPECT_EQ(a.next().stream, b.next().stream);
  EXPECT_NE(a.next().uniform(0), a.next().uniform(0));
}

// Contiguous tensors are filled over the compute pool in blocks: the values are those of the
// element-by-element path (a strided destination), for a 3-d shard at any thread count.
TEST(Init, ParallelFillIsThreadInvariantAndEqualsTheStridedPath) {
  RngStream s{77, stream_id("layers.1.self_attn.q_proj.weight")};
  const init::Region region{{6, 700, 48}, {2, 100, 16}};
  nxd::testing::expect_thread_invariant([&] {
    Tensor a = empty({3, 500, 24}), u = empty({3, 500, 24}, DType::bf16);
    init::normal(a, s, 0.0, 0.02, &region);
    init::uniform(u, s, -0.1, 0.1, &region);
    return std::vector<Tensor>{a, u};
  });
  Tensor a = empty({3, 500, 24});
  init::normal(a, s, 0.0, 0.02, &region);
  Tensor b = empty({24, 500, 3});  // a strided view of it takes the element-by-element path
  init::normal(b.permute({2, 1, 0}), s, 0.0, 0.02, &region);
  EXPECT_BITWISE_EQ(b.permute({2, 1, 0}).contiguous(), a);
}
