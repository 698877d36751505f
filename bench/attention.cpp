// nxd-bench-attention: causal scaled_dot_product_attention forward + backward, the fused
// (FlashAttention-style) path against the materialized one (the baseline, measured in the same
// run, interleaved), at S in {128, 512, 2048} and head dim in {48, 64, 128}, batch 1.
//
//   nxd-bench-attention [--heads H] [--kv-heads K] [--threads T] [--precision fp32|bf16]
//                       [--quick]
// One line per case: s=... d=... fused_ms=... materialized_ms=... speedup=... (materialized /
// fused median wall time) fused_peak_mb=... materialized_peak_mb=... peak_ratio=... The peak is
// the host allocator's peak bytes during one forward + backward above what was live before it
// (inputs, saved tensors, gradients, scratch tensors), from device_memory(Device::host).
#include <cstdio>
#include <fstream>
#include <string>

#include "bench_util.h"
#include "nxd/autograd/ops.h"
#include "nxd/runtime/allocator.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/init.h"

using namespace nxd;

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

Tensor randn(const Shape& s, uint64_t seed) {
  Tensor t = empty(s);
  init::normal(t, RngStream{seed, 7}, 0.0, 1.0);
  return t;
}

struct Case {
  int64_t s, d;
};

// Forward and backward of one attention call; the peak bytes above the live bytes before it.
int64_t step(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g,
             AttentionImpl impl) {
  MemoryCounter& mem = device_memory(Device::host);
  const int64_t before = mem.live();
  mem.reset_peak();
  {
    Tensor q = q0.detach(), k = k0.detach(), v = v0.detach();
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    Tensor y = scaled_dot_product_attention(q, k, v, {.impl = impl});
    backward(y, g);
  }
  return mem.peak() - before;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv);
  const int64_t heads = args.get_int("--heads", 4), kv = args.get_int("--kv-heads", 2);
  const int threads = static_cast<int>(args.get_int("--threads", 1));
  const bool quick = args.has("--quick");
  const std::string prec = args.get_str("--precision", "fp32");
  auto p = blas::parse_matmul_precision(prec);
  if (!p) {
    std::fprintf(stderr, "nxd-bench-attention: unknown --precision %s (fp32 or bf16)\n",
                 prec.c_str());
    return 2;
  }
  blas::set_matmul_precision(*p);
  set_num_threads(threads);
  std::printf("# cpu=\"%s\" threads=%d precision=%s heads=%lld kv_heads=%lld batch=1 causal f32\n",
              cpu_model().c_str(), threads, blas::matmul_precision_name(*p),
              static_cast<long long>(heads), static_cast<long long>(kv));
  bench::TimerOptions to;
  to.warmup = 1;
  to.min_reps = 3;
  to.max_reps = quick ? 5 : 50;
  to.min_seconds = quick ? 0.05 : 0.3;
  to.block_calls = 1;
  for (int64_t s : {128, 512, 2048}) {
    for (int64_t d : {48, 64, 128}) {
      Tensor q = randn({1, heads, s, d}, 1), k = randn({1, kv, s, d}, 2),
             v = randn({1, kv, s, d}, 3), g = randn({1, heads, s, d}, 4);
      int64_t peak_f = 0, peak_m = 0;
      auto [tf, tm] =
          bench::time_pair([&] { peak_f = step(q, k, v, g, AttentionImpl::fused); },
                           [&] { peak_m = step(q, k, v, g, AttentionImpl::materialized); }, to);
      std::printf(
          "s=%lld d=%lld fused_ms=%.3f materialized_ms=%.3f speedup=%.2f fused_peak_mb=%.2f "
          "materialized_peak_mb=%.2f peak_ratio=%.3f reps=%d\n",
          static_cast<long long>(s), static_cast<long long>(d), 1e3 * tf.median, 1e3 * tm.median,
          tm.median / tf.median, peak_f / 1048576.0, peak_m / 1048576.0,
          static_cast<double>(peak_f) / static_cast<double>(peak_m), tf.reps);
      std::fflush(stdout);
    }
  }
  return 0;
}
