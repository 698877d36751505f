// nxd-bench-matmul: for each shape, the tensor engine's matmul (nxd::linear forward, and the two
// backward products dx = dy @ W and dW = dy^T @ X through nxd::matmul on views, each allocating
// its output as a user would) against raw cblas_sgemm on the same shapes and thread count, timed
// in the same run in alternating blocks of consecutive calls (bench_util.h: a block is >= 5 calls
// and >= 5 ms; the block order rotates so both see the same machine load; medians per call). At
// more than one thread OpenBLAS's pool is stopped after every block, outside the timed region
// (blas::stop_openblas_pool): its idle worker would otherwise busy-wait ~0.1 s after the last
// cblas call, a third running thread on a 2-core machine during the next nxd block. The first
// cblas call of each block then restarts the pool (tens of microseconds), which the per-call
// median and the best call exclude. One line per case:
//   matmul case=fwd m=512 n=768 k=768 threads=1 nxd_gflops=... blas_gflops=... ratio=...
//          nxd_best_gflops=... blas_best_gflops=... best_ratio=... reps=...
// (gflops from the median wall time per call, best_* from the fastest call, cpu_ratio from the
// median process CPU time per call: on a loaded machine the last two are the better estimates;
// nxd_faults: minor page faults of one engine call, i.e. the cost of fresh output pages; reps:
// timed nxd calls.)
// Batched attention products (case=attn_qk: scores = q @ k^T, 128x128x64; case=attn_pv:
// p @ v, 128x64x128; 48 heads per call) run blas::sgemm per head against cblas_sgemm per head.
//
// bf16 matmul precision (blas::MatmulPrecision::bf16), one more line per case: the same engine
// call under bf16 precision, the f32 engine call and raw cblas_sgemm, timed in rotating blocks
// (bf16, f32, cblas; f32, cblas, bf16; cblas, bf16, f32; ...; reps: timed bf16 calls):
//   matmul_bf16 case=fwd m=... n=... k=... threads=1 kernel=amx bf16_gflops=... f32_gflops=...
//          blas_gflops=... bf16_vs_f32=... bf16_vs_blas=... (best_*: fastest call) reps=...
// Before the first timed block the first case runs untimed for ~0.3 s (cold pages and caches).
// Flags: --threads N (nxd::set_num_threads), --quick (fewer shapes), --case fwd|bwd_dx|bwd_dw|
// attn_qk|attn_pv (only that product), --tokens T (only transformer shapes with T tokens),
// --no-bf16 (skip the bf16 lines), --bf16-only (only the bf16 lines), --bf16-kernel
// amx|avx512_bf16|portable (default: blas::bf16_kernel()), --split-sweep (see split_sweep).
#include <cblas.h>
#include <sys/resource.h>

#include <array>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench_util.h"
#include "nxd/autograd/ops.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/cpu_info.h"
#include "nxd/runtime/init.h"

using namespace nxd;

