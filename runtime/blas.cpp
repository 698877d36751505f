#include "nxd/runtime/blas.h"

#include <cblas.h>

#include <Eigen/Core>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "nxd/runtime/error.h"
#include "nxd/runtime/parallel.h"

namespace nxd::blas {

namespace {

#if defined(__AVX512F__)
constexpr Engine kDefaultEngine = Engine::eigen;
#else
constexpr Engine kDefaultEngine = Engine::openblas;
#endif

Engine initial_engine() {
  if (const char* e = std::getenv("NXD_GEMM")) {
    if (std::strcmp(e, "openblas") == 0) return Engine::openblas;
    if (std::strcmp(e, "eigen") == 0) return Engine::eigen;
  }
  return kDefaultEngine;
}
std::atomic<Engine> g_engine{initial_engine()};
std::atomic<int> g_threads{1};

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class A, class B>
void eigen_product(Map& c, const A& a, const B& b, float alpha, float beta) {
  if (beta == 0.0f) {
    c.noalias() = alpha * (a * b);
  } else {
    if (beta != 1.0f) c *= beta;
    c.noalias() += alpha * (a * b);
  }
}

void eigen_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  Map cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (beta == 0.0f)
      cm.setZero();
    else
      cm *= beta;
    return;
  }
  ConstMap am(a, ta ? k : m, ta ? m : k, Eigen::OuterStride<>(lda));
  ConstMap bm(b, tb ? n : k, tb ? k : n, Eigen::OuterStride<>(ldb));
  if (!ta && !tb)
    eigen_product(cm, am, bm, alpha, beta);
  else if (!ta && tb)
    eigen_product(cm, am, bm.transpose(), alpha, beta);
  else if (ta && !tb)
    eigen_product(cm, am.transpose(), bm, alpha, beta);
  else
    eigen_product(cm, am.transpose(), bm.transpose(), alpha, beta);
}

}  // namespace

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (g_engine.load(std::memory_order_relaxed) == Engine::openblas) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
                static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                static_cast<blasint>(ldc));
    return;
  }
  int t = g_threads.load(std::memory_order_relaxed);
  // Split only products big enough to amortize a wake-up (~2 MFLOP per part).
  if (t > 1 && parallel::threads() > 1 && !parallel::in_parallel_region() &&
      m * n * k >= (int64_t{1} << 20) * t) {
    bool by_rows = m >= n;
    int64_t len = by_rows ? m : n;
    int parts = static_cast<int>(std::min<int64_t>(t, std::max<int64_t>(1, len / 16)));
    if (parts > 1) {
      // Blocks are multiples of 16 rows/cols so every part keeps full SIMD panels.
      int64_t block = ((len + parts - 1) / parts + 15) / 16 * 16;
      parallel::run(parts, [&](int p) {
        int64_t s = p * block, e = std::min(len, s + block);
        if (s >= e) return;
        if (by_rows)
          eigen_sgemm(ta, tb, e - s, n, k, alpha, ta ? a + s : a + s * lda, lda, b, ldb, beta,
                      c + s * ldc, ldc);
        else
          eigen_sgemm(ta, tb, m, e - s, k, alpha, a, lda, tb ? b + s * ldb : b + s, ldb, beta,
                      c + s, ldc);
      });
      return;
    }
  }
  eigen_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void dgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
           int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

Engine engine() {
  return g_engine.load();
}
void set_engine(Engine e) {
  g_engine = e;
}
const char* engine_name(Engine e) {
  return e == Engine::eigen ? "eigen" : "openblas";
}

void set_threads(int n) {
  NXD_CHECK(n >= 1, "[blas::set_threads] need n >= 1, got ", n);
  openblas_set_num_threads(n);
  Eigen::setNbThreads(1);  // Eigen's own threading (OpenMP) is never used
  parallel::resize(n);
  g_threads = n;
}

int threads() {
  return g_threads.load();
}

}  // namespace nxd::blas
