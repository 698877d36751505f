#include "nxd/runtime/blas.h"

#include <cblas.h>
#include <dlfcn.h>

#include <Eigen/Core>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nxd/runtime/dtype.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/gemm_bf16.h"
#include "nxd/runtime/gemm_f32.h"
#include "nxd/runtime/gemv_f32.h"
#include "nxd/runtime/kernels/parallel_rows.h"
#include "nxd/runtime/parallel.h"

namespace nxd::blas {

namespace {

// nxd's engine on every CPU: its results do not depend on the thread count, the operands'
// addresses or the run (blas.h). OpenBLAS's threaded sgemm gives none of these guarantees.
constexpr Engine kDefaultEngine = Engine::eigen;

// Eigen blocks K by kc, a function of K and of the L1 data cache size it reads from CPUID, so one
// binary would sum a long dot product in other blocks, and round it otherwise, on a CPU with
// another L1 (48 KiB on Zen 5 and Intel since Ice Lake, 32 KiB on Zen 2-4 and older Intel). The
// L1 size Eigen plans with is pinned to 32 KiB before any product: kc then depends on K alone and
// a build gives the same bits on every CPU of its instruction set. L2 and L3 stay as detected:
// they set only how the output is tiled (mc, nc), never the order of a sum.
[[maybe_unused]] const bool g_eigen_l1_pinned = [] {
  Eigen::setCpuCacheSizes(detail::kEigenL1Bytes, Eigen::l2CacheSize(), Eigen::l3CacheSize());
  return true;
}();

Engine initial_engine() {
  if (const char* e = std::getenv("NXD_GEMM")) {
    if (std::strcmp(e, "openblas") == 0) return Engine::openblas;
    if (std::strcmp(e, "eigen") == 0) return Engine::eigen;
  }
  return kDefaultEngine;
}
std::atomic<Engine> g_engine{initial_engine()};
std::atomic<int> g_threads{1};
std::atomic<int64_t> g_f32_split_min{GemmSplitOptions{}.f32_min_work};
std::atomic<int64_t> g_bf16_split_min{GemmSplitOptions{}.bf16_min_work};

// The pthread build of OpenBLAS starts a pool of workers when the library loads and whenever
// openblas_set_num_threads is called, and an idle worker busy-waits (sched_yield in a loop) for
// ~2^28 cycles, about 0.1 s, before it sleeps. On a 2-core machine that third running thread
// halved the speed of the two sim ranks (a 2-rank 1 MiB all-reduce ran at half speed until it
// stopped). So nxd stops the pool whenever it is not about to be used (see blas.h). Looked up at
// run time: other BLAS builds (serial, OpenMP) may not have it.
using ShutdownFn = int (*)();
ShutdownFn openblas_shutdown() {
  static const auto f = reinterpret_cast<ShutdownFn>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
  return f;
}
// At load, before anything sets the thread count.
const bool g_openblas_pool_stopped_at_load = [] {
  if (ShutdownFn f = openblas_shutdown()) f();
  return true;
}();

// The f32 product on the current engine; split over the pool when each part keeps at least
// min_work multiply-adds (GemmSplitOptions).
void sgemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
               int64_t min_work) {
  if (g_engine.load(std::memory_order_relaxed) == Engine::openblas) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
                static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
                static_cast<blasint>(ldc));
    return;
  }
  if (m <= detail::kSmallRows && n * k >= detail::kSmallRowsMinB &&
      detail::sgemm_small_rows(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
    return;
  int t = g_threads.load(std::memory_order_relaxed);
  // Split only products big enough to amortize a wake-up (GemmSplitOptions).
  if (t > 1 && parallel::threads() > 1 && !parallel::in_parallel_region() &&
      m * n * k / t >= min_work) {
    // Never packing op(B) once per part (gemm_f32.h): by columns in whole panels of op(B) when C
    // has at least twice as many columns as rows (a prefill chunk against a linear layer's
    // weight: each part packs its share of the weight and all of the few rows, one fork), else
    // by rows (every part a multiple of 16 rows but the last, which takes the rest), op(B) packed
    // once for all parts. Each element is computed as in the unsplit product; products with
    // fewer than 16 rows (16 per part by rows) stay whole.
    if (m >= 16 && n >= 2 && k >= 1) {
      detail::EigenSplitOptions o;
      const int64_t panels = (n + detail::kEigenMr - 1) / detail::kEigenMr;
      o.by = n >= 2 * m && panels >= 2 ? detail::SplitBy::columns : detail::SplitBy::rows;
      o.parts = static_cast<int>(
          std::min<int64_t>(t, o.by == detail::SplitBy::columns ? panels : m / 16));
      if (o.parts > 1) {
        detail::sgemm_eigen_split(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, o);
        return;
      }
    }
  }
  detail::sgemm_eigen(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

std::atomic<MatmulPrecision> g_precision{MatmulPrecision::fp32};

// AMX where it exists. Without AMX the portable kernel (round, then the f32 engine) is the
// default: on an AVX512-BF16 machine without AMX (this project's 2-vCPU Xeon VM) it measured
// 0.85-0.93x the f32 path against 0.56-0.77x for the avx512_bf16 kernel (VDPBF16PS runs at the
// f32 FMA rate there, and the packing costs the rest; docs/design/runtime.md "Matmul precision").
// NXD_BF16_KERNEL=avx512_bf16 still selects it.
Bf16Kernel best_bf16_kernel() {
  if (bf16_kernel_available(Bf16Kernel::amx)) return Bf16Kernel::amx;
  return Bf16Kernel::portable;
}

void check_available(Bf16Kernel k, const char* where) {
  NXD_CHECK(bf16_kernel_available(k), where, " bf16 kernel ", bf16_kernel_name(k),
            " is not available on this machine (cpuid or OS permission); available: ",
            bf16_kernel_available(Bf16Kernel::amx) ? "amx, " : "",
            bf16_kernel_available(Bf16Kernel::avx512_bf16) ? "avx512_bf16, " : "", "portable");
}

// The default: the best available kernel, or the one NXD_BF16_KERNEL names (which must exist).
Bf16Kernel initial_bf16_kernel() {
  const char* e = std::getenv("NXD_BF16_KERNEL");
  if (e == nullptr || *e == 0) return best_bf16_kernel();
  for (Bf16Kernel k : {Bf16Kernel::amx, Bf16Kernel::avx512_bf16, Bf16Kernel::portable}) {
    if (std::strcmp(e, bf16_kernel_name(k)) == 0) {
      check_available(k, "[blas] NXD_BF16_KERNEL:");
      return k;
    }
  }
  NXD_CHECK(false, "[blas] NXD_BF16_KERNEL=", e, ": expected amx, avx512_bf16 or portable");
  return Bf16Kernel::portable;
}
constexpr int kUnresolved = -1;
std::atomic<int> g_bf16_kernel{kUnresolved};

// x rounded to the nearest bf16 (ties to even; NaN stays a quiet NaN), as an f32: bitwise
// bf16::to_f32(bf16::from_f32(x)), written without branches so a loop over it vectorizes.
inline float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const uint32_t quiet = (u | 0x00400000u) & 0xffff0000u;
  const uint32_t r = nan ? quiet : rounded;
  float f;
  std::memcpy(&f, &r, 4);
  return f;
}

// Rounds a rows x cols operand (leading dimension ld) to bf16 values, stored compactly as f32.
// Rows are independent, so they run over the compute pool (kernels::for_rows) without changing
// any value.
void round_to_bf16(std::vector<float>& dst, const float* src, int64_t rows, int64_t cols,
                   int64_t ld) {
  if (dst.size() < static_cast<size_t>(rows * cols)) dst.resize(static_cast<size_t>(rows * cols));
  float* d = dst.data();
  kernels::for_rows(rows, cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* __restrict dr = d + r * cols;
      const float* __restrict sr = src + r * ld;
      for (int64_t j = 0; j < cols; ++j) dr[j] = round_bf16(sr[j]);
    }
  });
}