namespace {

struct Case {
  const char* name;  // fwd, bwd_dx, bwd_dw, attn_qk, attn_pv
  int64_t tokens, in, out;
};

constexpr int64_t kHeads = 48, kSeq = 128, kHeadDim = 64;  // the batched attention cases

// Times three functions in rotating blocks (a b c, b c a, c a b, ...: bench::time_rotation): each
// sees the same load.
template <class A, class B, class C>
std::array<bench::Timing, 3> time_triple(A&& a, B&& b, C&& c, const bench::TimerOptions& o) {
  return bench::time_rotation<3>(
      {std::function<void()>(a), std::function<void()>(b), std::function<void()>(c)}, o);
}

bool print_f32 = true, print_bf16 = true;

Tensor rand_tensor(const Shape& s, uint64_t stream) {
  Tensor t = empty(s);
  init::uniform(t, RngStream{7, stream}, -1.0, 1.0);
  return t;
}

bool swap_order = false;  // --swap: time the baseline's block first

void run(const Case& c, int threads, const bench::TimerOptions& topt, bool print = true) {
  // x[T, in], w[out, in], y/dy[T, out]
  Tensor x = rand_tensor({c.tokens, c.in}, 1), w = rand_tensor({c.out, c.in}, 2),
         dy = rand_tensor({c.tokens, c.out}, 3);
  const std::string name = c.name;
  int64_t m, n, k;
  std::function<void()> engine, blas;
  std::vector<float> cbuf;
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  const float* dyp = dy.data<float>();
  int64_t batch = 1;
  if (name == "attn_qk" ||
      name == "attn_pv") {  // per head: [128,64] @ [128,64]^T, [128,128] @ [128,64]
    const bool qk = name == "attn_qk";
    batch = kHeads;
    m = kSeq, n = qk ? kSeq : kHeadDim, k = qk ? kHeadDim : kSeq;
    x = rand_tensor({kHeads, m, k}, 4);
    w = rand_tensor({kHeads, qk ? n : k, qk ? k : n}, 5);
    xp = x.data<float>();
    wp = w.data<float>();
    cbuf.resize(static_cast<size_t>(kHeads * m * n));
    engine = [&, m, n, k, qk] {
      for (int64_t h = 0; h < kHeads; ++h)
        blas::sgemm(/*trans_a=*/false, /*trans_b=*/qk, m, n, k, 1.f, xp + h * m * k, k,
                    wp + h * n * k, qk ? k : n, 0.f, cbuf.data() + h * m * n, n);
    };
    blas = [&, m, n, k, qk] {
      for (int64_t h = 0; h < kHeads; ++h)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, qk ? CblasTrans : CblasNoTrans, m, n, k, 1.f,
                    xp + h * m * k, k, wp + h * n * k, qk ? k : n, 0.f, cbuf.data() + h * m * n, n);
    };
  } else if (name == "fwd") {  // y = x @ w^T
    m = c.tokens, n = c.out, k = c.in;
    cbuf.resize(static_cast<size_t>(m * n));
    engine = [&] { Tensor y = linear(x, w); };
    blas = [&, m, n, k] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.f, xp, k, wp, k, 0.f,
                  cbuf.data(), n);
    };
  } else if (name == "bwd_dx") {  // dx = dy @ w
    m = c.tokens, n = c.in, k = c.out;
    cbuf.resize(static_cast<size_t>(m * n));
    engine = [&] { Tensor dx = matmul(dy, w); };
    blas = [&, m, n, k] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.f, dyp, k, wp, n, 0.f,
                  cbuf.data(), n);
    };
  } else {  // dw = dy^T @ x
    m = c.out, n = c.in, k = c.tokens;
    cbuf.resize(static_cast<size_t>(m * n));
    engine = [&] { Tensor dw = matmul(transpose(dy, 0, 1), x); };
    blas = [&, m, n, k] {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.f, dyp, m, xp, n, 0.f,
                  cbuf.data(), n);
    };
  }
  const double flops = 2.0 * static_cast<double>(batch) * m * n * k;
  if (print_bf16 && print) {
    auto bf16 = [&] {
      blas::MatmulPrecisionScope scope(blas::MatmulPrecision::bf16);
      engine();
    };
    auto [t16, t32, tbl] = time_triple(bf16, engine, blas, topt);
    const double g16 = flops / t16.median / 1e9, g32 = flops / t32.median / 1e9,
                 gbl = flops / tbl.median / 1e9;
    const double b16 = flops / t16.min / 1e9, b32 = flops / t32.min / 1e9,
                 bbl = flops / tbl.min / 1e9;
    std::printf(
        "matmul_bf16 case=%s m=%lld n=%lld k=%lld batch=%lld threads=%d kernel=%s "
        "bf16_gflops=%.2f f32_gflops=%.2f blas_gflops=%.2f bf16_vs_f32=%.3f bf16_vs_blas=%.3f "
        "bf16_best_gflops=%.2f f32_best_gflops=%.2f blas_best_gflops=%.2f best_vs_f32=%.3f "
        "best_vs_blas=%.3f cpu_vs_f32=%.3f reps=%d\n",
        c.name, static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
        static_cast<long long>(batch), threads, blas::bf16_kernel_name(blas::bf16_kernel()), g16,
        g32, gbl, g16 / g32, g16 / gbl, b16, b32, bbl, b16 / b32, b16 / bbl,
        t32.cpu_median / t16.cpu_median, t16.reps);
    std::fflush(stdout);
  }
  if (!print_f32 && print) return;
  auto [te, tb] = swap_order ? [&] {
    auto [b2, e2] = bench::time_pair(blas, engine, topt);
    return std::pair{e2, b2};
  }()
                             : bench::time_pair(engine, blas, topt);
  // page faults of one more engine call: nonzero when outputs are not served from the host cache
  rusage r0{}, r1{};
  getrusage(RUSAGE_SELF, &r0);
  engine();
  getrusage(RUSAGE_SELF, &r1);
  const long faults = r1.ru_minflt - r0.ru_minflt;
  if (!print) return;
  const double ge = flops / te.median / 1e9, gb = flops / tb.median / 1e9;
  const double be = flops / te.min / 1e9, bb = flops / tb.min / 1e9;
  std::printf(
      "matmul case=%s m=%lld n=%lld k=%lld threads=%d nxd_gflops=%.2f blas_gflops=%.2f "
      "ratio=%.3f nxd_best_gflops=%.2f blas_best_gflops=%.2f best_ratio=%.3f cpu_ratio=%.3f "
      "nxd_faults=%ld reps=%d\n",
      c.name, static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
      threads, ge, gb, ge / gb, be, bb, be / bb, tb.cpu_median / te.cpu_median, faults, te.reps);
  std::fflush(stdout);
}

