#include "nxd/runtime/blas.h"

#include <cblas.h>

#include <Eigen/Core>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "nxd/runtime/error.h"

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

// A fixed pool of helper threads that sleep on a condition variable between jobs. run() executes
// part 0 on the caller and parts 1..n-1 on helpers, and returns when all are done. Calls are
// serialized: concurrent callers (sim ranks) run single-threaded and never get here.
class Pool {
 public:
  ~Pool() { resize(0); }
  void resize(int helpers) {
    std::lock_guard run_lock(run_mu_);
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    stop_ = false;
    // New helpers start at the current generation: jobs that ran before they existed are not
    // theirs to run.
    const uint64_t start = generation_;
    for (int i = 0; i < helpers; ++i)
      workers_.emplace_back([this, i, start] { loop(i + 1, start); });
  }
  int helpers() const { return static_cast<int>(workers_.size()); }
  void run(int parts, const std::function<void(int)>& fn) {
    std::lock_guard run_lock(run_mu_);
    {
      std::lock_guard lk(mu_);
      fn_ = &fn;
      parts_ = parts;
      pending_ = parts - 1;
      ++generation_;
    }
    cv_.notify_all();
    fn(0);
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void loop(int id, uint64_t seen) {
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= parts_) continue;
      const auto* fn = fn_;
      lk.unlock();
      (*fn)(id);
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
  std::mutex run_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* fn_ = nullptr;
  int parts_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: helpers must not be joined during exit
  return *p;
}

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
  if (t > 1 && pool().helpers() > 0 && m * n * k >= (int64_t{1} << 20) * t) {
    bool by_rows = m >= n;
    int64_t len = by_rows ? m : n;
    int parts = static_cast<int>(std::min<int64_t>(t, std::max<int64_t>(1, len / 16)));
    if (parts > 1) {
      // Blocks are multiples of 16 rows/cols so every part keeps full SIMD panels.
      int64_t block = ((len + parts - 1) / parts + 15) / 16 * 16;
      pool().run(parts, [&](int p) {
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
  if (pool().helpers() != n - 1) pool().resize(n - 1);
  g_threads = n;
}

int threads() {
  return g_threads.load();
}

}  // namespace nxd::blas