// The portable bf16 kernel: round both operands, then the f32 engine on the rounded copies.
void sgemm_bf16_portable(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                         float* c, int64_t ldc) {
  thread_local std::vector<float> ra, rb;
  const int64_t a_cols = ta ? m : k, b_cols = tb ? k : n;
  round_to_bf16(ra, a, ta ? k : m, a_cols, lda);
  round_to_bf16(rb, b, tb ? n : k, b_cols, ldb);
  sgemm_f32(ta, tb, m, n, k, alpha, ra.data(), a_cols, rb.data(), b_cols, beta, c, ldc,
            g_bf16_split_min.load(std::memory_order_relaxed));
}

}  // namespace

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || g_precision.load(std::memory_order_relaxed) == MatmulPrecision::fp32) {
    sgemm_f32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
              g_f32_split_min.load(std::memory_order_relaxed));
    return;
  }
  const Bf16Kernel kernel = bf16_kernel();
  if (kernel == Bf16Kernel::portable)
    sgemm_bf16_portable(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    detail::gemm_bf16_x86(kernel, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                          g_threads.load(std::memory_order_relaxed));
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
  if (n == 1 || g_engine.load() != Engine::openblas) stop_openblas_pool();
  Eigen::setNbThreads(1);  // Eigen's own threading (OpenMP) is never used
  parallel::resize(n);
  g_threads = n;
}