// --split-sweep (needs --threads >= 2): where splitting one product over the compute pool starts
// to pay. For small products (cubes and the attention and tiny-model shapes) one blas::sgemm
// call kept on the caller (GemmSplitOptions min work = max) against the same call split over the
// pool (min work 0), in alternating blocks; at fp32 and at the bf16 precision. One line each:
//   split precision=fp32 m=128 n=128 k=64 work=1048576 serial_us=... split_us=... speedup=...
void split_sweep(int threads, const bench::TimerOptions& topt) {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {32, 32, 32},    {48, 48, 48},    {64, 64, 64},    {96, 96, 96},    {64, 64, 128},
      {128, 64, 64},   {128, 128, 64},  {128, 64, 128},  {128, 128, 128}, {192, 192, 192},
      {256, 128, 128}, {256, 256, 256}, {128, 128, 512}, {512, 256, 256}, {1024, 256, 256}};
  const blas::GemmSplitOptions saved = blas::gemm_split();
  constexpr int64_t kNever = int64_t{1} << 62;
  for (const auto precision : {blas::MatmulPrecision::fp32, blas::MatmulPrecision::bf16}) {
    blas::MatmulPrecisionScope scope(precision);
    for (const auto& [m, n, k] : shapes) {
      std::vector<float> a(static_cast<size_t>(m * k), 0.5f), b(static_cast<size_t>(k * n), 0.25f),
          c(static_cast<size_t>(m * n));
      // calls per timed sample: about 1 ms of work at ~100 GFLOP/s, so the timer is negligible
      const int64_t calls = std::max<int64_t>(1, int64_t{50'000'000} / (m * n * k));
      auto call = [&] {
        for (int64_t i = 0; i < calls; ++i)
          blas::sgemm(/*trans_a=*/false, /*trans_b=*/false, m, n, k, 1.f, a.data(), k, b.data(), n,
                      0.f, c.data(), n);
      };
      auto serial = [&] {
        blas::set_gemm_split({kNever, kNever});
        call();
      };
      auto split = [&] {
        blas::set_gemm_split({0, 0});
        call();
      };
      auto [ts, tp] = bench::time_pair(serial, split, topt);
      blas::set_gemm_split(saved);
      std::printf(
          "split precision=%s m=%lld n=%lld k=%lld work=%lld threads=%d serial_us=%.2f "
          "split_us=%.2f speedup=%.3f best_speedup=%.3f reps=%d\n",
          blas::matmul_precision_name(precision), static_cast<long long>(m),
          static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m * n * k),
          threads, ts.median * 1e6 / calls, tp.median * 1e6 / calls, ts.median / tp.median,
          ts.min / tp.min, ts.reps);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(
      argc, argv,
      "nxd's f32 and bf16-precision matmul products against raw cblas_sgemm on transformer shapes",
      {{"--threads", "N", "compute threads (nxd::set_num_threads)"},
       {"--quick", "", "fewer shapes and repetitions"},
       {"--case", "NAME", "only this product", {"fwd", "bwd_dx", "bwd_dw", "attn_qk", "attn_pv"}},
       {"--tokens", "T", "only the transformer shapes with T tokens"},
       {"--no-bf16", "", "skip the bf16-precision lines"},
       {"--bf16-only", "", "only the bf16-precision lines"},
       {"--bf16-kernel",
        "K",
        "bf16 kernel (default: the best available)",
        {"amx", "avx512_bf16", "portable"}},
       {"--swap", "", "time the baseline's block first"},
       {"--split-sweep", "",
        "where splitting one product over the pool starts to pay (--threads >= 2)"}});
  const int threads = static_cast<int>(args.get_int("--threads", 1));
  const bool quick = args.has("--quick");
  if (threads < 1) {
    std::fprintf(stderr, "nxd-bench-matmul: --threads %d: need at least 1\n", threads);
    return 2;
  }
  set_num_threads(threads);
  NoGradGuard no_grad;

  std::vector<int64_t> squares =
      quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{256, 512, 1024, 2048};
  std::vector<int64_t> tokens =
      quick ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{512, 1024, 2048, 4096};
  std::vector<int64_t> outs =
      quick ? std::vector<int64_t>{768, 3072} : std::vector<int64_t>{768, 2304, 3072};
  swap_order = args.has("--swap");
  print_bf16 = !args.has("--no-bf16");
  print_f32 = !args.has("--bf16-only");
  const std::string kernel = args.get_str("--bf16-kernel", "");
  for (auto kk : {blas::Bf16Kernel::amx, blas::Bf16Kernel::avx512_bf16, blas::Bf16Kernel::portable})
    if (kernel == blas::bf16_kernel_name(kk)) {
      if (!blas::bf16_kernel_available(kk)) {
        std::fprintf(stderr, "nxd-bench-matmul: --bf16-kernel %s is not available on this CPU\n",
                     kernel.c_str());
        return 2;
      }
      blas::set_bf16_kernel(kk);
    }
  std::printf("# %s\n", cpu::describe().c_str());
  const std::string only = args.get_str("--case", "");
  const int64_t only_tokens = args.get_int("--tokens", 0);
  if (only_tokens > 0) {
    squares.clear();
    tokens = {only_tokens};
  }
  std::vector<Case> cases;
  for (const char* nm : {"fwd", "bwd_dx", "bwd_dw"})
    for (int64_t s : squares) cases.push_back({nm, s, s, s});
  for (int64_t t : tokens)
    for (int64_t o : outs)
      for (const char* nm : {"fwd", "bwd_dx", "bwd_dw"}) cases.push_back({nm, t, 768, o});
  if (only_tokens == 0) {
    // bench/train_step's tiny model (hidden 256, MLP 768, 1024 tokens) and its attention
    for (int64_t o : {256, 768})
      for (const char* nm : {"fwd", "bwd_dx", "bwd_dw"}) cases.push_back({nm, 1024, 256, o});
    for (const char* nm : {"attn_qk", "attn_pv"}) cases.push_back({nm, 0, 0, 0});
  }
  std::erase_if(cases, [&](const Case& c) { return !only.empty() && only != c.name; });

  bench::TimerOptions topt;
  topt.warmup = 2;
  topt.min_reps = quick ? 3 : 7;
  topt.min_seconds = quick ? 0.1 : 0.4;
  // raw cblas_sgemm at > 1 thread leaves OpenBLAS's worker spinning: stop it after every block
  if (threads > 1) topt.between_blocks = blas::stop_openblas_pool;
  if (args.has("--split-sweep")) {
    NXD_CHECK(threads >= 2, "[nxd-bench-matmul] --split-sweep needs --threads >= 2, got ", threads);
    topt.min_reps = 20;
    topt.min_seconds = 0.2;
    split_sweep(threads, topt);
    return 0;
  }
  // Warm up before the first timed block: the first case was measured cold (page faults of fresh
  // output pages, caches), e.g. ratio 0.35 on 256^3 where later runs of it gave ~1.
  if (!cases.empty()) {
    bench::TimerOptions cold = topt;
    cold.min_reps = 1, cold.max_reps = 1000, cold.min_seconds = 0.3, cold.warmup = 0;
    run(cases.front(), threads, cold, /*print=*/false);
  }
  for (const Case& c : cases) run(c, threads, topt);
  return 0;
}
