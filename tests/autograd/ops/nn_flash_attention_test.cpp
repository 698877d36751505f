// scaled_dot_product_attention's fused path (the default) against the materialized one: values
// and gradients in f32, gradcheck in f64, bf16 (storage and matmul precision) within a bound.
#include <gtest/gtest.h>

#include <cmath>

#include "nxd/autograd/ops.h"
#include "nxd/runtime/allocator.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {

struct Result {
  Tensor y, dq, dk, dv;
};

// y = attention(q, k, v) and the gradients of sum(y * g), computed in q's dtype.
Result run(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g,
           const SdpaOptions& o) {
  Tensor q = q0.clone(), k = k0.clone(), v = v0.clone();
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  Tensor y = scaled_dot_product_attention(q, k, v, o);
  backward(sum(mul(y, g)));
  return {y.detach(), q.grad(), k.grad(), v.grad()};
}

struct Shape4 {
  int64_t hq, hkv, sq, sk, d;
};

}  // namespace

TEST(NnOpsFlashAttention, FusedMatchesMaterializedF32) {
  for (Shape4 s :
       {Shape4{2, 2, 1, 1, 16}, Shape4{2, 2, 7, 7, 16}, Shape4{4, 2, 65, 65, 32},
        Shape4{4, 1, 130, 130, 48}, Shape4{4, 4, 70, 70, 64}, Shape4{4, 2, 7, 130, 16}}) {
    SCOPED_TRACE(str("hq=", s.hq, " hkv=", s.hkv, " sq=", s.sq, " sk=", s.sk, " d=", s.d));
    Tensor q = randn({2, s.hq, s.sq, s.d}, 1, DType::f32),
           k = randn({2, s.hkv, s.sk, s.d}, 2, DType::f32),
           v = randn({2, s.hkv, s.sk, s.d}, 3, DType::f32),
           g = randn({2, s.hq, s.sq, s.d}, 4, DType::f32);
    Result f = run(q, k, v, g, {.impl = AttentionImpl::fused});
    Result m = run(q, k, v, g, {.impl = AttentionImpl::materialized});
    EXPECT_ALLCLOSE(f.y, m.y, 0, 1e-5);
    EXPECT_ALLCLOSE(f.dq, m.dq, 0, 1e-5);
    EXPECT_ALLCLOSE(f.dk, m.dk, 0, 1e-5);
    EXPECT_ALLCLOSE(f.dv, m.dv, 0, 1e-5);
  }
}

TEST(NnOpsFlashAttention, GradcheckF64) {
  // across a block edge (70 rows, 64 per block), GQA 2, more keys than queries, no mask
  const SdpaOptions fused{.impl = AttentionImpl::fused};
  check_grad(
      [&](const auto& in) {
        return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], fused)};
      },
      {randn({1, 2, 70, 3}, 5, DType::f64, 0.5), randn({1, 1, 70, 3}, 6, DType::f64, 0.5),
       randn({1, 1, 70, 3}, 7)},
      "fused attention, 70 rows, GQA 2");
  check_grad(
      [&](const auto& in) {
        return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], fused)};
      },
      {randn({1, 4, 5, 2}, 8), randn({1, 1, 9, 2}, 9), randn({1, 1, 9, 2}, 10)},
      "fused attention, Sk > Sq, GQA 4");
  check_grad(
      [&](const auto& in) {
        return std::vector<Tensor>{scaled_dot_product_attention(
            in[0], in[1], in[2], {.causal = false, .scale = 0.7, .impl = AttentionImpl::fused})};
      },
      {randn({2, 2, 3, 2}, 11), randn({2, 1, 4, 2}, 12), randn({2, 1, 4, 2}, 13)},
      "fused attention, no mask, scale 0.7");
  // a sliding window of 20 over 70 rows (both sides of the block edge), GQA 2
  check_grad(
      [&](const auto& in) {
        return std::vector<Tensor>{scaled_dot_product_attention(
            in[0], in[1], in[2], {.impl = AttentionImpl::fused, .window = 20})};
      },
      {randn({1, 2, 70, 3}, 14, DType::f64, 0.5), randn({1, 1, 70, 3}, 15, DType::f64, 0.5),
       randn({1, 1, 70, 3}, 16)},
      "fused attention, sliding window 20, 70 rows, GQA 2");
}

