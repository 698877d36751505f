// nxd-bench-attention: causal scaled_dot_product_attention forward + backward, the fused
// (FlashAttention-style) path against the materialized one (the baseline, measured in the same
// run, interleaved), at S in {128, 512, 2048} and head dim in {48, 64, 128}, batch 1.
//
//   nxd-bench-attention [--heads H] [--kv-heads K] [--threads T] [--precision fp32|bf16]
//                       [--quick] [--blocks] [--schedules]
// --blocks first times one 64x64 score block through blas::sgemm against a hand-written loop.
// --schedules times the fused path's two backward schedules (one_pass, two_pass) and the
// materialized path instead of the default table.
// One line per case: s=... d=... fused_ms=... materialized_ms=... speedup=... (materialized /
// fused median wall time) fused_peak_mb=... materialized_peak_mb=... peak_ratio=... The peak is
// the host allocator's peak bytes during one forward + backward above what was live before it
// (inputs, saved tensors, gradients, scratch tensors), from device_memory(Device::host).
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "nxd/autograd/ops.h"
#include "nxd/runtime/allocator.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/cpu_info.h"
#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/flash_attention.h"

using namespace nxd;

namespace {

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

// The score block of the fused kernels, S[64, 64] = Q[64, D] K[64, D]^T, two ways: blas::sgemm
// (what the kernels call; Eigen's GEBP with packing) and a hand-written loop (K transposed into
// a [D, 64] panel, then per row 64 accumulators in registers, the compiler's vectorization).
void qk_hand(float* s, const float* q, const float* k, int64_t d, float* kt) {
  constexpr int64_t n = 64;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t e = 0; e < d; ++e) kt[e * n + j] = k[j * d + e];
  for (int64_t i = 0; i < n; i += 2) {
    float a0[n] = {}, a1[n] = {};
    for (int64_t e = 0; e < d; ++e) {
      const float x0 = q[i * d + e], x1 = q[(i + 1) * d + e];
      for (int64_t j = 0; j < n; ++j) {
        a0[j] += x0 * kt[e * n + j];
        a1[j] += x1 * kt[e * n + j];
      }
    }
    for (int64_t j = 0; j < n; ++j) s[i * n + j] = a0[j], s[(i + 1) * n + j] = a1[j];
  }
}

void block_products(const bench::TimerOptions& to) {
  for (int64_t d : {48, 64, 128}) {
    Tensor q = randn({64, d}, 5), k = randn({64, d}, 6), s1 = empty({64, 64}), s2 = empty({64, 64});
    std::vector<float> kt(64 * d);
    const float *qp = q.data<float>(), *kp = k.data<float>();
    // many blocks per call so the timer's resolution does not matter
    auto [tg, th] = bench::time_pair(
        [&] {
          for (int r = 0; r < 200; ++r)
            blas::sgemm(/*trans_a=*/false, /*trans_b=*/true, 64, 64, d, 1.f, qp, d, kp, d, 0.f,
                        s1.data<float>(), 64);
        },
        [&] {
          for (int r = 0; r < 200; ++r) qk_hand(s2.data<float>(), qp, kp, d, kt.data());
        },
        to);
    const double flops = 200 * 2.0 * 64 * 64 * d;
    std::printf("block=qk 64x64 d=%lld gemm_gflops=%.1f hand_gflops=%.1f hand_vs_gemm=%.2f\n",
                static_cast<long long>(d), flops / tg.median * 1e-9, flops / th.median * 1e-9,
                tg.median / th.median);
  }
}

// The fused path with each backward schedule (interleaved) and the materialized path.
void compare_schedules(int64_t s, int64_t d, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& g, const bench::TimerOptions& to) {
  using kernels::FlashBackwardSchedule;
  auto fused = [&](FlashBackwardSchedule sc) {
    kernels::set_flash_backward_schedule(sc);
    step(q, k, v, g, AttentionImpl::fused);
    kernels::set_flash_backward_schedule(FlashBackwardSchedule::one_pass);
  };
  auto t = bench::time_rotation<3>({[&] { fused(FlashBackwardSchedule::one_pass); },
                                    [&] { fused(FlashBackwardSchedule::two_pass); },
                                    [&] { step(q, k, v, g, AttentionImpl::materialized); }},
                                   to);
  std::printf(
      "s=%lld d=%lld one_pass_ms=%.3f two_pass_ms=%.3f materialized_ms=%.3f "
      "two_pass_speedup=%.2f\n",
      static_cast<long long>(s), static_cast<long long>(d), 1e3 * t[0].median, 1e3 * t[1].median,
      1e3 * t[2].median, t[0].median / t[1].median);
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv, "fused causal attention (flash) against the materialized kernel",
                   {{"--heads", "H", "query heads"},
                    {"--kv-heads", "H", "key/value heads"},
                    {"--threads", "N", "compute threads"},
                    {"--quick", "", "fewer repetitions"},
                    {"--schedules", "", "compare the flash backward schedules"},
                    {"--precision", "P", "matmul precision", {"fp32", "bf16"}},
                    {"--blocks", "", "time the block products alone first"}});
  const int64_t heads = args.get_int("--heads", 4), kv = args.get_int("--kv-heads", 2);
  const int threads = static_cast<int>(args.get_int("--threads", 1));
  const bool quick = args.has("--quick"), schedules = args.has("--schedules");
  const std::string prec = args.get_str("--precision", "fp32");
  auto p = blas::parse_matmul_precision(prec);
  if (!p) {
    std::fprintf(stderr, "nxd-bench-attention: unknown --precision %s (fp32 or bf16)\n",
                 prec.c_str());
    return 2;
  }
  blas::set_matmul_precision(*p);
  set_num_threads(threads);
  std::printf("# %s precision=%s heads=%lld kv_heads=%lld batch=1 causal f32\n",
              cpu::describe().c_str(), blas::matmul_precision_name(*p),
              static_cast<long long>(heads), static_cast<long long>(kv));
  bench::TimerOptions to;
  to.warmup = 1;
  to.min_reps = 3;
  to.max_reps = quick ? 5 : 50;
  to.min_seconds = quick ? 0.05 : 0.3;
  to.block_calls = 1;
  if (args.has("--blocks")) block_products(to);
  for (int64_t s : {128, 512, 2048}) {
    for (int64_t d : {48, 64, 128}) {
      Tensor q = randn({1, heads, s, d}, 1), k = randn({1, kv, s, d}, 2),
             v = randn({1, kv, s, d}, 3), g = randn({1, heads, s, d}, 4);
      int64_t peak_f = 0, peak_m = 0;
      if (schedules) {
        compare_schedules(s, d, q, k, v, g, to);
        continue;
      }
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