int threads() {
  return g_threads.load();
}

GemmSplitOptions gemm_split() {
  return {g_f32_split_min.load(), g_bf16_split_min.load()};
}
void set_gemm_split(const GemmSplitOptions& o) {
  NXD_CHECK(o.f32_min_work >= 0 && o.bf16_min_work >= 0,
            "[blas::set_gemm_split] min work must be >= 0, got f32_min_work=", o.f32_min_work,
            " bf16_min_work=", o.bf16_min_work);
  g_f32_split_min = o.f32_min_work;
  g_bf16_split_min = o.bf16_min_work;
}

void stop_openblas_pool() {
  if (ShutdownFn f = openblas_shutdown()) f();
}

void set_matmul_precision(MatmulPrecision p) {
  g_precision = p;
}
MatmulPrecision matmul_precision() {
  return g_precision.load();
}
const char* matmul_precision_name(MatmulPrecision p) {
  return p == MatmulPrecision::bf16 ? "bf16" : "fp32";
}
std::optional<MatmulPrecision> parse_matmul_precision(std::string_view s) {
  if (s == "fp32" || s == "f32" || s == "float32" || s == "highest") return MatmulPrecision::fp32;
  if (s == "bf16" || s == "medium") return MatmulPrecision::bf16;
  return std::nullopt;
}

Bf16Kernel bf16_kernel() {
  int v = g_bf16_kernel.load();
  if (v == kUnresolved) {
    int expected = kUnresolved;
    g_bf16_kernel.compare_exchange_strong(expected, static_cast<int>(initial_bf16_kernel()));
    v = g_bf16_kernel.load();
  }
  return static_cast<Bf16Kernel>(v);
}
namespace detail {
std::atomic<unsigned> g_hidden_kernels{0};
void hide_bf16_kernel_for_testing(Bf16Kernel k, bool hidden) {
  const unsigned bit = 1u << static_cast<int>(k);
  if (hidden)
    g_hidden_kernels |= bit;
  else
    g_hidden_kernels &= ~bit;
}
}  // namespace detail

bool bf16_kernel_available(Bf16Kernel k) {
  if (detail::g_hidden_kernels.load() & (1u << static_cast<int>(k))) return false;
  switch (k) {
    case Bf16Kernel::amx:
      return detail::cpu_has_amx_bf16();
    case Bf16Kernel::avx512_bf16:
      return detail::cpu_has_avx512_bf16();
    case Bf16Kernel::portable:
      return true;
  }
  return false;
}
void set_bf16_kernel(Bf16Kernel k) {
  check_available(k, "[blas::set_bf16_kernel]");
  g_bf16_kernel = static_cast<int>(k);
}
const char* bf16_kernel_name(Bf16Kernel k) {
  switch (k) {
    case Bf16Kernel::amx:
      return "amx";
    case Bf16Kernel::avx512_bf16:
      return "avx512_bf16";
    case Bf16Kernel::portable:
      return "portable";
  }
  return "?";
}

}  // namespace nxd::blas
