#include "nxd/runtime/kernels/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "support/compare.h"

using namespace nxd;
using kernels::Binary;
using kernels::Unary;

namespace {

Tensor uniform(const Shape& s, DType dt, uint32_t seed, double lo = -2, double hi = 2) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (double& x : v) x = u(g);
  return from_doubles(v, s, dt);
}

const std::vector<Unary> kUnary = {Unary::neg,       Unary::exp,  Unary::log,     Unary::sqrt,
                                   Unary::rsqrt,     Unary::tanh, Unary::sigmoid, Unary::relu,
                                   Unary::square,    Unary::abs,  Unary::pow,     Unary::add_scalar,
                                   Unary::mul_scalar};
bool positive_domain(Unary op) {
  return op == Unary::log || op == Unary::sqrt || op == Unary::rsqrt || op == Unary::pow;
}
// std:: definitions, independent of the kernels' own formulas.
double direct(Unary op, double x, double p) {
  switch (op) {
    case Unary::neg:
      return -x;
    case Unary::exp:
      return std::exp(x);
    case Unary::log:
      return std::log(x);
    case Unary::sqrt:
      return std::sqrt(x);
    case Unary::rsqrt:
      return 1 / std::sqrt(x);
    case Unary::tanh:
      return std::tanh(x);
    case Unary::sigmoid:
      return 1 / (1 + std::exp(-x));
    case Unary::relu:
      return std::max(x, 0.0);
    case Unary::square:
      return x * x;
    case Unary::abs:
      return std::fabs(x);
    case Unary::pow:
      return std::pow(x, p);
    case Unary::add_scalar:
      return x + p;
    case Unary::mul_scalar:
      return x * p;
  }
  return 0;
}

}  // namespace

TEST(ElementwiseKernel, UnaryMatchesStdOnContiguousAndStrided) {
  for (DType dt : {DType::f32, DType::f64})
    for (Unary op : kUnary) {
      const double p = op == Unary::pow ? 1.7 : 0.75;
      Tensor base = positive_domain(op) ? uniform({9, 37}, dt, 3, 0.1, 3) : uniform({9, 37}, dt, 3);
      for (bool strided : {false, true}) {
        Tensor x = strided ? base.t() : base;  // [37,9] transposed view
        Tensor y = strided ? empty({9, 37}, dt).t() : empty(x.shape(), dt);
        kernels::unary(y, x, op, p);
        std::vector<double> xv = x.to_vector(), want(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) want[i] = direct(op, xv[i], p);
        Tensor r = from_doubles(want, x.shape(), DType::f64);
        EXPECT_CLOSE_REL(y, r, dt == DType::f32 ? 1e-6 : 1e-14)
            << kernels::unary_name(op) << " " << dtype_name(dt) << (strided ? " strided" : "");
        Tensor rr = empty(x.shape(), DType::f64);
        kernels::ref::unary(rr, x.to(DType::f64), op, p);
        EXPECT_CLOSE_REL(rr, r, 1e-14) << kernels::unary_name(op);
      }
    }
}

TEST(ElementwiseKernel, UnaryBackwardMatchesCentralDifferences) {
  for (DType dt : {DType::f64, DType::f32})
    for (Unary op : kUnary) {
      const double p = op == Unary::pow ? 2.5 : -1.25;
      std::vector<double> xv = positive_domain(op)
                                   ? uniform({5, 11}, DType::f64, 7, 0.2, 3).to_vector()
                                   : uniform({5, 11}, DType::f64, 7).to_vector();
      for (double& v : xv) v = v < 0 ? v - 0.05 : v + 0.05;  // away from relu/abs kinks
      Tensor x = from_doubles(xv, {5, 11}, dt);
      Tensor y = empty({5, 11}, dt);
      kernels::unary(y, x, op, p);
      Tensor dy = uniform({11}, dt, 9);  // broadcast over rows
      Tensor dx = empty({5, 11}, dt);
      kernels::unary_backward(dx, dy, x, y, op, p);
      std::vector<double> dyv = dy.to_vector(), want(xv.size());
      const double h = 1e-6;
      for (size_t i = 0; i < xv.size(); ++i) {
        double xi = x.to_vector()[i];
        want[i] = dyv[i % 11] * (direct(op, xi + h, p) - direct(op, xi - h, p)) / (2 * h);
      }
      EXPECT_CLOSE_REL(dx, from_doubles(want, {5, 11}, DType::f64), dt == DType::f32 ? 1e-5 : 1e-8)
          << kernels::unary_name(op) << " " << dtype_name(dt);
    }
}

