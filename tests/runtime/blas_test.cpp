#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <thread>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/init.h"
#include "support/compare.h"

using namespace nxd;

namespace {
// Naive row-major reference in double: C = alpha op(A) op(B) + beta C.
Tensor reference(bool ta, bool tb, const Tensor& a, const Tensor& b, const Tensor& c, double alpha,
                 double beta) {
  int64_t m = c.size(0), n = c.size(1), k = ta ? a.size(0) : a.size(1);
  auto av = a.to_vector(), bv = b.to_vector(), cv = c.to_vector();
  std::vector<double> r(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += av[ta ? p * m + i : i * k + p] * bv[tb ? j * k + p : p * n + j];
      r[i * n + j] = alpha * s + beta * cv[i * n + j];
    }
  return from_doubles(r, {m, n}, DType::f64);
}

struct EngineGuard {
  blas::Engine prev = blas::engine();
  int threads = num_threads();
  ~EngineGuard() {
    blas::set_engine(prev);
    set_num_threads(threads);
  }
};
}  // namespace

TEST(Blas, EnginesAndThreadSplitsMatchTheReference) {
  EngineGuard guard;
  // Sizes above the split threshold (m*n*k >= 2^21) so the 2-thread path splits rows or columns,
  // with row counts that are not multiples of the 16-row blocks.
  const int64_t m = 150, n = 97, k = 300;
  for (auto engine : {blas::Engine::openblas, blas::Engine::eigen}) {
    blas::set_engine(engine);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (auto [mm, nn] : {std::pair<int64_t, int64_t>{m, n}, {n, m}}) {
            SCOPED_TRACE(str(blas::engine_name(engine), " threads=", threads, " ta=", ta,
                             " tb=", tb, " m=", mm, " n=", nn));
            Tensor a = empty(ta ? Shape{k, mm} : Shape{mm, k});
            Tensor b = empty(tb ? Shape{nn, k} : Shape{k, nn});
            Tensor c = empty({mm, nn});
            init::uniform(a, RngStream{1, 1}, -1, 1);
            init::uniform(b, RngStream{1, 2}, -1, 1);
            init::uniform(c, RngStream{1, 3}, -1, 1);
            Tensor expect = reference(ta, tb, a, b, c, 0.5, 0.25);
            blas::sgemm(ta, tb, mm, nn, k, 0.5f, a.data<float>(), a.size(1), b.data<float>(),
                        b.size(1), 0.25f, c.data<float>(), nn);
            EXPECT_CLOSE_REL(c, expect, 2e-6);
            // beta = 0 ignores whatever C held, NaN included
            c.fill_(std::nan(""));
            blas::sgemm(ta, tb, mm, nn, k, 1.0f, a.data<float>(), a.size(1), b.data<float>(),
                        b.size(1), 0.0f, c.data<float>(), nn);
            EXPECT_CLOSE_REL(c, reference(ta, tb, a, b, zeros({mm, nn}), 1.0, 0.0), 2e-6);
          }
    }
  }
}

TEST(Blas, ThreadSplitIsBitwiseRepeatable) {
  EngineGuard guard;
  blas::set_engine(blas::Engine::eigen);
  set_num_threads(2);
  Tensor a = empty({512, 256}), b = empty({256, 384});
  init::uniform(a, RngStream{2, 1}, -1, 1);
  init::uniform(b, RngStream{2, 2}, -1, 1);
  Tensor c1 = empty({512, 384}), c2 = empty({512, 384});
  for (Tensor* c : {&c1, &c2})
    blas::sgemm(false, false, 512, 384, 256, 1.0f, a.data<float>(), 256, b.data<float>(), 384, 0.0f,
                c->data<float>(), 384);
  EXPECT_BITWISE_EQ(c1, c2);
}

TEST(Blas, ThreadCountCanChangeAfterGemmsRan) {
  // Helpers created by a later resize must not replay jobs that ran before they existed.
  EngineGuard guard;
  blas::set_engine(blas::Engine::eigen);
  Tensor a = empty({256, 256}), b = empty({256, 256}), c = empty({256, 256});
  init::uniform(a, RngStream{3, 1}, -1, 1);
  init::uniform(b, RngStream{3, 2}, -1, 1);
  Tensor expect;
  for (int threads : {2, 1, 2, 1, 2}) {
    set_num_threads(threads);
    blas::sgemm(false, false, 256, 256, 256, 1.0f, a.data<float>(), 256, b.data<float>(), 256, 0.0f,
                c.data<float>(), 256);
    if (!expect.defined()) expect = c.clone();
    EXPECT_BITWISE_EQ(c, expect);
  }
}

namespace {
// Threads of this process (Linux: entries of /proc/self/task).
int process_threads() {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}
}  // namespace

