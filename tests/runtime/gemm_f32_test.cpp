// The f32 GEMM split by rows with op(B) packed once, or by columns in whole panels of op(B)
// (runtime/gemm_f32.h), gives bitwise Eigen's unsplit product, for every transposition, part
// count, chunking of op(B)'s columns, alpha and beta,
// ragged shapes (tails of Eigen's mr-row panels, nr-row groups and K blocks) and the serving
// prefill shapes (a 64-512 token chunk against a linear layer's weight, op(B) = Bᵀ); also wherever
// the operands lie, and through blas::sgemm at 1, 2 and 3 threads.
#include <gtest/gtest.h>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/gemm_f32.h"
#include "nxd/runtime/init.h"
#include "support/compare.h"

using namespace nxd;

namespace {

// n floats uniform in [-1, 1), from nxd's counter-based RNG.
std::vector<float> values(size_t n, uint64_t stream) {
  Tensor t = empty({static_cast<int64_t>(n)});
  init::uniform(t, RngStream{7, stream}, -1, 1);
  return {t.data<float>(), t.data<float>() + n};
}

struct Shape3 {
  int64_t m, n, k;
};

// One product's operands (leading dimensions a few floats wider than the rows), placed `shift`
// floats into their buffers.
struct Operands {
  bool ta, tb;
  Shape3 s;
  int64_t lda, ldb, ldc;
  std::vector<float> a, b, c0;
  Operands(bool ta_, bool tb_, Shape3 s_) : ta(ta_), tb(tb_), s(s_) {
    lda = (ta ? s.m : s.k) + 3;
    ldb = (tb ? s.k : s.n) + 5;
    ldc = s.n + 2;
    a = values(static_cast<size_t>((ta ? s.k : s.m) * lda + 16), 1);
    b = values(static_cast<size_t>((tb ? s.n : s.k) * ldb + 16), 2);
    c0 = values(static_cast<size_t>(s.m * ldc + 16), 3);
  }
  // C = alpha op(A) op(B) + beta C0 with the operands `shift` floats into fresh copies: Eigen's
  // product (split == nullptr) or the split one.
  std::vector<float> run(float alpha, float beta, const blas::detail::EigenSplitOptions* split,
                         int shift) const {
    std::vector<float> sa(a.size() + 16), sb(b.size() + 16), sc(c0.size() + 16);
    std::copy(a.begin(), a.end(), sa.begin() + shift);
    std::copy(b.begin(), b.end(), sb.begin() + shift);
    std::copy(c0.begin(), c0.end(), sc.begin() + shift);
    if (split == nullptr)
      blas::detail::sgemm_eigen(ta, tb, s.m, s.n, s.k, alpha, sa.data() + shift, lda,
                                sb.data() + shift, ldb, beta, sc.data() + shift, ldc);
    else
      blas::detail::sgemm_eigen_split(ta, tb, s.m, s.n, s.k, alpha, sa.data() + shift, lda,
                                      sb.data() + shift, ldb, beta, sc.data() + shift, ldc, *split);
    return {sc.begin() + shift, sc.begin() + shift + static_cast<int64_t>(c0.size())};
  }
};

// Counts the elements whose bits differ and the largest difference among them.
void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  int64_t differ = 0;
  double largest = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ++differ;
      largest = std::max(largest, std::fabs(double(got[i]) - double(want[i])));
    }
  EXPECT_EQ(differ, 0) << "elements differing from Eigen's unsplit product; largest difference "
                       << largest;
}

struct ThreadsGuard {
  int threads = num_threads();
  blas::Engine engine = blas::engine();
  blas::GemmSplitOptions split = blas::gemm_split();
  ~ThreadsGuard() {
    set_num_threads(threads);
    blas::set_engine(engine);
    blas::set_gemm_split(split);
  }
};

}  // namespace

using blas::detail::EigenSplitOptions;
using blas::detail::SplitBy;
const char* name(SplitBy by) {
  return by == SplitBy::rows ? "rows" : "columns";
}

TEST(GemmF32Split, EveryPartCountAndChunkingIsBitwiseEigensProduct) {
  ThreadsGuard guard;
  set_num_threads(2);
  // Ragged shapes: m not a multiple of 16, n with every kind of panel tail, k below, at and
  // above Eigen's K block (with a ragged last block), and tiny K.
  for (Shape3 s :
       {Shape3{100, 301, 400}, Shape3{150, 97, 300}, Shape3{64, 1000, 1100}, Shape3{97, 64, 8},
        Shape3{48, 2, 33}, Shape3{33, 50, 70}, Shape3{70, 7, 700}, Shape3{16, 2, 2}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Operands op(ta, tb, s);
        for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 0.25f}}) {
          const std::vector<float> want = op.run(alpha, beta, nullptr, 0);
          for (SplitBy by : {SplitBy::rows, SplitBy::columns})
            for (int parts : {1, 2, 3, 4}) {
              if (by == SplitBy::rows && s.m < 16 * parts) continue;
              for (int64_t max_packed : {int64_t{1} << 22, s.k * 100}) {
                SCOPED_TRACE(str("m=", s.m, " n=", s.n, " k=", s.k, " ta=", ta, " tb=", tb,
                                 " beta=", beta, " by=", name(by), " parts=", parts,
                                 " max_packed=", max_packed));
                const EigenSplitOptions o{
                    .parts = parts, .by = by, .max_packed_floats = max_packed};
                expect_bitwise(op.run(alpha, beta, &o, 0), want);
              }
            }
        }
      }
}

