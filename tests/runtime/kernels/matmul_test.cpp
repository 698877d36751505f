#include "nxd/runtime/kernels/matmul.h"

#include <gtest/gtest.h>

#include <random>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "support/compare.h"

using namespace nxd;

namespace {

Tensor randn(const Shape& s, DType dt, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> nd;
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (double& x : v) x = nd(g);
  return from_doubles(v, s, dt);
}

// A [rows, cols] operand in one of four layouts: contiguous, transposed view, row-strided
// (narrowed columns, ld > cols) and transposed + strided.
Tensor operand(int64_t rows, int64_t cols, int layout, DType dt, uint32_t seed) {
  switch (layout) {
    case 0:
      return randn({rows, cols}, dt, seed);
    case 1:
      return randn({cols, rows}, dt, seed).t();
    case 2:
      return randn({rows, cols + 3}, dt, seed).narrow(1, 2, cols);
    default:
      return randn({cols, rows + 5}, dt, seed).narrow(1, 1, rows).t();
  }
}

struct CountingCost : CostModel {
  double flops = 0, bytes = 0;
  std::string last;
  DType dtype = DType::i64;
  void charge_compute(const char* op, double f, double b, DType t) override {
    flops += f;
    bytes += b;
    last = op;
    dtype = t;
  }
};

}  // namespace

TEST(MatmulKernel, EveryLayoutCombinationMatchesReference) {
  for (DType dt : {DType::f32, DType::f64}) {
    const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
    for (int la = 0; la < 4; ++la)
      for (int lb = 0; lb < 4; ++lb) {
        Tensor a = operand(13, 21, la, dt, 1 + la);
        Tensor b = operand(21, 9, lb, dt, 11 + lb);
        Tensor c = empty({13, 9}, dt), r = empty({13, 9}, DType::f64);
        kernels::gemm(c, a, b);
        kernels::ref::gemm(r, a.to(DType::f64), b.to(DType::f64));
        EXPECT_CLOSE_REL(c, r, tol) << dtype_name(dt) << " layouts " << la << "," << lb;
      }
  }
}

TEST(MatmulKernel, TransposedAndStridedOperandsAreNotCopied) {
  Tensor a = randn({64, 32}, DType::f32, 1).t();                   // [32,64] transposed view
  Tensor b = randn({48, 80}, DType::f32, 2).narrow(1, 8, 40).t();  // [40,48]^T: ld 80
  Tensor bb = randn({64, 40}, DType::f32, 3);
  Tensor c = empty({32, 40});
  Tensor ct = empty({40, 32}).t();  // a transposed output: computed as C^T = B^T A^T
  MemoryCounter& host = device_memory(Device::host);
  const int64_t live = host.live();
  host.reset_peak();
  kernels::gemm(c, a, bb);
  kernels::gemm(ct, a, bb);
  kernels::gemm(empty({48, 48}).narrow(1, 0, 48), b.t(), b);  // [48,40] @ [40,48]
  EXPECT_EQ(host.peak(), live + 48 * 48 * 4) << "a kernel allocated a temporary";
  Tensor r = empty({32, 40}, DType::f64);
  kernels::ref::gemm(r, a, bb);
  EXPECT_CLOSE_REL(c, r, 1e-5);
  EXPECT_CLOSE_REL(ct, r, 1e-5);
}

TEST(MatmulKernel, AlphaBetaAccumulate) {
  Tensor a = randn({7, 5}, DType::f64, 1), b = randn({5, 6}, DType::f64, 2);
  Tensor c0 = randn({7, 6}, DType::f64, 3);
  Tensor c = c0.clone(), r = c0.clone();
  kernels::gemm(c, a, b, 0.5, 1.0);
  kernels::ref::gemm(r, a, b, 0.5, 1.0);
  EXPECT_CLOSE_REL(c, r, 1e-13);
  // beta = 0 ignores NaNs already in c
  Tensor n = full({7, 6}, std::nan(""), DType::f64);
  kernels::gemm(n, a, b, 1.0, 0.0);
  kernels::ref::gemm(r, a, b);
  EXPECT_CLOSE_REL(n, r, 1e-13);
}