TEST(Blas, OpenBlasPoolRunsOnlyWhileItIsUsed) {
  // OpenBLAS's idle workers busy-wait ~0.1 s; nxd keeps its pool stopped unless the f32 engine
  // is OpenBLAS with > 1 thread, and OpenBLAS restarts it on its next multi-threaded call.
  if (!dlsym(RTLD_DEFAULT, "blas_thread_shutdown_") || std::thread::hardware_concurrency() < 2 ||
      process_threads() < 0)
    GTEST_SKIP() << "needs the pthread build of OpenBLAS, 2+ CPUs and /proc";
  EngineGuard guard;
  const int64_t n = 512;  // big enough for OpenBLAS to use its threads
  Tensor a = empty({n, n}), b = empty({n, n}), c = empty({n, n}), c2 = empty({n, n});
  init::uniform(a, RngStream{4, 1}, -1, 1);
  init::uniform(b, RngStream{4, 2}, -1, 1);
  auto gemm = [&](Tensor& out) {
    blas::sgemm(false, false, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
                out.data<float>(), n);
  };
  blas::set_engine(blas::Engine::eigen);
  set_num_threads(2);  // nxd's pool: the caller + 1 helper; OpenBLAS's pool stopped
  const int without_pool = process_threads();
  blas::set_engine(blas::Engine::openblas);
  gemm(c);  // OpenBLAS starts its pool again (lazily) and uses it
  const int with_pool = process_threads();
  EXPECT_GT(with_pool, without_pool) << "OpenBLAS did not restart its pool";
  blas::set_engine(blas::Engine::eigen);
  set_num_threads(2);
  EXPECT_EQ(process_threads(), without_pool) << "set_threads with the Eigen engine left "
                                             << "OpenBLAS's pool running";
  blas::set_engine(blas::Engine::openblas);
  set_num_threads(2);
  gemm(c2);
  EXPECT_BITWISE_EQ(c2, c);
  EXPECT_EQ(process_threads(), with_pool);
  blas::stop_openblas_pool();
  EXPECT_EQ(process_threads(), without_pool);
  gemm(c2);  // still correct after a stop
  EXPECT_BITWISE_EQ(c2, c);
}

namespace {
struct SplitGuard {
  blas::GemmSplitOptions prev = blas::gemm_split();
  ~SplitGuard() { blas::set_gemm_split(prev); }
};
}  // namespace

TEST(Blas, GemmSplitThresholdRejectsNegativeWork) {
  SplitGuard guard;
  for (auto [o, needle] :
       {std::pair<blas::GemmSplitOptions, const char*>{{-1, 0}, "f32_min_work=-1"},
        {{0, -5}, "bf16_min_work=-5"}}) {
    try {
      blas::set_gemm_split(o);
      ADD_FAILURE() << "set_gemm_split did not throw for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(blas::gemm_split().f32_min_work, guard.prev.f32_min_work);
}

TEST(Blas, SplittingSmallProductsDoesNotChangeResults) {
  // Forcing the split (min work 0) on small products, as the attention and tiny-model shapes are,
  // gives bitwise the single-thread result: f32 splits by rows only (a product with fewer than 16
  // rows per part stays whole); the bf16 precision's AMX / AVX512-BF16 kernels split by rows or
  // columns, and the portable one is the f32 engine.
  EngineGuard guard;
  SplitGuard split;
  blas::set_engine(blas::Engine::eigen);
  struct Shape3 {
    int64_t m, n, k;
  };
  for (auto precision : {blas::MatmulPrecision::fp32, blas::MatmulPrecision::bf16}) {
    blas::MatmulPrecisionScope scope(precision);
    for (Shape3 s : {Shape3{128, 128, 64}, Shape3{128, 64, 128}, Shape3{50, 33, 70},
                     Shape3{33, 50, 70}, Shape3{100, 301, 400}, Shape3{256, 768, 1024},
                     Shape3{8, 300, 64}, Shape3{47, 200, 96}, Shape3{97, 64, 300}}) {
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          SCOPED_TRACE(str(blas::matmul_precision_name(precision), " m=", s.m, " n=", s.n,
                           " k=", s.k, " ta=", ta, " tb=", tb));
          Tensor a = empty(ta ? Shape{s.k, s.m} : Shape{s.m, s.k});
          Tensor b = empty(tb ? Shape{s.n, s.k} : Shape{s.k, s.n});
          init::uniform(a, RngStream{4, 1}, -1, 1);
          init::uniform(b, RngStream{4, 2}, -1, 1);
          Tensor expect;
          for (int threads : {1, 2}) {
            set_num_threads(threads);
            blas::set_gemm_split({0, 0});
            Tensor c = empty({s.m, s.n});
            blas::sgemm(ta, tb, s.m, s.n, s.k, 1.0f, a.data<float>(), a.size(1), b.data<float>(),
                        b.size(1), 0.0f, c.data<float>(), s.n);
            if (!expect.defined())
              expect = c;
            else
              EXPECT_BITWISE_EQ(c, expect);
          }
        }
    }
  }
}
