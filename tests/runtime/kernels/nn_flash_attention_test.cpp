// The fused (FlashAttention-style) attention kernels against the materialized kernel and the naive
// double reference: causal sizes that do not divide the block, Sk > Sq, GQA, strided operands,
// the log-sum-exp, meta shapes and errors.
#include <gtest/gtest.h>

#include <cmath>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/attention.h"
#include "nxd/runtime/kernels/flash_attention.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {

Tensor randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return nxd::testing::randn_from(s, dt, {seed, 15}, std);
}

struct FlashCase {
  int64_t hq, hkv, sq, sk, d;
  bool causal;
};

std::string case_name(const FlashCase& c) {
  return str("hq", c.hq, "_hkv", c.hkv, "_sq", c.sq, "_sk", c.sk, "_d", c.d,
             c.causal ? "_causal" : "_full");
}

// log-sum-exp of each row's scaled, masked scores, in double
Tensor reference_lse(const Tensor& q, const Tensor& kk, bool causal) {
  const int64_t B = q.size(0), hq = q.size(1), sq = q.size(2), d = q.size(3), sk = kk.size(2);
  const int64_t group = hq / kk.size(1);
  Tensor r = empty({B, hq, sq}, DType::f64);
  const double scale = 1.0 / std::sqrt(double(d));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> s;
        for (int64_t j = 0; j < sk && (!causal || j <= i + sk - sq); ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += q.at({b, h, i, e}) * kk.at({b, h / group, j, e});
          s.push_back(scale * dot);
        }
        double mx = *std::max_element(s.begin(), s.end()), sum = 0;
        for (double x : s) sum += std::exp(x - mx);
        r.set({b, h, i}, mx + std::log(sum));
      }
  return r;
}

struct CountingCost : CostModel {
  double flops = 0, bytes = 0;
  DType dtype = DType::i64;
  void charge_compute(const char*, double f, double b, DType t) override {
    flops = f, bytes = b, dtype = t;
  }
};

class FlashAttention : public ::testing::TestWithParam<FlashCase> {};
INSTANTIATE_TEST_SUITE_P(Cases, FlashAttention,
                         ::testing::Values(
                             // causal sizes around the 64-row block
                             FlashCase{2, 2, 1, 1, 16, true}, FlashCase{2, 2, 7, 7, 16, true},
                             FlashCase{2, 2, 65, 65, 16, true}, FlashCase{2, 2, 130, 130, 16, true},
                             FlashCase{2, 2, 64, 64, 8, true},
                             // GQA ratios 1, 2, 4
                             FlashCase{4, 4, 70, 70, 48, true}, FlashCase{4, 2, 70, 70, 48, true},
                             FlashCase{4, 1, 70, 70, 48, true},
                             // more keys than queries (the queries are the last Sq positions)
                             FlashCase{4, 2, 7, 130, 16, true}, FlashCase{2, 1, 65, 200, 16, true},
                             FlashCase{2, 1, 1, 67, 16, true},
                             // no mask
                             FlashCase{4, 2, 65, 130, 16, false},
                             FlashCase{2, 2, 130, 7, 16, false}),
                         [](const auto& i) { return case_name(i.param); });

