// nxd-bench-matmul: for each shape, the tensor engine's matmul (nxd::linear forward, and the two
// backward products dx = dy @ W and dW = dy^T @ X through nxd::matmul on views, each allocating
// its output as a user would) against raw cblas_sgemm on the same shapes and thread count, timed
// alternately in the same run. One line per case:
//   matmul case=fwd m=512 n=768 k=768 threads=1 nxd_gflops=... blas_gflops=... ratio=...
//          nxd_best_gflops=... blas_best_gflops=... best_ratio=... reps=...
// (gflops from the median wall time per call, best_* from the fastest call, cpu_ratio from the
// median process CPU time per call: on a loaded machine the last two are the better estimates;
// nxd_faults: minor page faults of one engine call, i.e. the cost of fresh output pages.)
// Flags: --threads N (nxd::set_num_threads), --quick (fewer shapes), --case fwd|bwd_dx|bwd_dw
// (only that product), --tokens T (only transformer shapes with T tokens).
#include <cblas.h>
#include <sys/resource.h>

#include <cstdio>
#include <vector>

#include "bench_util.h"
#include "nxd/autograd/ops.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/init.h"

using namespace nxd;

namespace {

struct Case {
  const char* name;  // fwd, bwd_dx, bwd_dw
  int64_t tokens, in, out;
};

Tensor rand_tensor(const Shape& s, uint64_t stream) {
  Tensor t = empty(s);
  init::uniform(t, RngStream{7, stream}, -1.0, 1.0);
  return t;
}

bool swap_order = false;  // --swap: time the baseline first in each pair

void run(const Case& c, int threads, const bench::TimerOptions& topt) {
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
  if (name == "fwd") {  // y = x @ w^T
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
  const double flops = 2.0 * static_cast<double>(m) * n * k;
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

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv);
  const int threads = static_cast<int>(args.get_int("--threads", 1));
  const bool quick = args.has("--quick");
  set_num_threads(threads);
  NoGradGuard no_grad;

  std::vector<int64_t> squares =
      quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{256, 512, 1024, 2048};
  std::vector<int64_t> tokens =
      quick ? std::vector<int64_t>{512, 2048} : std::vector<int64_t>{512, 1024, 2048, 4096};
  std::vector<int64_t> outs =
      quick ? std::vector<int64_t>{768, 3072} : std::vector<int64_t>{768, 2304, 3072};
  swap_order = args.has("--swap");
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
  std::erase_if(cases, [&](const Case& c) { return !only.empty() && only != c.name; });

  bench::TimerOptions topt;
  topt.warmup = 2;
  topt.min_reps = quick ? 3 : 7;
  topt.min_seconds = quick ? 0.1 : 0.4;
  for (const Case& c : cases) run(c, threads, topt);
  return 0;
}