TEST(GemmF32Split, ServingPrefillShapesAreBitwiseEigensProduct) {
  // A prefill chunk of 64-512 tokens against the 125M Llama's linear layers (op(B) = Bᵀ).
  ThreadsGuard guard;
  set_num_threads(2);
  for (Shape3 s : {Shape3{64, 768, 768}, Shape3{64, 3072, 768}, Shape3{64, 768, 3072},
                   Shape3{512, 768, 768}, Shape3{512, 2048, 768}}) {
    const Operands op(false, true, s);
    const std::vector<float> want = op.run(1.0f, 0.0f, nullptr, 0);
    for (SplitBy by : {SplitBy::rows, SplitBy::columns})
      for (int parts : {2, 3}) {
        SCOPED_TRACE(str("m=", s.m, " n=", s.n, " k=", s.k, " by=", name(by), " parts=", parts));
        const EigenSplitOptions o{.parts = parts, .by = by};
        expect_bitwise(op.run(1.0f, 0.0f, &o, 0), want);
      }
  }
}

TEST(GemmF32Split, OperandAddressesDoNotChangeTheBits) {
  ThreadsGuard guard;
  set_num_threads(2);
  const Operands op(false, true, Shape3{96, 200, 300});
  const std::vector<float> want = op.run(1.0f, 0.0f, nullptr, 0);
  for (int shift : {1, 2, 3, 5, 8})
    for (SplitBy by : {SplitBy::rows, SplitBy::columns}) {
      SCOPED_TRACE(str("shift=", shift, " floats, by=", name(by)));
      const EigenSplitOptions o{.parts = 2, .by = by};
      expect_bitwise(op.run(1.0f, 0.0f, &o, shift), want);
      expect_bitwise(op.run(1.0f, 0.0f, nullptr, shift), want);
    }
}

TEST(GemmF32Split, SgemmIsBitwiseTheSameAtOneTwoAndThreeThreads) {
  // blas::sgemm splits above its work threshold (forced here); every thread count must give the
  // single-thread bits.
  ThreadsGuard guard;
  blas::set_engine(blas::Engine::eigen);
  blas::set_gemm_split({0, 0});
  // By columns (n >= m) and by rows.
  for (Shape3 s : {Shape3{64, 768, 768}, Shape3{200, 130, 257}}) {
    const Operands op(false, true, s);
    std::vector<float> want;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      std::vector<float> c = op.c0;
      blas::sgemm(false, true, s.m, s.n, s.k, 1.0f, op.a.data(), op.lda, op.b.data(), op.ldb, 0.0f,
                  c.data(), op.ldc);
      SCOPED_TRACE(str("m=", s.m, " n=", s.n, " k=", s.k, " threads=", threads));
      if (want.empty())
        want = c;
      else
        expect_bitwise(c, want);
    }
  }
}

TEST(GemmF32Split, RejectsPartsTooSmall) {
  std::vector<float> a(64 * 8), b(8 * 8), c(64 * 8);
  EXPECT_THROW(blas::detail::sgemm_eigen_split(false, false, 20, 8, 8, 1.0f, a.data(), 8, b.data(),
                                               8, 0.0f, c.data(), 8, {.parts = 2}),
               InvalidArgument);
  EXPECT_THROW(
      blas::detail::sgemm_eigen_split(false, false, 8, 8, 8, 1.0f, a.data(), 8, b.data(), 8, 0.0f,
                                      c.data(), 8, {.parts = 2, .by = SplitBy::columns}),
      InvalidArgument);
}

// Eigen's kc (the K block of every f32 product, so the order of its sums) follows the L1 size
// Eigen plans with. blas.cpp pins it before any product, so a CPU that reports another L1 (48 KiB
// on Zen 5 and recent Intel) blocks K as this one does and the build gives it the same bits.
TEST(GemmF32Blocking, EigenPlansWithThePinnedL1WhateverTheCpuReports) {
  std::vector<float> a(64 * 4096, 0.5f), b(4096 * 8, 0.25f), c(64 * 8);
  blas::sgemm(false, false, 64, 8, 4096, 1.0f, a.data(), 4096, b.data(), 8, 0.0f, c.data(), 8);
  EXPECT_EQ(Eigen::l1CacheSize(), blas::detail::kEigenL1Bytes);
  std::printf("    Eigen plans with L1 %td, L2 %td, L3 %td bytes\n", Eigen::l1CacheSize(),
              Eigen::l2CacheSize(), Eigen::l3CacheSize());
}