TEST_P(FlashAttention, MatchesMaterializedAndReference) {
  const FlashCase c = GetParam();
  const int64_t B = 2;
  for (DType dt : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
    Tensor q = randn({B, c.hq, c.sq, c.d}, dt, 1), kk = randn({B, c.hkv, c.sk, c.d}, dt, 2),
           v = randn({B, c.hkv, c.sk, c.d}, dt, 3), g = randn({B, c.hq, c.sq, c.d}, dt, 4);
    Tensor o = empty_like(q), lse = empty({B, c.hq, c.sq}, dt);
    k::flash_attention_forward(o, lse, q, kk, v, c.causal, 0.0);
    Tensor om = empty_like(q), p = empty({B, c.hq, c.sq, c.sk}, dt), orf = empty_like(q);
    k::attention_forward(om, p, q, kk, v, c.causal, 0.0);
    k::ref::attention_forward(orf, Tensor(), q, kk, v, c.causal, 0.0);
    EXPECT_ALLCLOSE(o, om, 0, tol);
    EXPECT_ALLCLOSE(o, orf, 0, tol);
    EXPECT_ALLCLOSE(lse, reference_lse(q, kk, c.causal), 0, tol);
    // inference (no lse) writes the same output
    Tensor o2 = empty_like(q);
    k::flash_attention_forward(o2, Tensor(), q, kk, v, c.causal, 0.0);
    EXPECT_BITWISE_EQ(o2, o);

    Tensor dq = empty_like(q), dk = empty_like(kk), dv = empty_like(v);
    k::flash_attention_backward(dq, dk, dv, g, q, kk, v, o, lse, c.causal, 0.0);
    Tensor dqm = empty_like(q), dkm = empty_like(kk), dvm = empty_like(v);
    k::attention_backward(dqm, dkm, dvm, g, q, kk, v, om, p, c.causal, 0.0);
    Tensor dqr = empty_like(q), dkr = empty_like(kk), dvr = empty_like(v);
    k::ref::attention_backward(dqr, dkr, dvr, g, q, kk, v, orf, Tensor(), c.causal, 0.0);
    EXPECT_ALLCLOSE(dq, dqm, 0, tol);
    EXPECT_ALLCLOSE(dk, dkm, 0, tol);
    EXPECT_ALLCLOSE(dv, dvm, 0, tol);
    EXPECT_ALLCLOSE(dq, dqr, 0, tol);
    EXPECT_ALLCLOSE(dk, dkr, 0, tol);
    EXPECT_ALLCLOSE(dv, dvr, 0, tol);
  }
}

TEST(FlashAttentionMisc, StridedOperandsAndScale) {
  // [B, S, H, D] projections viewed as [B, H, S, D]; outputs written in [B, S, H, D] memory
  const int64_t B = 2, S = 70, H = 4, Hkv = 2, D = 8;
  Tensor q = randn({B, S, H, D}, DType::f32, 5).transpose(1, 2),
         kk = randn({B, S, Hkv, D}, DType::f32, 6).transpose(1, 2),
         v = randn({B, S, Hkv, D}, DType::f32, 7).transpose(1, 2),
         g = randn({B, S, H, D}, DType::f32, 8).transpose(1, 2);
  Tensor o = empty({B, S, H, D}).transpose(1, 2), lse = empty({B, H, S});
  k::flash_attention_forward(o, lse, q, kk, v, true, 0.3);
  Tensor r = empty({B, H, S, D});
  k::ref::attention_forward(r, Tensor(), q, kk, v, true, 0.3);
  EXPECT_ALLCLOSE(o.contiguous(), r, 0, 1e-5);
  Tensor dq = empty({B, S, H, D}).transpose(1, 2), dk = empty({B, S, Hkv, D}).transpose(1, 2),
         dv = empty({B, S, Hkv, D}).transpose(1, 2);
  k::flash_attention_backward(dq, dk, dv, g, q, kk, v, o, lse, true, 0.3);
  Tensor dqr = empty({B, H, S, D}), dkr = empty({B, Hkv, S, D}), dvr = empty({B, Hkv, S, D});
  k::ref::attention_backward(dqr, dkr, dvr, g, q, kk, v, r, Tensor(), true, 0.3);
  EXPECT_ALLCLOSE(dq.contiguous(), dqr, 0, 1e-5);
  EXPECT_ALLCLOSE(dk.contiguous(), dkr, 0, 1e-5);
  EXPECT_ALLCLOSE(dv.contiguous(), dvr, 0, 1e-5);
}

