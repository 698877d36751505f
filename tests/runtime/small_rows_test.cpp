// The f32 product of a few rows (blas::sgemm with m <= kSmallRows: a decode step's linear layers,
// one row per running sequence) against a double reference, for every transposition, ragged n and
// k, alpha and beta; bitwise lanes8::dot for each element whatever m (the register tiles of
// rows_times_bt), so a row's values are the same alone as in any batch; and bitwise the same for
// any thread count and any operand address.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/gemv_f32.h"
#include "nxd/runtime/lanes8.h"
#include "support/compare.h"
#include "support/weights.h"

using namespace nxd;

namespace {

std::vector<float> values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) % 2001 - 1000) / 700.0f;
  }
  return v;
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
};

// C = alpha op(A) op(B) + beta C into c (ldc = n), operands at the given element offsets.
void product(const Case& s, const std::vector<float>& a, const std::vector<float>& b, float alpha,
             float beta, std::vector<float>& c) {
  blas::sgemm(s.ta, s.tb, s.m, s.n, s.k, alpha, a.data(), s.ta ? s.m : s.k, b.data(),
              s.tb ? s.k : s.n, beta, c.data(), s.n);
}

using nxd::testing::at_offset;
using nxd::testing::expect_same_bits_over_threads_and_offsets;
using nxd::testing::ThreadsGuard;

}  // namespace

TEST(SmallRows, MatchTheDoubleReferenceForEveryLayout) {
  ThreadsGuard guard;
  set_num_threads(2);
  double worst = 0;
  for (int64_t m : {1, 2, 3, 8, 13, 32})
    for (int64_t n : {1031, 2053})  // n * k >= kSmallRowsMinB: these take the path
      for (int64_t k : {64, 77, 1000})
        for (bool ta : {false, true})
          if (m <= 8 || k != 1000)  // (the double reference is slow)
            for (bool tb : {false, true}) {
              const Case s{m, n, k, ta, tb};
              SCOPED_TRACE(str("m=", m, " n=", n, " k=", k, " ta=", ta, " tb=", tb));
              const auto a = values(m * k, 1), b = values(n * k, 2), c0 = values(m * n, 3);
              for (float beta : {0.0f, 0.25f}) {
                std::vector<float> c = c0;
                if (beta == 0.0f) std::fill(c.begin(), c.end(), std::nanf(""));  // C is not read
                product(s, a, b, 0.5f, beta, c);
                for (int64_t i = 0; i < m; ++i)
                  for (int64_t j = 0; j < n; ++j) {
                    double r = 0, mag = 0;
                    for (int64_t p = 0; p < k; ++p) {
                      const double x = a[ta ? p * m + i : i * k + p];
                      const double y = b[tb ? j * k + p : p * n + j];
                      r += x * y;
                      mag += std::abs(x * y);
                    }
                    const double bc = beta * static_cast<double>(c0[i * n + j]);
                    r = 0.5 * r + bc;
                    const double err =
                        std::abs(c[i * n + j] - r) / (0.5 * mag + std::abs(bc) + 1e-30);
                    worst = std::max(worst, err);
                    // the standard bound for k products summed in f32 and the alpha/beta
                    // epilogue: (k + 3) u (|alpha| sum |a b| + |beta c|)
                    ASSERT_LE(err, static_cast<double>(k + 3) * 0x1p-24)
                        << "C[" << i << "," << j << "] = " << c[i * n + j] << ", reference " << r;
                  }
              }
            }
  std::printf("    largest error relative to sum |a b|: %.3g (bound (k + 3) 2^-24)\n", worst);
}

