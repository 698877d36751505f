#include <gtest/gtest.h>

#include <cmath>

#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/activation.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {
Tensor randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return nxd::testing::randn_from(s, dt, {seed, 12}, std);
}
// Eigen's vectorized exp/tanh/erf for f32 are accurate to a few ulp.
double tol(DType dt) {
  return dt == DType::f64 ? 1e-13 : 1e-6;
}
}  // namespace

class NnActivation : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(Dtypes, NnActivation, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

TEST_P(NnActivation, GeluBothFormsMatchReference) {
  DType dt = GetParam();
  // 5000 elements: more than one 2048 block, with a ragged tail; wide range incl. tails
  Tensor x = randn({5000}, dt, 1, 4.0), dy = randn({5000}, dt, 2);
  for (bool th : {true, false}) {
    Tensor y = empty_like(x), r = empty_like(x), dx = empty_like(x), dr = empty_like(x);
    k::gelu_forward(y, x, th);
    k::ref::gelu_forward(r, x, th);
    // f32: 1 + erf(x) and 1 + tanh(.) cancel in the far negative tail (as in PyTorch), so the
    // bound is relative to the largest value rather than elementwise
    EXPECT_CLOSE_REL(y, r, tol(dt));
    k::gelu_backward(dx, dy, x, th);
    k::ref::gelu_backward(dr, dy, x, th);
    EXPECT_CLOSE_REL(dx, dr, 4 * tol(dt));
  }
  // known values: gelu_erf(1) = 0.8413447460685429, gelu_tanh(1) = 0.8411919906082768
  Tensor one = full({1}, 1.0, dt), y = empty_like(one);
  k::gelu_forward(y, one, false);
  EXPECT_NEAR(y.item(), 0.8413447460685429, tol(dt));
  k::gelu_forward(y, one, true);
  EXPECT_NEAR(y.item(), 0.8411919906082768, tol(dt));
}

TEST_P(NnActivation, SiluAndSwigluMatchReference) {
  DType dt = GetParam();
  Tensor g = randn({3, 1111}, dt, 3, 5.0), u = randn({3, 1111}, dt, 4),
         dy = randn({3, 1111}, dt, 5);
  Tensor y = empty_like(g), r = empty_like(g), dx = empty_like(g), dr = empty_like(g);
  k::silu_forward(y, g);
  k::ref::silu_forward(r, g);
  EXPECT_ALLCLOSE(y, r, tol(dt), tol(dt));
  k::silu_backward(dx, dy, g);
  k::ref::silu_backward(dr, dy, g);
  EXPECT_ALLCLOSE(dx, dr, 2 * tol(dt), 2 * tol(dt));
  k::swiglu_forward(y, g, u);
  k::ref::swiglu_forward(r, g, u);
  EXPECT_ALLCLOSE(y, r, 2 * tol(dt), 2 * tol(dt));
  Tensor dg = empty_like(g), du = empty_like(g), dgr = empty_like(g), dur = empty_like(g);
  k::swiglu_backward(dg, du, dy, g, u);
  k::ref::swiglu_backward(dgr, dur, dy, g, u);
  EXPECT_ALLCLOSE(dg, dgr, 4 * tol(dt), 4 * tol(dt));
  EXPECT_ALLCLOSE(du, dur, 2 * tol(dt), 2 * tol(dt));
  // one gradient only
  Tensor du2 = empty_like(g);
  k::swiglu_backward(Tensor(), du2, dy, g, u);
  EXPECT_BITWISE_EQ(du2, du);
}

TEST(NnActivationMisc, ExtremeInputsStayFinite) {
  Tensor x = from_doubles({-1000, -80, 0, 80, 1000}, {5}), y = empty_like(x), dx = empty_like(x);
  k::silu_forward(y, x);
  for (double v : y.to_vector()) EXPECT_TRUE(std::isfinite(v)) << y;
  k::silu_backward(dx, ones({5}), x);
  for (double v : dx.to_vector()) EXPECT_TRUE(std::isfinite(v)) << dx;
  k::gelu_forward(y, x, true);
  EXPECT_EQ(y.at({4}), 1000.0);
  EXPECT_EQ(y.at({0}), 0.0);
}

TEST(NnActivationMisc, MetaAndErrors) {
  Tensor g = empty({4, 6}, DType::f32, Device::meta), y = empty_like(g);
  k::swiglu_forward(y, g, g);
  k::gelu_forward(y, g, false);
  EXPECT_TRUE(y.is_meta());
  try {
    k::swiglu_forward(empty({4, 6}), zeros({4, 6}), zeros({4, 5}));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[swiglu_forward] up is f32[4,5]"), std::string::npos)
        << e.what();
  }
}