TEST(FlashAttentionMisc, ErrorsAndMeta) {
  Tensor q = zeros({1, 4, 3, 8}), kk = zeros({1, 2, 3, 8});
  try {
    k::flash_attention_forward(empty_like(q), zeros({1, 4, 4}), q, kk, kk, true, 0);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("lse is f32[1,4,4], expected f32[1,4,3]"),
              std::string::npos)
        << e.what();
  }
  try {
    k::flash_attention_forward(empty_like(q), Tensor(), q, zeros({1, 2, 2, 8}), zeros({1, 2, 2, 8}),
                               true, 0);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("needs at least as many keys as queries"),
              std::string::npos)
        << e.what();
  }
  try {
    k::flash_attention_backward(empty_like(q), empty_like(kk), empty_like(kk), q, q, kk, kk, q,
                                Tensor(), true, 0);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("lse is undefined"), std::string::npos) << e.what();
  }
  // meta: shapes only
  Tensor qm = empty({2, 8, 128, 64}, DType::f32, Device::meta),
         km = empty({2, 2, 128, 64}, DType::f32, Device::meta);
  Tensor om = empty_like(qm), lm = empty({2, 8, 128}, DType::f32, Device::meta);
  k::flash_attention_forward(om, lm, qm, km, km, true, 0);
  k::flash_attention_backward(empty_like(qm), empty_like(km), empty_like(km), om, qm, km, km, om,
                              lm, true, 0);
}

// The two backward schedules add every block in the same order: bitwise the same gradients.
TEST(FlashAttentionMisc, BackwardSchedulesAgreeBitwise) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (bool causal : {true, false}) {
      SCOPED_TRACE(str(dtype_name(dt), causal ? " causal" : " full"));
      Tensor q = randn({2, 4, 130, 16}, dt, 9), kk = randn({2, 1, 150, 16}, dt, 10),
             v = randn({2, 1, 150, 16}, dt, 11), g = randn({2, 4, 130, 16}, dt, 12);
      Tensor o = empty_like(q), lse = empty({2, 4, 130}, dt);
      k::flash_attention_forward(o, lse, q, kk, v, causal, 0);
      std::vector<Tensor> r[2];
      int i = 0;
      for (auto s : {k::FlashBackwardSchedule::one_pass, k::FlashBackwardSchedule::two_pass}) {
        k::set_flash_backward_schedule(s);
        Tensor dq = empty_like(q), dk = empty_like(kk), dv = empty_like(v);
        k::flash_attention_backward(dq, dk, dv, g, q, kk, v, o, lse, causal, 0);
        r[i++] = {dq, dk, dv};
      }
      k::set_flash_backward_schedule(k::FlashBackwardSchedule::one_pass);
      for (int t = 0; t < 3; ++t) EXPECT_BITWISE_EQ(r[0][t], r[1][t]) << "gradient " << t;
    }
  }
}

