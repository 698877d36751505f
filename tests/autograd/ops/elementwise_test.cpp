#include <gtest/gtest.h>

#include <random>

#include "nxd/autograd/ops.h"
#include "nxd/runtime/kernels/elementwise.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using autograd::gradcheck;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {

Tensor uniform(const Shape& s, uint32_t seed, double lo = -2, double hi = 2,
               DType dt = DType::f64) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (double& x : v) x = u(g);
  return from_doubles(v, s, dt);
}

using BinFn = Tensor (*)(const Tensor&, const Tensor&);

}  // namespace

TEST(ElementwiseOps, BinaryForwardMatchesReference) {
  const std::vector<std::pair<BinFn, kernels::Binary>> ops = {
      {static_cast<BinFn>(add), kernels::Binary::add},
      {static_cast<BinFn>(sub), kernels::Binary::sub},
      {static_cast<BinFn>(mul), kernels::Binary::mul},
      {static_cast<BinFn>(div), kernels::Binary::div}};
  Tensor a = uniform({3, 1, 5}, 1, -2, 2, DType::f32);
  Tensor b = uniform({4, 1}, 2, 0.5, 2, DType::f32);
  for (auto [f, op] : ops) {
    Tensor y = f(a, b);
    ASSERT_EQ(y.shape(), (Shape{3, 4, 5}));
    Tensor r = empty({3, 4, 5}, DType::f64);
    kernels::ref::binary(r, a.to(DType::f64), b.to(DType::f64), op);
    EXPECT_CLOSE_REL(y, r, 1e-6) << kernels::binary_name(op);
  }
  // operators and scalars
  Tensor c = (a * 2.0 + 1.0 - a / 4.0) * b;
  Tensor r = empty({3, 4, 5}, DType::f64);
  std::vector<double> av = a.expand({3, 4, 5}).to_vector(), bv = b.expand({3, 4, 5}).to_vector();
  std::vector<double> want(av.size());
  for (size_t i = 0; i < av.size(); ++i) want[i] = (av[i] * 2 + 1 - av[i] / 4) * bv[i];
  EXPECT_CLOSE_REL(c, from_doubles(want, {3, 4, 5}, DType::f64), 1e-6);
  EXPECT_CLOSE_REL(-a, mul(a, -1.0), 0.0);
}

TEST(ElementwiseOps, BinaryGradcheckWithBroadcasting) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 4}, {3, 4}}, {{3, 1, 4}, {2, 1}}, {{}, {3}}, {{2, 3}, {3}}, {{5}, {2, 1, 1}}};
  const std::vector<BinFn> fns = {static_cast<BinFn>(add), static_cast<BinFn>(sub),
                                  static_cast<BinFn>(mul), static_cast<BinFn>(div)};
  for (const auto& [sa, sb] : shapes)
    for (size_t k = 0; k < fns.size(); ++k) {
      BinFn f = fns[k];
      check_grad([f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x[0], x[1])}; },
                 {uniform(sa, 1), uniform(sb, 2, 0.5, 2)},
                 str("op ", k, " ", shape_str(sa), " ", shape_str(sb)));
    }
}

TEST(ElementwiseOps, BinaryGradcheckOnNonContiguousInputs) {
  // a transposed view and a strided slice enter the ops
  auto fn = [](const std::vector<Tensor>& x) {
    Tensor at = transpose(x[0], 0, 1);    // [5,3]
    Tensor bs = slice(x[1], 1, 0, 6, 2);  // [5,3] stride 2
    return std::vector<Tensor>{div(mul(at, bs), add(bs, 3.0)), sub(at, bs)};
  };
  check_grad(fn, {uniform({3, 5}, 3), uniform({5, 6}, 4, 0.5, 2)});
}

