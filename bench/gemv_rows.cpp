// nxd-bench-gemv-rows: the f32 products of a decode step with one row per running sequence
// (blas::sgemm, C[m, n] = X[m, k] @ W[n, k]^T: up to blas::detail::kSmallRows rows the few-rows
// kernel of runtime/gemv_f32.cpp, above it the general GEMM) against raw cblas_sgemm on the same
// operands and thread count, for m = 1, 4, 8, 16, 32 rows (--rows) on the shapes of the ~125M
// Llama the serving bench uses (768x768, 1280x768 (q, k, v), 2048x768, 768x2048, the 32000x768
// output head). A decode step reads every weight once from memory, so each function cycles
// through enough copies of its weight (>= 256 MiB together) that no call finds it in cache.
// Timed in rotating blocks (bench_util.h); at more than one thread OpenBLAS's pool is stopped
// after every block, outside the timed region (its idle worker would busy-wait into nxd's
// block). One line per shape and row count, then one per row count for the whole step (each
// shape's median times its count in 12 layers, plus the head):
//   gemv_rows m=16 n=2048 k=768 threads=2 nxd_us=... blas_us=... ratio=... cpu_ratio=...
//          nxd_gflops=... nxd_cpu_gflops=... nxd_GBps=... reps=...
//   gemv_rows_step m=16 threads=2 nxd_ms=... blas_ms=... ratio=...
// (us: median wall microseconds per call; ratio = blas_us / nxd_us, above 1 when nxd is faster;
// cpu_ratio and nxd_cpu_gflops from the median process CPU time per call, all threads: the better
// estimates on a loaded machine; GBps: weight bytes read per second.) Flags: --threads N,
// --rows LIST, --quick.
#include <cblas.h>

#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/cpu_info.h"

using namespace nxd;

namespace {

constexpr int64_t kColdBytes = int64_t{256} << 20;

struct Shape {
  int64_t n, k, per_step;  // per_step: products of this shape in one decode step
};
// 12 layers: q, k, v as one 1280x768 product, o 768x768, gate and up 2048x768, down 768x2048;
// then the head.
const Shape kShapes[] = {
    {1280, 768, 12}, {768, 768, 12}, {2048, 768, 24}, {768, 2048, 12}, {32000, 768, 1}};

std::vector<std::vector<float>> copies_of(int64_t n, int64_t k) {
  const int64_t count = std::max<int64_t>(2, kColdBytes / (4 * n * k));
  std::vector<std::vector<float>> r(static_cast<size_t>(count));
  for (auto& v : r) {
    v.resize(static_cast<size_t>(n * k));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * static_cast<float>((i * 37 + 11) % 251);
  }
  return r;
}

void stop_pool() {
  blas::stop_openblas_pool();
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv, "decode-step f32 products of m rows (nxd vs raw cblas_sgemm)",
                   {{"--threads", "N", "compute threads (nxd::set_num_threads)"},
                    {"--rows", "LIST", "row counts, comma separated (default 1,4,8,16,32)"},
                    {"--quick", "", "fewer repetitions"}});
  const int threads = static_cast<int>(args.get_int("--threads", 1, 1, 256));
  const std::vector<int64_t> rows = args.get_int_list("--rows", "1,4,8,16,32", 1, 4096);
  set_num_threads(threads);
  std::printf("# %s\n", cpu::describe().c_str());
  const bench::TimerOptions to =
      bench::decode_kernel_timer(args.has("--quick"), threads > 1 ? stop_pool : nullptr);
  std::vector<double> step_nxd(rows.size()), step_blas(rows.size());
  for (const Shape& s : kShapes) {
    const auto w = copies_of(s.n, s.k);
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const int64_t m = rows[ri];
      std::vector<float> x(static_cast<size_t>(m * s.k)), c(static_cast<size_t>(m * s.n));
      for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
      size_t next_nxd = 0, next_blas = 0;
      std::function<void()> nxd_fn = [&] {
        blas::sgemm(false, true, m, s.n, s.k, 1.0f, x.data(), s.k, w[next_nxd++ % w.size()].data(),
                    s.k, 0.0f, c.data(), s.n);
      };
      std::function<void()> blas_fn = [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
                    static_cast<blasint>(s.n), static_cast<blasint>(s.k), 1.0f, x.data(),
                    static_cast<blasint>(s.k), w[next_blas++ % w.size()].data(),
                    static_cast<blasint>(s.k), 0.0f, c.data(), static_cast<blasint>(s.n));
      };
      const auto t = bench::time_rotation<2>({nxd_fn, blas_fn}, to);
      const double flops = 2.0 * static_cast<double>(m * s.n * s.k);
      const double bytes = 4.0 * static_cast<double>(s.n * s.k);
      std::printf(
          "gemv_rows m=%lld n=%lld k=%lld threads=%d nxd_us=%.1f blas_us=%.1f ratio=%.2f "
          "cpu_ratio=%.2f nxd_gflops=%.1f nxd_cpu_gflops=%.1f nxd_GBps=%.2f reps=%d\n",
          static_cast<long long>(m), static_cast<long long>(s.n), static_cast<long long>(s.k),
          threads, t[0].median * 1e6, t[1].median * 1e6, t[1].median / t[0].median,
          t[1].cpu_median / t[0].cpu_median, flops / t[0].median * 1e-9,
          flops / t[0].cpu_median * 1e-9, bytes / t[0].median * 1e-9, t[0].reps);
      std::fflush(stdout);
      step_nxd[ri] += static_cast<double>(s.per_step) * t[0].median;
      step_blas[ri] += static_cast<double>(s.per_step) * t[1].median;
    }
  }
  for (size_t ri = 0; ri < rows.size(); ++ri)
    std::printf("gemv_rows_step m=%lld threads=%d nxd_ms=%.2f blas_ms=%.2f ratio=%.2f\n",
                static_cast<long long>(rows[ri]), threads, step_nxd[ri] * 1e3, step_blas[ri] * 1e3,
                step_blas[ri] / step_nxd[ri]);
  return 0;
}