// Every element of X W^T (W [n, k], the layout of a linear layer's weight) is lanes8::dot of its
// row and column, bitwise, for 1 to kSmallRows rows (every remainder of the register tile in rows
// and columns), k around the 32- and 8-lane blocks, and 1 and 2 threads: a row's values do not
// depend on the other rows of its batch. This file is built with -ffp-contract=off like the kernel
// (tests/runtime/CMakeLists.txt), so lanes8::dot here is the same arithmetic.
TEST(SmallRows, EachElementIsTheLaneOrderDotForAnyRowCount) {
  ThreadsGuard guard;
  constexpr int64_t kRows = blas::detail::kSmallRows;
  int64_t checked = 0;
  uint64_t digest = 14695981039346656037ull;
  for (int64_t k : {7, 31, 32, 33, 40, 95, 257})
    for (int64_t n : {257, 263}) {
      // B large enough for the path whatever k (n * k >= kSmallRowsMinB)
      const int64_t nb = std::max(n, (blas::detail::kSmallRowsMinB + k - 1) / k);
      const auto x = values(kRows * k, 9), w = values(nb * k, 10);
      std::vector<float> lane_order(kRows * nb);
      for (int64_t i = 0; i < kRows; ++i)
        for (int64_t j = 0; j < nb; ++j)
          lane_order[i * nb + j] = lanes8::dot(x.data() + i * k, w.data() + j * k, k);
      for (int threads : {1, 2})
        for (int64_t m = 1; m <= kRows; ++m) {
          SCOPED_TRACE(str("threads=", threads, " k=", k, " n=", nb, " m=", m));
          set_num_threads(threads);
          std::vector<float> c(m * nb, std::nanf(""));
          ASSERT_TRUE(blas::detail::sgemm_small_rows(false, true, m, nb, k, 1.0f, x.data(), k,
                                                     w.data(), k, 0.0f, c.data(), nb));
          if (std::memcmp(c.data(), lane_order.data(), c.size() * 4) != 0) {
            for (int64_t e = 0; e < m * nb; ++e) {
              ASSERT_EQ(std::memcmp(&c[e], &lane_order[e], 4), 0)
                  << "C[" << e / nb << "," << e % nb << "] = " << c[e] << ", lane order "
                  << lane_order[e];
            }
          }
          checked += m * nb;
          for (float v : c) {  // FNV-1a over the bits, for comparing builds
            uint32_t u;
            std::memcpy(&u, &v, 4);
            digest = (digest ^ u) * 1099511628211ull;
          }
        }
    }
  // the same digest on the native, x86-64-v3 and x86-64-v2 builds: the same bits on each
  std::printf("    %lld elements bitwise lanes8::dot, digest %016llx\n",
              static_cast<long long>(checked), static_cast<unsigned long long>(digest));
}

TEST(SmallRows, BitwiseOverThreadCountsAndAddresses) {
  for (Case s : {Case{1, 3000, 768, false, true}, Case{4, 2048, 333, false, true},
                 Case{8, 1500, 257, false, false}, Case{3, 777, 1000, true, true},
                 Case{16, 1031, 768, false, true}, Case{31, 515, 200, false, false}}) {
    SCOPED_TRACE(str("m=", s.m, " n=", s.n, " k=", s.k, " ta=", s.ta, " tb=", s.tb));
    const auto a = values(s.m * s.k, 4), b = values(s.n * s.k, 5);
    expect_same_bits_over_threads_and_offsets([&](size_t off) {
      const auto ab = at_offset(a, off), bb = at_offset(b, off);
      std::vector<float> cb(s.m * s.n + 8);
      blas::sgemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, ab.data() + off, s.ta ? s.m : s.k,
                  bb.data() + off, s.tb ? s.k : s.n, 0.0f, cb.data() + off, s.n);
      return std::vector<float>(cb.begin() + off, cb.begin() + off + s.m * s.n);
    });
  }
}

TEST(SmallRows, OnlyAFewRowsAgainstALargeOperandTakeThisPath) {
  // More rows, or a B small enough to sit in cache (an attention block), go to the engine: the
  // kernel refuses them itself.
  const int64_t k = 256, n = blas::detail::kSmallRowsMinB / k;
  const int64_t m = blas::detail::kSmallRows + 1;
  std::vector<float> a(m * k), b(n * k), c(m * n);
  EXPECT_FALSE(blas::detail::sgemm_small_rows(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k,
                                              0.0f, c.data(), n));
  EXPECT_FALSE(blas::detail::sgemm_small_rows(false, true, 1, n - 1, k, 1.0f, a.data(), k, b.data(),
                                              k, 0.0f, c.data(), n));
  EXPECT_TRUE(blas::detail::sgemm_small_rows(false, true, 1, n, k, 1.0f, a.data(), k, b.data(), k,
                                             0.0f, c.data(), n));
}