TEST(ElementwiseOps, UnaryGradcheck) {
  using UFn = Tensor (*)(const Tensor&);
  const std::vector<std::pair<const char*, UFn>> pos = {
      {"log", log}, {"sqrt", sqrt}, {"rsqrt", rsqrt}};
  const std::vector<std::pair<const char*, UFn>> any = {
      {"neg", neg},   {"exp", exp},       {"tanh", tanh}, {"sigmoid", sigmoid},
      {"relu", relu}, {"square", square}, {"abs", abs}};
  for (auto [name, f] : pos)
    check_grad(
        [f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(narrow(x[0], 1, 1, 3))}; },
        {uniform({4, 5}, 5, 0.3, 3)}, name);
  // values kept away from the kinks of relu and abs
  std::vector<double> v = uniform({4, 5}, 6).to_vector();
  for (double& x : v) x += x < 0 ? -0.1 : 0.1;
  for (auto [name, f] : any)
    check_grad(
        [f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(transpose(x[0], 0, 1))}; },
        {from_doubles(v, {4, 5}, DType::f64)}, name);
  check_grad(
      [](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{pow(x[0], 2.5), pow(x[0], 2.0), pow(x[0], -0.5), add(x[0], 3.0),
                                   mul(x[0], -1.5)};
      },
      {uniform({6}, 7, 0.3, 3)}, "pow/add/mul scalar");
}

TEST(ElementwiseOps, UnaryForwardMatchesStd) {
  Tensor x = uniform({50}, 8, 0.1, 3, DType::f32);
  std::vector<double> xv = x.to_vector();
  auto check = [&](const Tensor& y, double (*f)(double), const char* name) {
    std::vector<double> w(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) w[i] = f(xv[i]);
    EXPECT_CLOSE_REL(y, from_doubles(w, {50}, DType::f64), 1e-6) << name;
  };
  check(
      exp(x), [](double v) { return std::exp(v); }, "exp");
  check(
      log(x), [](double v) { return std::log(v); }, "log");
  check(
      sqrt(x), [](double v) { return std::sqrt(v); }, "sqrt");
  check(
      rsqrt(x), [](double v) { return 1 / std::sqrt(v); }, "rsqrt");
  check(
      tanh(x), [](double v) { return std::tanh(v); }, "tanh");
  check(
      sigmoid(x), [](double v) { return 1 / (1 + std::exp(-v)); }, "sigmoid");
  check(
      pow(x, 1.5), [](double v) { return std::pow(v, 1.5); }, "pow");
  check(
      relu(add(x, -1.0)), [](double v) { return std::max(v - 1, 0.0); }, "relu");
}

TEST(ElementwiseOps, Bf16ForwardAndGradientDtype) {
  Tensor a = uniform({4, 8}, 9, 0.5, 2, DType::bf16).set_requires_grad(true);
  Tensor b = uniform({8}, 10, 0.5, 2, DType::bf16).set_requires_grad(true);
  Tensor y = mul(a, b);
  EXPECT_EQ(y.dtype(), DType::bf16);
  Tensor r = empty({4, 8}, DType::f64);
  kernels::ref::binary(r, a.detach(), b.detach(), kernels::Binary::mul);
  EXPECT_BITWISE_EQ(y.detach(), r.to(DType::f32).to(DType::bf16));  // exact product, rounded once
  backward(sum(y));
  ASSERT_TRUE(b.grad().defined());
  EXPECT_EQ(b.grad().dtype(), DType::bf16);
  EXPECT_EQ(b.grad().shape(), (Shape{8}));
  // db[j] = sum_i a[i,j]
  std::vector<double> av = a.detach().to_vector(), want(8, 0.0);
  for (size_t i = 0; i < av.size(); ++i) want[i % 8] += av[i];
  EXPECT_ALLCLOSE(b.grad(), from_doubles(want, {8}, DType::f64), 1.0 / 128, 0.0);
}

TEST(ElementwiseOps, MetaInputsGiveMetaOutputs) {
  Tensor a = empty({3, 1}, DType::f32, Device::meta).set_requires_grad(true);
  Tensor b = empty({4}, DType::f32, Device::meta);
  Tensor y = exp(add(a, b) * b);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.shape(), (Shape{3, 4}));
  Tensor h = add(zeros({3, 4}), b);  // a host tensor with a meta one: meta
  EXPECT_TRUE(h.is_meta());
  backward(y, empty({3, 4}, DType::f32, Device::meta));
  ASSERT_TRUE(a.grad().defined());
  EXPECT_TRUE(a.grad().is_meta());
  EXPECT_EQ(a.grad().shape(), (Shape{3, 1}));
}

TEST(ElementwiseOps, ErrorsNameOpAndShapes) {
  try {
    add(zeros({3, 4}), zeros({5}));
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "[add] shapes do not broadcast: [3,4] and [5]");
  }
  try {
    mul(zeros({3}), zeros({3}, DType::f64));
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "[mul] needs two floating tensors of one dtype, got f32[3] and f64[3]");
  }
  EXPECT_THROW(exp(arange(3)), InvalidArgument);
}
