#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/attention.h"
#include "nxd/runtime/kernels/norm.h"
#include "nxd/runtime/kernels/reduce.h"
#include "nxd/runtime/kernels/softmax.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {
Tensor randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return nxd::testing::randn_from(s, dt, {seed, 11}, std);
}
double tol(DType dt) {
  return dt == DType::f64 ? 1e-12 : 2e-6;
}
}  // namespace

class NnKernelF : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(Dtypes, NnKernelF, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

TEST_P(NnKernelF, SoftmaxMatchesReference) {
  DType dt = GetParam();
  for (bool causal : {false, true}) {
    for (double scale : {1.0, 0.125}) {
      Tensor x = randn({2, 3, 7, 7}, dt, 1, 3.0), y = empty_like(x), r = empty_like(x);
      k::softmax_forward(y, x, scale, causal);
      k::ref::softmax_forward(r, x, scale, causal);
      EXPECT_CLOSE_REL(y, r, tol(dt));
      if (causal) {
        EXPECT_EQ(y.at({1, 2, 2, 5}), 0.0);
      }
      Tensor dy = randn(x.shape(), dt, 2), dx = empty_like(x), dr = empty_like(x);
      k::softmax_backward(dx, dy, y, scale);
      k::ref::softmax_backward(dr, dy, y, scale);
      EXPECT_CLOSE_REL(dx, dr, tol(dt) * 5);
    }
  }
  // a strided input is read through a copy
  Tensor x = randn({5, 9}, dt, 3), y = empty({9, 5}, dt), r = empty({9, 5}, dt);
  k::softmax_forward(y, x.t(), 1.0, false);
  k::ref::softmax_forward(r, x.t(), 1.0, false);
  EXPECT_CLOSE_REL(y, r, tol(dt));
}

TEST_P(NnKernelF, LogSoftmaxMatchesReference) {
  DType dt = GetParam();
  Tensor x = randn({6, 33}, dt, 4, 5.0), y = empty_like(x), r = empty_like(x);
  k::log_softmax_forward(y, x);
  k::ref::log_softmax_forward(r, x);
  EXPECT_CLOSE_REL(y, r, tol(dt));
  Tensor dy = randn(x.shape(), dt, 5), dx = empty_like(x), dr = empty_like(x);
  k::log_softmax_backward(dx, dy, y);
  k::ref::log_softmax_backward(dr, dy, y);
  EXPECT_CLOSE_REL(dx, dr, tol(dt) * 5);
}

TEST(NnKernel, SoftmaxLargeLogitsStable) {
  Tensor x = from_doubles({1000, 1001, -1000}, {1, 3}), y = empty_like(x);
  k::softmax_forward(y, x);
  EXPECT_NEAR(y.at({0, 1}), 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_EQ(y.at({0, 2}), 0.0);
}

TEST_P(NnKernelF, LayerNormMatchesReference) {
  DType dt = GetParam();
  for (bool affine : {true, false}) {
    Tensor x = randn({3, 5, 40}, dt, 6, 2.0), w = randn({40}, dt, 7), b = randn({40}, dt, 8);
    if (!affine) w = Tensor(), b = Tensor();
    Tensor y = empty_like(x), m = empty({3, 5}, dt), rs = empty({3, 5}, dt);
    Tensor yr = empty_like(x), mr = empty({3, 5}, dt), rsr = empty({3, 5}, dt);
    k::layer_norm_forward(y, m, rs, x, w, b, 1e-5);
    k::ref::layer_norm_forward(yr, mr, rsr, x, w, b, 1e-5);
    EXPECT_CLOSE_REL(y, yr, tol(dt) * 2);
    EXPECT_CLOSE_REL(rs, rsr, tol(dt));
    Tensor dy = randn(x.shape(), dt, 9), dx = empty_like(x), dxr = empty_like(x);
    Tensor dw = affine ? empty({40}, dt) : Tensor(), db = affine ? empty({40}, dt) : Tensor();
    Tensor dwr = affine ? empty({40}, dt) : Tensor(), dbr = affine ? empty({40}, dt) : Tensor();
    k::layer_norm_backward(dx, dw, db, dy, x, m, rs, w);
    k::ref::layer_norm_backward(dxr, dwr, dbr, dy, x, m, rs, w);
    EXPECT_CLOSE_REL(dx, dxr, tol(dt) * 5);
    if (affine) {
      EXPECT_CLOSE_REL(dw, dwr, tol(dt) * 5);
      EXPECT_CLOSE_REL(db, dbr, tol(dt) * 5);
    }
  }
}

TEST_P(NnKernelF, RmsNormMatchesReference) {
  DType dt = GetParam();
  Tensor x = randn({4, 3, 24}, dt, 10, 2.0), w = randn({24}, dt, 11);
  Tensor y = empty_like(x), rs = empty({4, 3}, dt), yr = empty_like(x), rsr = empty({4, 3}, dt);
  k::rms_norm_forward(y, rs, x, w, 1e-6);
  k::ref::rms_norm_forward(yr, rsr, x, w, 1e-6);
  EXPECT_CLOSE_REL(y, yr, tol(dt) * 2);
  EXPECT_CLOSE_REL(rs, rsr, tol(dt));
  Tensor dy = randn(x.shape(), dt, 12), dx = empty_like(x), dxr = empty_like(x);
  Tensor dw = empty({24}, dt), dwr = empty({24}, dt);
  k::rms_norm_backward(dx, dw, dy, x, rs, w);
  k::ref::rms_norm_backward(dxr, dwr, dy, x, rs, w);
  EXPECT_CLOSE_REL(dx, dxr, tol(dt) * 5);
  EXPECT_CLOSE_REL(dw, dwr, tol(dt) * 5);
}

TEST(NnKernel, NormsMetaOnlyShapes) {
  Tensor x = empty({2, 3, 8}, DType::f32, Device::meta), w = empty({8}, DType::f32, Device::meta);
  Tensor y = empty_like(x), m = empty({2, 3}, DType::f32, Device::meta), rs = empty_like(m);
  k::layer_norm_forward(y, m, rs, x, w, w, 1e-5);
  k::rms_norm_forward(y, rs, x, w, 1e-6);
  k::softmax_forward(y, x, 1.0, true);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.shape(), (Shape{2, 3, 8}));
}

TEST(NnKernel, NormErrorsNameShapes) {
  Tensor x = zeros({2, 8}), w = zeros({7}), y = empty_like(x), rs = empty({2});
  try {
    k::rms_norm_forward(y, rs, x, w, 1e-6);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[rms_norm_forward] weight is f32[7]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(k::softmax_forward(empty({2, 8}, DType::i32), zeros({2, 8}, DType::i32)),
               InvalidArgument);
}

// Bitwise determinism must not depend on where a buffer happens to live: the same values at
// differently aligned addresses (an attention scratch row, a view at an offset) must give the same
// bits. Eigen's vectorized .sum() of a Map peels scalars up to the first aligned packet, so its
// summation order used to follow the address (two trainings in one process differed).
namespace {
// x's values copied into a fresh buffer starting `off` elements in, as a view of x's shape.
Tensor at_offset(const Tensor& x, int64_t off) {
  Tensor base = full({x.numel() + 16}, std::nan(""), x.dtype());
  Tensor v = base.narrow(0, off, x.numel()).view(x.shape());
  v.copy_(x);
  return v;
}
}  // namespace

TEST_P(NnKernelF, ResultsDoNotDependOnTheAddress) {
  DType dt = GetParam();
  const Shape s{3, 100};
  Tensor x = randn(s, dt, 21, 3.0), dy = randn(s, dt, 22);
  Tensor y0, ly0, ldx0, n0, m0, r0, sum0;
  for (int64_t off = 0; off < 16; ++off) {
    SCOPED_TRACE(off);
    Tensor xo = at_offset(x, off), dyo = at_offset(dy, off);
    Tensor y = at_offset(empty(s, dt), off), ly = at_offset(empty(s, dt), off);
    Tensor ldx = at_offset(empty(s, dt), off), n = at_offset(empty(s, dt), off);
    Tensor m = empty({3}, dt), r = empty({3}, dt), sm = empty({3, 1}, dt);
    k::softmax_forward(y, xo);
    k::log_softmax_forward(ly, xo);
    k::log_softmax_backward(ldx, dyo, ly);
    k::layer_norm_forward(n, m, r, xo, Tensor(), Tensor(), 1e-5);
    k::sum_to(sm, xo);
    if (off == 0) {
      y0 = y.clone(), ly0 = ly.clone(), ldx0 = ldx.clone(), n0 = n.clone(), m0 = m, r0 = r;
      sum0 = sm;
      continue;
    }
    EXPECT_BITWISE_EQ(y, y0);
    EXPECT_BITWISE_EQ(ly, ly0);
    EXPECT_BITWISE_EQ(ldx, ldx0);
    EXPECT_BITWISE_EQ(n, n0);
    EXPECT_BITWISE_EQ(m, m0);
    EXPECT_BITWISE_EQ(r, r0);
    EXPECT_BITWISE_EQ(sm, sum0);
  }
  // The attention kernel without saved probabilities (eval / no grad) works in a std::vector
  // scratch: the same bits as with probabilities in a tensor.
  Tensor q = randn({1, 2, 40, 8}, dt, 23), kk = randn({1, 2, 40, 8}, dt, 24),
         v = randn({1, 2, 40, 8}, dt, 25);
  Tensor o1 = empty(q.shape(), dt), o2 = empty(q.shape(), dt), p = empty({1, 2, 40, 40}, dt);
  k::attention_forward(o1, p, q, kk, v, true, 0.0);
  std::vector<std::vector<char>> blobs;  // kept alive: moves the heap scratch around
  for (int64_t i = 0; i < 16; ++i) {
    SCOPED_TRACE(i);
    blobs.emplace_back(16 * i + 8);
    k::attention_forward(o2, Tensor(), q, kk, v, true, 0.0);
    EXPECT_BITWISE_EQ(o2, o1);
  }
}