// The sim device is charged the flops of the score blocks the kernel visits (a causal mask skips
// the blocks above the diagonal: 33 of the 32 x 32 blocks' halves here) plus the online rescaling
// (forward) and the recomputed scores (backward), and only the linear HBM traffic: q, k, v, out,
// lse (and the gradients), never the [Sq, Sk] scores.
TEST(FlashAttentionMisc, ChargesFlopsAndLinearBytes) {
  auto cost = std::make_shared<CountingCost>();
  Context ctx;
  ctx.set_cost_model(cost);
  ContextGuard guard(ctx);
  const double B = 1, H = 4, Hkv = 2, S = 2048, D = 64;
  Tensor q = empty({1, 4, 2048, 64}, DType::f32, Device::meta),
         kk = empty({1, 2, 2048, 64}, DType::f32, Device::meta);
  Tensor o = empty_like(q), lse = empty({1, 4, 2048}, DType::f32, Device::meta),
         p = empty({1, 4, 2048, 2048}, DType::f32, Device::meta);
  k::flash_attention_forward(o, lse, q, kk, kk, true, 0);
  EXPECT_EQ(cost->bytes, 4 * (2 * B * H * S * D + 2 * B * Hkv * S * D + B * H * S));
  const double visited =
      64.0 * 64.0 * (32 * 33 / 2);  // the 64 x 64 blocks on and below the diagonal
  EXPECT_EQ(cost->flops, B * H * (visited * (4 * D + 6) + 2 * S * D));
  EXPECT_EQ(cost->dtype, DType::f32);
  const double fwd_bytes = cost->bytes;
  k::attention_forward(o, p, q, kk, kk, true, 0);
  EXPECT_GT(cost->bytes, 8 * fwd_bytes);  // the materialized kernel writes the probabilities
  k::flash_attention_backward(empty_like(q), empty_like(kk), empty_like(kk), o, q, kk, kk, o, lse,
                              true, 0);
  const double bwd_flops = cost->flops, bwd_bytes = cost->bytes;
  EXPECT_EQ(bwd_flops, B * H * (visited * (10 * D + 8) + 2 * S * D));
  EXPECT_EQ(bwd_bytes, 4 * (5 * B * H * S * D + 4 * B * Hkv * S * D + B * H * S));
  k::attention_backward(empty_like(q), empty_like(kk), empty_like(kk), o, q, kk, kk, o, p, true, 0);
  // the materialized kernel computes every score; the fused one recomputes Q K^T, on half of them
  EXPECT_GT(bwd_flops, 0.6 * cost->flops);
  EXPECT_LT(bwd_flops, 0.7 * cost->flops);
  EXPECT_GT(cost->bytes, 8 * bwd_bytes);  // and reads them
  blas::MatmulPrecisionScope bf16(blas::MatmulPrecision::bf16);
  k::flash_attention_forward(o, lse, q, kk, kk, true, 0);
  EXPECT_EQ(cost->dtype, DType::bf16);  // auto-cast products run at the core's bf16 peak
}

// Causal attention is charged the work of the blocks the kernel visits: at long sequence about
// half of the unmasked attention's ((n + 1) / 2n for n aligned blocks), and exactly the sum of its
// query blocks run one at a time (query block i against keys [0, i + 64): the same blocks), in
// the forward and the backward.
TEST(FlashAttentionMisc, CausalIsChargedItsVisitedBlocks) {
  auto cost = std::make_shared<CountingCost>();
  Context ctx;
  ctx.set_cost_model(cost);
  ContextGuard guard(ctx);
  const int64_t S = 8192, D = 128, n = S / k::kFlashQueryBlock;
  auto charged = [&](int64_t sq, int64_t sk, bool causal, bool bwd) {
    Tensor q = empty({1, 2, sq, D}, DType::bf16, Device::meta),
           kv = empty({1, 1, sk, D}, DType::bf16, Device::meta);
    Tensor o = empty_like(q), lse = empty({1, 2, sq}, DType::bf16, Device::meta);
    if (bwd)
      k::flash_attention_backward(empty_like(q), empty_like(kv), empty_like(kv), o, q, kv, kv, o,
                                  lse, causal, 0);
    else
      k::flash_attention_forward(o, lse, q, kv, kv, causal, 0);
    return cost->flops;
  };
  for (bool bwd : {false, true}) {
    const double full = charged(S, S, false, bwd), causal = charged(S, S, true, bwd);
    double blocks = 0;
    for (int64_t i0 = 0; i0 < S; i0 += k::kFlashQueryBlock)
      blocks += charged(k::kFlashQueryBlock, i0 + k::kFlashQueryBlock, true, bwd);
    std::printf("    %s S=%lld: causal / unmasked %.4f (blocks: %.4f)\n",
                bwd ? "backward" : "forward", static_cast<long long>(S), causal / full,
                double(n + 1) / double(2 * n));
    EXPECT_NEAR(causal / full, double(n + 1) / double(2 * n), 1e-3);
    EXPECT_EQ(causal, blocks);
  }
  // more keys than queries: the queries are the last rows, every key before them is visible
  const double tail = charged(64, 8192, true, false), open = charged(64, 8192, false, false);
  EXPECT_EQ(tail, open);
}

}  // namespace
