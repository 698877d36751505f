// nxd-bench-gemv-bf16-rows: the bf16 products of a decode step with one row per running sequence
// (kernels::bmm of bf16 X [m, k] against a bf16 weight W [n, k] viewed as W^T: up to 32 rows the
// few-rows kernel of runtime/kernels/gemv_bf16.cpp, which widens a few rows of W at a time and
// runs the f32 few-rows tiles on them) against, in the same run and on the same shapes, the
// block path a prefill takes (gemm_bf16_weight_blocks: W widened in blocks, then the bf16 GEMM
// kernel), which the decode rows above 8 took before, and raw cblas_sgemm on f32 copies (twice
// the weight bytes). Shapes: the ~125M Llama of nxd-bench-gemv-rows (768x768, 1280x768,
// 2048x768, 768x2048, the 32000x768 head); each function cycles through enough copies of its
// weight (>= 256 MiB together) that no call finds it in cache. One line per shape and row count,
// then one per row count for the whole step (12 layers plus the head):
//   gemv_bf16_rows m=16 n=2048 k=768 threads=2 nxd_us=... blocks_us=... blas_f32_us=...
//          vs_blocks=... vs_blas=... nxd_GBps=... reps=...
//   gemv_bf16_rows_step m=16 threads=2 nxd_ms=... blocks_ms=... blas_f32_ms=... vs_blocks=...
//          vs_blas=...
// (us: median wall microseconds per call; vs_X = X's time / nxd's, above 1 when nxd is faster;
// GBps: bf16 weight bytes read per second.) Flags: --threads N, --rows LIST, --quick.
#include <cblas.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/cpu_info.h"
#include "nxd/runtime/kernels/gemv_bf16.h"
#include "nxd/runtime/kernels/matmul.h"

using namespace nxd;

namespace {

constexpr int64_t kColdBytes = int64_t{256} << 20;

struct LayerShape {
  int64_t n, k, per_step;
};
const LayerShape kShapes[] = {
    {1280, 768, 12}, {768, 768, 12}, {2048, 768, 24}, {768, 2048, 12}, {32000, 768, 1}};

// Enough copies of an [n, k] weight in `dt` to exceed kColdBytes together.
std::vector<Tensor> copies_of(int64_t n, int64_t k, DType dt) {
  const int64_t count = std::max<int64_t>(2, kColdBytes / (dtype_size(dt) * n * k));
  std::vector<Tensor> r;
  std::vector<float> v(static_cast<size_t>(n * k));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * static_cast<float>((i * 37 + 11) % 251);
  for (int64_t i = 0; i < count; ++i) r.push_back(from_vector(v, {n, k}).to(dt).contiguous());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv,
                   "decode-step bf16 products of m rows (nxd vs its block path vs f32 cblas)",
                   {{"--threads", "N", "compute threads (nxd::set_num_threads)"},
                    {"--rows", "LIST", "row counts, comma separated (default 1,8,16,32)"},
                    {"--quick", "", "fewer repetitions"}});
  const int threads = static_cast<int>(args.get_int("--threads", 1, 1, 256));
  const std::vector<int64_t> rows = args.get_int_list("--rows", "1,8,16,32", 1, 32);
  set_num_threads(threads);
  std::printf("# %s\n", cpu::describe().c_str());
  const bench::TimerOptions to = bench::decode_kernel_timer(
      args.has("--quick"), threads > 1 ? +[] { blas::stop_openblas_pool(); } : nullptr);
  std::vector<double> step[3];
  for (auto& s : step) s.assign(rows.size(), 0.0);
  for (const LayerShape& s : kShapes) {
    const auto wb = copies_of(s.n, s.k, DType::bf16), wf = copies_of(s.n, s.k, DType::f32);
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const int64_t m = rows[ri];
      std::vector<float> xv(static_cast<size_t>(m * s.k));
      for (size_t i = 0; i < xv.size(); ++i) xv[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
      const Tensor x = from_vector(xv, {m, s.k}).to(DType::bf16);
      const Tensor xf = x.to(DType::f32);
      const Tensor c = empty({m, s.n}, DType::bf16), cf = empty({m, s.n}, DType::f32);
      size_t a = 0, b = 0, d = 0;
      std::function<void()> nxd_fn = [&] { kernels::bmm(c, x, wb[a++ % wb.size()].t()); };
      std::function<void()> blocks_fn = [&] {
        kernels::detail::gemm_bf16_weight_blocks(c, x, wb[b++ % wb.size()].t(), 1.0, 0.0);
      };
      std::function<void()> blas_fn = [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
                    static_cast<blasint>(s.n), static_cast<blasint>(s.k), 1.0f,
                    static_cast<const float*>(xf.raw_data()), static_cast<blasint>(s.k),
                    static_cast<const float*>(wf[d++ % wf.size()].raw_data()),
                    static_cast<blasint>(s.k), 0.0f, static_cast<float*>(cf.raw_data()),
                    static_cast<blasint>(s.n));
      };
      const auto t = bench::time_rotation<3>({nxd_fn, blocks_fn, blas_fn}, to);
      std::printf(
          "gemv_bf16_rows m=%lld n=%lld k=%lld threads=%d nxd_us=%.1f blocks_us=%.1f "
          "blas_f32_us=%.1f vs_blocks=%.2f vs_blas=%.2f nxd_GBps=%.2f reps=%d\n",
          static_cast<long long>(m), static_cast<long long>(s.n), static_cast<long long>(s.k),
          threads, t[0].median * 1e6, t[1].median * 1e6, t[2].median * 1e6,
          t[1].median / t[0].median, t[2].median / t[0].median,
          2.0 * static_cast<double>(s.n * s.k) / t[0].median * 1e-9, t[0].reps);
      std::fflush(stdout);
      for (int f = 0; f < 3; ++f) step[f][ri] += static_cast<double>(s.per_step) * t[f].median;
    }
  }
  for (size_t ri = 0; ri < rows.size(); ++ri)
    std::printf(
        "gemv_bf16_rows_step m=%lld threads=%d nxd_ms=%.2f blocks_ms=%.2f blas_f32_ms=%.2f "
        "vs_blocks=%.2f vs_blas=%.2f\n",
        static_cast<long long>(rows[ri]), threads, step[0][ri] * 1e3, step[1][ri] * 1e3,
        step[2][ri] * 1e3, step[1][ri] / step[0][ri], step[2][ri] / step[0][ri]);
  return 0;
}
