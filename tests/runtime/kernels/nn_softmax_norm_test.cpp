#include <gtest/gtest.h>

#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/norm.h"
#include "nxd/runtime/kernels/softmax.h"
#include "support/compare.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {
Tensor randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  Tensor t = empty(s, DType::f64);
  init::normal(t, RngStream{seed, 11}, 0.0, std);
  return t.to(dt);
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
      if (causal) EXPECT_EQ(y.at({1, 2, 2, 5}), 0.0);
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