TEST(ElementwiseKernel, BinaryBroadcastingMatchesReference) {
  struct Case {
    Shape a, b;
  };
  std::vector<Case> cases = {{{4, 7}, {4, 7}},       {{3, 1, 5}, {4, 1}}, {{6, 8}, {8}},
                             {{6, 8}, {6, 1}},       {{}, {3, 2}},        {{2, 3, 4}, {}},
                             {{1, 4, 1}, {3, 1, 6}}, {{129}, {129}}};
  const std::vector<Binary> ops = {Binary::add, Binary::sub,     Binary::mul,
                                   Binary::div, Binary::maximum, Binary::minimum};
  for (DType dt : {DType::f32, DType::f64})
    for (const Case& cs : cases)
      for (Binary op : ops) {
        Tensor a = uniform(cs.a, dt, 1), b = uniform(cs.b, dt, 2, 0.5, 2);
        Shape s = broadcast_shapes(cs.a, cs.b, "test");
        Tensor out = empty(s, dt), r = empty(s, DType::f64);
        kernels::binary(out, a, b, op);
        kernels::ref::binary(r, a.to(DType::f64), b.to(DType::f64), op);
        EXPECT_CLOSE_REL(out, r, dt == DType::f32 ? 1e-6 : 1e-15)
            << kernels::binary_name(op) << " " << shape_str(cs.a) << " " << shape_str(cs.b);
      }
  // a spot check of the reference itself: [2,1] - [3] = [[a0-b0, a0-b1, a0-b2], ...]
  Tensor a = from_doubles({1, 2}, {2, 1}, DType::f64),
         b = from_doubles({10, 20, 30}, {3}, DType::f64);
  Tensor r = empty({2, 3}, DType::f64);
  kernels::ref::binary(r, a, b, Binary::sub);
  EXPECT_EQ(r.to_vector(), (std::vector<double>{-9, -19, -29, -8, -18, -28}));
}

TEST(ElementwiseKernel, BinaryOnNonContiguousViews) {
  Tensor a = uniform({8, 6}, DType::f32, 1).t();                  // [6,8]
  Tensor b = uniform({6, 16}, DType::f32, 2).slice(1, 0, 16, 2);  // [6,8] stride 2
  Tensor obase = zeros({8, 6});
  Tensor out = obase.t();
  kernels::binary(out, a, b, Binary::mul);
  Tensor r = empty({6, 8}, DType::f64);
  kernels::ref::binary(r, a, b, Binary::mul);
  EXPECT_CLOSE_REL(out, r, 1e-7);
  EXPECT_CLOSE_REL(obase.t(), r, 1e-7);
}

TEST(ElementwiseKernel, Bf16RoundsOnce) {
  // bf16 values in [0.5, 2): their sum and product are exact in f32, so rounding once gives
  // exactly the correctly rounded result
  Tensor a = uniform({3, 50}, DType::bf16, 1, 0.5, 2), b = uniform({50}, DType::bf16, 2, 0.5, 2);
  for (Binary op : {Binary::add, Binary::mul}) {
    Tensor out = empty({3, 50}, DType::bf16), r = empty({3, 50}, DType::f64);
    kernels::binary(out, a, b, op);
    kernels::ref::binary(r, a.to(DType::f64), b.to(DType::f64), op);
    EXPECT_BITWISE_EQ(out, r.to(DType::f32).to(DType::bf16));
  }
  Tensor y = empty({3, 50}, DType::bf16), f = empty({3, 50});
  kernels::unary(y, a, Unary::exp);
  kernels::unary(f, a.to(DType::f32), Unary::exp);
  EXPECT_BITWISE_EQ(y, f.to(DType::bf16));
}

TEST(ElementwiseKernel, MetaAndErrors) {
  Tensor m = empty({4, 5}, DType::f32, Device::meta);
  Tensor out = empty({3, 4, 5}, DType::f32, Device::meta);
  kernels::binary(out, m, empty({3, 1, 5}, DType::f32, Device::meta), Binary::add);
  kernels::unary(empty({4, 5}, DType::f32, Device::meta), m, Unary::exp);
  EXPECT_THROW(kernels::unary(empty({4, 5}), m, Unary::exp), InvalidArgument);
  try {
    kernels::binary(empty({3, 4}), empty({3, 4}), empty({5}), Binary::add);
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "[add] b f32[5] does not broadcast to the output f32[3,4]");
  }
  EXPECT_THROW(kernels::binary(empty({3}), empty({3}), empty({3}, DType::f64), Binary::mul),
               InvalidArgument);
  EXPECT_THROW(kernels::unary(empty({3}, DType::i64), empty({3}, DType::i64), Unary::neg),
               InvalidArgument);
  EXPECT_THROW(kernels::unary_backward(empty({3}), empty({3}), Tensor(), Tensor(), Unary::exp),
               InvalidArgument);
}
