// nxd-bench-gemv-quant: the products (m = 1 row, a decode step, or --rows M) of the weight-only
// quantized kernels (runtime/kernels/gemv_int8.h, gemv_int4.h: int4 symmetric, groups of 32,
// with f32 activations "int4" and with int8_blocks activations "int4q8") against the f32 GEMV
// (blas::sgemm, runtime/gemv_f32.cpp) and a memcpy of the same weight bytes, on the shapes of a
// ~125M Llama decode step (768x768, 2048x768, 768x2048, the 32000x768 output head). A decode
// step reads every weight once from memory, so each function cycles through enough copies of its
// weight (>= 256 MiB together) that no call finds it in cache. Timed in rotating blocks
// (bench_util.h). One line per shape and format:
//   gemv fmt=int8 m=1 n=768 k=768 threads=1 us=... GBps=... memcpy_GBps=... of_memcpy=...
// (us: median microseconds per call; GBps: weight bytes read per second, scales included;
// memcpy_GBps: the same bytes copied by memcpy, counted once; of_memcpy = GBps / memcpy_GBps.)
// Flags: --threads N, --rows M (default 1), --quick (fewer repetitions).
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "bench_util.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/cpu_info.h"
#include "nxd/runtime/kernels/gemv_int4.h"
#include "nxd/runtime/kernels/gemv_int8.h"

using namespace nxd;

namespace {

constexpr int64_t kColdBytes = int64_t{256} << 20;

// `copies` copies of `bytes` bytes with a deterministic pattern (the values do not matter).
std::vector<std::vector<uint8_t>> copies_of(int64_t bytes) {
  const int64_t n = std::max<int64_t>(2, kColdBytes / bytes);
  std::vector<std::vector<uint8_t>> r(static_cast<size_t>(n));
  for (auto& v : r) {
    v.resize(static_cast<size_t>(bytes));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 37 + 11) % 251);
  }
  return r;
}

void run_shape(int64_t n, int64_t k, int64_t m, int threads, const bench::TimerOptions& to) {
  std::vector<float> x(static_cast<size_t>(m * k)), c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m * k; ++i) x[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
  const std::vector<float> scale8(static_cast<size_t>(n), 0.01f);
  const kernels::Int4Layout l{.n = n, .k = k, .group = 32, .zero = kernels::Int4Zero::symmetric};
  kernels::Int4Layout lq = l;  // int4q8: the activations quantized per block (Int4Activations)
  lq.act = kernels::Int4Activations::int8_blocks;
  const std::vector<float> scale4(static_cast<size_t>(l.groups()), 0.01f);
  struct Fmt {
    const char* name;
    int64_t bytes;  // weight bytes per call (values and scales)
    int64_t value_bytes;
  };
  const Fmt fmts[] = {{"f32", 4 * n * k, 4 * n * k},
                      {"int8", n * k + 4 * n, n * k},
                      {"int4", l.value_bytes() + 4 * l.groups(), l.value_bytes()},
                      {"int4q8", l.value_bytes() + 4 * l.groups(), l.value_bytes()}};
  for (const Fmt& f : fmts) {
    auto w = copies_of(f.value_bytes);
    std::vector<uint8_t> dst(static_cast<size_t>(f.value_bytes));
    size_t next = 0;
    std::function<void()> product = [&] {
      const uint8_t* p = w[next++ % w.size()].data();
      if (f.name[0] == 'f')
        blas::sgemm(false, true, m, n, k, 1.0f, x.data(), k, reinterpret_cast<const float*>(p), k,
                    0.0f, c.data(), n);
      else if (f.name[3] == '8')
        kernels::linear_int8(c.data(), x.data(), reinterpret_cast<const int8_t*>(p), scale8.data(),
                             m, n, k);
      else
        kernels::linear_int4(c.data(), x.data(), p, scale4.data(), nullptr,
                             f.name[4] == 'q' ? lq : l, m);
    };
    size_t next_copy = 0;
    std::function<void()> copy = [&] {
      std::memcpy(dst.data(), w[next_copy++ % w.size()].data(), dst.size());
    };
    const auto t = bench::time_rotation<2>({product, copy}, to);
    const double gbps = static_cast<double>(f.bytes) / t[0].median * 1e-9;
    const double copy_gbps = static_cast<double>(f.value_bytes) / t[1].median * 1e-9;
    std::printf(
        "gemv fmt=%s m=%lld n=%lld k=%lld threads=%d us=%.1f GBps=%.2f memcpy_GBps=%.2f "
        "of_memcpy=%.2f\n",
        f.name, static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
        threads, t[0].median * 1e6, gbps, copy_gbps, gbps / copy_gbps);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv, "decode GEMV of int8 / int4 / f32 weights against memcpy",
                   {{"--threads", "N", "compute threads"},
                    {"--rows", "M", "activation rows (default 1: decode; 128: a prefill)"},
                    {"--quick", "", "fewer repetitions"}});
  const int threads = static_cast<int>(args.get_int("--threads", 1));
  const int64_t m = args.get_int("--rows", 1);
  if (m < 1) {
    std::fprintf(stderr, "nxd-bench-gemv-quant: --rows must be at least 1, got %lld\n",
                 static_cast<long long>(m));
    return 2;
  }
  set_num_threads(threads);
  std::printf("# %s m=%lld\n", cpu::describe().c_str(), static_cast<long long>(m));
  bench::TimerOptions to;
  to.warmup = 2;
  to.min_reps = 10;
  to.max_reps = args.has("--quick") ? 40 : 400;
  to.min_seconds = args.has("--quick") ? 0.05 : 0.3;
  for (auto [n, k] :
       {std::pair<int64_t, int64_t>{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}})
    run_shape(n, k, m, threads, to);
  return 0;
}