TEST(MatmulKernel, NonBlasLayoutsFallBackToCopies) {
  // inner stride 2 on every operand, including the output
  Tensor a = randn({6, 10}, DType::f32, 1).slice(1, 0, 10, 2);  // [6,5]
  Tensor b = randn({5, 8}, DType::f32, 2).slice(1, 0, 8, 2);    // [5,4]
  Tensor cbase = zeros({6, 8});
  Tensor c = cbase.slice(1, 1, 8, 2);  // [6,4], stride 2
  kernels::gemm(c, a, b, 1.0, 0.0);
  Tensor r = empty({6, 4}, DType::f64);
  kernels::ref::gemm(r, a, b);
  EXPECT_CLOSE_REL(c, r, 1e-5);
  EXPECT_EQ(cbase.at({0, 0}), 0.0);  // untouched gaps
}

TEST(MatmulKernel, BatchedBroadcastAndReduction) {
  struct Case {
    Shape a, b, c;
  };
  std::vector<Case> cases = {
      {{2, 1, 4, 5}, {3, 5, 6}, {2, 3, 4, 6}},     // broadcast batch
      {{2, 3, 4, 5}, {5, 6}, {2, 3, 4, 6}},        // shared b: folds into one gemm
      {{4, 5}, {3, 5, 6}, {3, 4, 6}},              // shared a
      {{3, 4, 5}, {3, 5, 6}, {4, 6}},              // summed batch: folds into k
      {{2, 3, 4, 5}, {2, 3, 5, 6}, {1, 3, 4, 6}},  // partly summed batch
      {{2, 3, 4, 5}, {3, 5, 6}, {2, 1, 4, 6}},     // summed over the broadcast of b
  };
  for (DType dt : {DType::f32, DType::f64})
    for (const Case& cs : cases) {
      Tensor a = randn(cs.a, dt, 1), b = randn(cs.b, dt, 2);
      Tensor c0 = randn(cs.c, dt, 3);
      Tensor c = c0.clone(), r = c0.to(DType::f64);
      kernels::bmm(c, a, b, 1.5, 0.5);
      kernels::ref::bmm(r, a.to(DType::f64), b.to(DType::f64), 1.5, 0.5);
      EXPECT_CLOSE_REL(c, r, dt == DType::f32 ? 1e-5 : 1e-12)
          << shape_str(cs.a) << " @ " << shape_str(cs.b) << " -> " << shape_str(cs.c);
    }
}

TEST(MatmulKernel, BatchedTransposedViews) {
  // the backward products of y[B,S,O] = x[B,S,H] @ w[O,H]^T, all through views
  Tensor x = randn({2, 7, 5}, DType::f32, 1), w = randn({6, 5}, DType::f32, 2);
  Tensor dy = randn({2, 7, 6}, DType::f32, 3);
  Tensor y = empty({2, 7, 6}), dx = empty({2, 7, 5}), dw = empty({6, 5});
  kernels::bmm(y, x, w.t());
  kernels::bmm(dx, dy, w);
  kernels::bmm(dw, dy.transpose(1, 2), x);
  Tensor ry = empty({2, 7, 6}, DType::f64), rdx = empty({2, 7, 5}, DType::f64),
         rdw = empty({6, 5}, DType::f64);
  kernels::ref::bmm(ry, x, w.t());
  kernels::ref::bmm(rdx, dy, w);
  kernels::ref::bmm(rdw, dy.transpose(1, 2), x);
  EXPECT_CLOSE_REL(y, ry, 1e-5);
  EXPECT_CLOSE_REL(dx, rdx, 1e-5);
  EXPECT_CLOSE_REL(dw, rdw, 1e-5);
  // a permuted (non-foldable) batch
  Tensor xp = randn({7, 2, 5}, DType::f32, 4).transpose(0, 1);
  Tensor yp = empty({2, 7, 6}), ryp = empty({2, 7, 6}, DType::f64);
  kernels::bmm(yp, xp, w.t());
  kernels::ref::bmm(ryp, xp, w.t());
  EXPECT_CLOSE_REL(yp, ryp, 1e-5);
}

TEST(MatmulKernel, Bf16ComputesInF32AndRoundsOnce) {
  Tensor a = randn({16, 24}, DType::bf16, 1), b = randn({24, 8}, DType::bf16, 2);
  Tensor c = empty({16, 8}, DType::bf16);
  kernels::gemm(c, a, b.t().contiguous().t());
  Tensor f = empty({16, 8});
  kernels::gemm(f, a.to(DType::f32), b.to(DType::f32));
  EXPECT_BITWISE_EQ(c, f.to(DType::bf16));  // the f32 product, rounded once
  Tensor r = empty({16, 8}, DType::f64);
  kernels::ref::gemm(r, a, b);
  EXPECT_ALLCLOSE(c, r, 1.0 / 128, 1e-6);
}