// bf16 storage: both paths round q, k, v, the output and the gradients to bf16 and keep the
// rounded output for backward; the materialized path also keeps bf16 probabilities, the fused one
// recomputes them in f32 from the LSE. Measured: output 1.3e-5, dq 3.4e-3, dk 5.6e-3, dv 2.5e-3
// of the largest value (one or two bf16 ulps). Bound: 2^-7.
TEST(NnOpsFlashAttention, Bf16StorageWithinBound) {
  Tensor q = randn({1, 4, 130, 64}, 14, DType::bf16), k = randn({1, 2, 130, 64}, 15, DType::bf16),
         v = randn({1, 2, 130, 64}, 16, DType::bf16), g = randn({1, 4, 130, 64}, 17, DType::bf16);
  Result f = run(q, k, v, g, {.impl = AttentionImpl::fused});
  Result m = run(q, k, v, g, {.impl = AttentionImpl::materialized});
  EXPECT_EQ(f.y.dtype(), DType::bf16);
  EXPECT_CLOSE_REL(f.y, m.y, 1.0 / 128);
  EXPECT_CLOSE_REL(f.dq, m.dq, 1.0 / 128);
  EXPECT_CLOSE_REL(f.dk, m.dk, 1.0 / 128);
  EXPECT_CLOSE_REL(f.dv, m.dv, 1.0 / 128);
}

// bf16 matmul precision (f32 tensors, every product's inputs rounded to bf16, f32 accumulation):
// both paths against the f64 result. The probabilities are rounded to bf16 before P V and dS
// before dS K. Measured, relative to the largest value (fused / materialized): output 3.0e-3 /
// 4.6e-3, dq 4.2e-3 / 4.3e-3, dk 4.0e-3 / 5.6e-3, dv 3.1e-3 / 3.1e-3. Bound: 2^-6, and the fused
// error at most twice the materialized one plus 2^-10.
TEST(NnOpsFlashAttention, Bf16MatmulPrecisionWithinBound) {
  Tensor q = randn({1, 4, 130, 64}, 18, DType::f32), k = randn({1, 2, 130, 64}, 19, DType::f32),
         v = randn({1, 2, 130, 64}, 20, DType::f32), g = randn({1, 4, 130, 64}, 21, DType::f32);
  Result exact = run(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), g.to(DType::f64), {});
  blas::MatmulPrecisionScope bf16(blas::MatmulPrecision::bf16);
  Result f = run(q, k, v, g, {.impl = AttentionImpl::fused});
  Result m = run(q, k, v, g, {.impl = AttentionImpl::materialized});
  const Tensor Result::*fields[] = {&Result::y, &Result::dq, &Result::dk, &Result::dv};
  for (const Tensor Result::*t : fields) {
    const double ef = nxd::testing::diff(f.*t, exact.*t).rel();
    const double em = nxd::testing::diff(m.*t, exact.*t).rel();
    EXPECT_LT(ef, 1.0 / 64) << "fused " << ef << " materialized " << em;
    EXPECT_LT(ef, 2 * em + 1.0 / 1024) << "fused " << ef << " materialized " << em;
  }
}

TEST(NnOpsFlashAttention, MetaShapes) {
  Tensor q = empty({2, 8, 2048, 64}, DType::bf16, Device::meta),
         k = empty({2, 2, 2048, 64}, DType::bf16, Device::meta);
  for (AttentionImpl impl : {AttentionImpl::fused, AttentionImpl::materialized}) {
    Tensor y = scaled_dot_product_attention(q, k, k, {.impl = impl});
    EXPECT_TRUE(y.is_meta());
    EXPECT_EQ(y.shape(), (Shape{2, 8, 2048, 64}));
    EXPECT_EQ(y.dtype(), DType::bf16);
    // and a backward on the meta device (shape-only runs, modeled cost)
    Tensor qg = q.detach(), kg = k.detach();
    qg.set_requires_grad(true);
    kg.set_requires_grad(true);
    backward(scaled_dot_product_attention(qg, kg, kg, {.impl = impl}),
             empty({2, 8, 2048, 64}, DType::bf16, Device::meta));
    EXPECT_TRUE(qg.grad().is_meta());
    EXPECT_EQ(kg.grad().shape(), (Shape{2, 2, 2048, 64}));
  }
}

// The fused path keeps nothing quadratic: the peak bytes of a forward + backward above what was
// live before grow linearly with S (inputs are allocated before), the materialized path's with S^2.
TEST(NnOpsFlashAttention, PeakMemoryIsLinearInS) {
  auto peak = [](int64_t s, AttentionImpl impl) {
    Tensor q = randn({1, 4, s, 32}, 22, DType::f32), k = randn({1, 2, s, 32}, 23, DType::f32),
           v = randn({1, 2, s, 32}, 24, DType::f32), g = randn({1, 4, s, 32}, 25, DType::f32);
    MemoryCounter& mem = device_memory(Device::host);
    const int64_t before = mem.live();
    mem.reset_peak();
    run(q, k, v, g, {.impl = impl});
    return double(mem.peak() - before);
  };
  const double f512 = peak(512, AttentionImpl::fused), f1024 = peak(1024, AttentionImpl::fused);
  const double m1024 = peak(1024, AttentionImpl::materialized);
  EXPECT_LT(f1024, 2.2 * f512) << f512 << " -> " << f1024;
  EXPECT_LT(f1024, m1024 / 4) << "fused " << f1024 << " materialized " << m1024;
  // what the materialized path keeps: the [1, 4, 1024, 1024] f32 probabilities
  EXPECT_GT(m1024, 4.0 * 1024 * 1024 * 4);
}