TEST(MatmulKernel, MetaComputesNothingButCharges) {
  auto cost = std::make_shared<CountingCost>();
  Context ctx;
  ctx.set_cost_model(cost);
  ContextGuard g(ctx);
  Tensor a = empty({8, 128, 64}, DType::bf16, Device::meta);
  Tensor b = empty({64, 32}, DType::bf16, Device::meta);
  Tensor c = empty({8, 128, 32}, DType::bf16, Device::meta);
  kernels::bmm(c, a, b);
  EXPECT_EQ(cost->last, "matmul");
  EXPECT_DOUBLE_EQ(cost->flops, 2.0 * 8 * 128 * 64 * 32);
  EXPECT_DOUBLE_EQ(cost->bytes, 2.0 * (8 * 128 * 64 + 64 * 32 + 8 * 128 * 32));
  // a meta input with a host output is an error
  EXPECT_THROW(kernels::bmm(empty({8, 128, 32}, DType::bf16), a, b), InvalidArgument);
}

TEST(MatmulKernel, Bf16MatmulPrecisionChargesAtTheBf16Rate) {
  auto cost = std::make_shared<CountingCost>();
  Context ctx;
  ctx.set_cost_model(cost);
  ContextGuard g(ctx);
  Tensor a = empty({16, 8}, DType::f32, Device::meta), b = empty({8, 4}, DType::f32, Device::meta);
  Tensor c = empty({16, 4}, DType::f32, Device::meta);
  kernels::bmm(c, a, b);
  EXPECT_EQ(cost->dtype, DType::f32);
  {
    blas::MatmulPrecisionScope bf16(blas::MatmulPrecision::bf16);
    kernels::bmm(c, a, b);
    EXPECT_EQ(cost->dtype, DType::bf16);  // an auto-cast matmul runs at the core's bf16 peak
    EXPECT_EQ(blas::matmul_compute_dtype(DType::f64), DType::f64);  // f64 is never rounded
  }
  kernels::bmm(c, a, b);
  EXPECT_EQ(cost->dtype, DType::f32);
}

TEST(MatmulKernel, ShapesAndErrors) {
  EXPECT_EQ(kernels::matmul_shape({3}, {3}), (Shape{}));
  EXPECT_EQ(kernels::matmul_shape({2, 3}, {3}), (Shape{2}));
  EXPECT_EQ(kernels::matmul_shape({3}, {3, 4}), (Shape{4}));
  EXPECT_EQ(kernels::matmul_shape({5, 1, 2, 3}, {4, 3, 6}), (Shape{5, 4, 2, 6}));
  try {
    kernels::gemm(empty({8, 16}), empty({8, 64}), empty({32, 16}));
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "[matmul] inner dims differ: a=f32[8,64] b=f32[32,16]");
  }
  EXPECT_THROW(kernels::matmul_shape({2, 3}, {4, 5}), ShapeError);
  EXPECT_THROW(kernels::matmul_shape({2, 2, 3}, {3, 3, 5}), ShapeError);
  EXPECT_THROW(kernels::gemm(empty({8, 16}), empty({8, 4}), empty({4, 16}, DType::f64)),
               InvalidArgument);
  EXPECT_THROW(kernels::gemm(empty({8, 15}), empty({8, 4}), empty({4, 16})), ShapeError);
  EXPECT_THROW(kernels::bmm(empty({2, 8, 16}), empty({3, 8, 4}), empty({4, 16})), ShapeError);
  EXPECT_THROW(kernels::gemm(empty({2, 2}, DType::i32), empty({2, 2}, DType::i32),
                             empty({2, 2}, DType::i32)),
               InvalidArgument);
}

TEST(MatmulKernel, EmptyInnerDimScalesByBeta) {
  Tensor c = full({3, 4}, 2.0);
  kernels::gemm(c, empty({3, 0}), empty({0, 4}), 1.0, 0.5);
  EXPECT_CLOSE_REL(c, full({3, 4}, 1.0), 0.0);
}
