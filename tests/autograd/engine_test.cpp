// Tests of the graph engine itself, with small ops defined here on raw loops so they do not
// depend on the op families.
#include <gtest/gtest.h>

#include "nxd/autograd/function.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/init.h"
#include "support/compare.h"

using namespace nxd;

namespace {

template <class F>
Tensor map(const Tensor& x, F f) {
  Tensor xd = x.detach().contiguous();
  Tensor y = empty_like(xd);
  auto a = xd.to_vector();
  for (size_t i = 0; i < a.size(); ++i) y.detach().reshape({-1}).set({int64_t(i)}, f(a[i]));
  return y;
}

Tensor sq(const Tensor& x) {
  Tensor y = map(x, [](double v) { return v * v; });
  Tensor xd = x.detach();
  autograd::record("sq", {x}, {y}, [xd](const Grads& g) -> Grads {
    Tensor dx = map(xd, [](double v) { return 2 * v; });
    auto gv = g[0].to_vector();
    auto dv = dx.to_vector();
    for (size_t i = 0; i < gv.size(); ++i) dv[i] *= gv[i];
    return {from_doubles(dv, xd.shape(), xd.dtype())};
  });
  return y;
}

Tensor mulop(const Tensor& a, const Tensor& b) {
  auto av = a.to_vector(), bv = b.to_vector();
  std::vector<double> r(av.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = av[i] * bv[i];
  Tensor y = from_doubles(r, a.shape(), a.dtype());
  Tensor ad = a.detach(), bd = b.detach();
  autograd::record("mul", {a, b}, {y}, [ad, bd](const Grads& g) -> Grads {
    auto gv = g[0].to_vector(), av = ad.to_vector(), bv = bd.to_vector();
    std::vector<double> da(gv.size()), db(gv.size());
    for (size_t i = 0; i < gv.size(); ++i) da[i] = gv[i] * bv[i], db[i] = gv[i] * av[i];
    return {from_doubles(da, ad.shape(), ad.dtype()), from_doubles(db, bd.shape(), bd.dtype())};
  });
  return y;
}

Tensor sumop(const Tensor& x) {
  double s = 0;
  for (double v : x.to_vector()) s += v;
  Tensor y = scalar(s, x.dtype());
  Shape shape = x.shape();
  DType dt = x.dtype();
  autograd::record("sum", {x}, {y},
                   [shape, dt](const Grads& g) -> Grads { return {full(shape, g[0].item(), dt)}; });
  return y;
}

Tensor leaf(std::vector<double> v, Shape s, DType dt = DType::f32) {
  Tensor t = from_doubles(v, s, dt);
  t.set_requires_grad(true);
  return t;
}

}  // namespace

TEST(Engine, ChainAndDiamond) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor loss = sumop(mulop(sq(x), x));  // sum x^3 -> 3x^2
  backward(loss);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{3, 12, 27}));
  // gradients accumulate across backward calls
  backward(sumop(sq(x)));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{5, 16, 33}));
}

TEST(Engine, BackwardFromGivenGradients) {
  // A pipeline stage receives d(loss)/d(output) from the next stage.
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sq(x);
  backward({y}, {from_doubles({10, 100}, {2})});
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{20, 400}));
  Tensor z = sq(x);
  EXPECT_THROW(backward(z), InvalidArgument);  // non-scalar without a gradient
  EXPECT_THROW(backward({sq(x)}, {zeros({3})}), ShapeError);
}

TEST(Engine, NoGradDetachAndRequiresGrad) {
  Tensor x = leaf({1, 2}, {2});
  {
    NoGradGuard ng;
    Tensor y = sq(x);
    EXPECT_FALSE(y.requires_grad());
  }
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.shares_storage(x));
  EXPECT_FALSE(sq(d).requires_grad());
  EXPECT_TRUE(sq(x).requires_grad());
  EXPECT_TRUE(autograd::is_leaf(x));
  EXPECT_FALSE(autograd::is_leaf(sq(x)));
  EXPECT_THROW(backward(sumop(d)), InvalidArgument);
}

TEST(Engine, RetainGraph) {
  Tensor x = leaf({3}, {1});
  Tensor l = sumop(sq(x));
  backward({l}, {}, {.retain_graph = true});
  backward({l}, {}, {});
  EXPECT_EQ(x.grad().item(), 12.0);
  try {
    backward(l);
    FAIL() << "expected a throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Engine, GradDoesNotTouchDotGrad) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = sq(x);
  Tensor l = sumop(mulop(y, y));  // sum x^4
  auto g = grad({l}, {x, y});
  EXPECT_EQ(g[0].to_vector(), (std::vector<double>{4, 32}));
  EXPECT_EQ(g[1].to_vector(), (std::vector<double>{2, 8}));  // d/dy sum y^2 = 2y
  EXPECT_FALSE(x.grad().defined());
}

TEST(Engine, HooksFireOnceWhenGradientIsFinal) {
  Tensor w = leaf({1, 2}, {2});
  std::vector<std::vector<double>> seen;
  autograd::register_hook(w, [&](const Tensor& t) { seen.push_back(t.grad().to_vector()); });
  // w feeds three nodes; the hook must see the sum of all three contributions, once.
  Tensor l = sumop(mulop(mulop(sq(w), w), w));  // w^4 -> 4 w^3
  backward(l);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<double>{4, 32}));
  Tensor c = from_doubles({1}, {1});
  EXPECT_THROW(autograd::register_hook(c, [](const Tensor&) {}), InvalidArgument);
}

TEST(Engine, CustomFunction) {
  Tensor x = leaf({1, 2}, {2});
  // identity forward, backward scales by 3 (like a mapping whose backward is a collective)
  auto y = autograd::custom(
      "scale_grad", {x}, [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
      [](const Grads& g) -> Grads { return {map(g[0], [](double v) { return 3 * v; })}; });
  EXPECT_FALSE(y[0].is_same(x));
  EXPECT_TRUE(y[0].requires_grad());
  EXPECT_TRUE(autograd::is_leaf(x));  // the caller's tensor is untouched
  backward(sumop(y[0]));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{3, 3}));
}

TEST(Engine, CheckpointBitwiseEqualAndLowerPeakMemory) {
  Context ctx;
  ContextGuard guard(ctx);
  auto block = [](const std::vector<Tensor>& in) {
    Tensor h = in[0];
    for (int i = 0; i < 6; ++i) h = mulop(sq(h), in[1]);
    return std::vector<Tensor>{h};
  };
  Tensor x0 = empty({4096}, DType::f32);
  init::uniform(x0, RngStream{1, 1}, 0.9, 1.1);
  Tensor w0 = empty({4096}, DType::f32);
  init::uniform(w0, RngStream{1, 2}, 0.9, 1.0);

  auto run = [&](bool ckpt, Tensor& gx, Tensor& gw) {
    Tensor x = x0.clone().set_requires_grad(true);
    Tensor w = w0.clone().set_requires_grad(true);
    ctx.memory().reset_peak();
    int64_t base = ctx.memory().live();
    auto out = ckpt ? autograd::recompute(block, {x, w}) : block({x, w});
    Tensor l = sumop(out[0]);
    int64_t after_forward = ctx.memory().live() - base;
    backward(l);
    gx = x.grad();
    gw = w.grad();
    return after_forward;
  };
  Tensor gx1, gw1, gx2, gw2;
  int64_t plain = run(false, gx1, gw1);
  int64_t ckpt = run(true, gx2, gw2);
  EXPECT_BITWISE_EQ(gx2, gx1);
  EXPECT_BITWISE_EQ(gw2, gw1);
  // the plain graph holds 12 saved intermediates of 16 KiB; the checkpoint holds the output only
  EXPECT_LT(ckpt * 4, plain) << "checkpointed forward kept " << ckpt << " bytes, plain " << plain;
}

TEST(Gradcheck, PassesOnCorrectAndFailsOnWrongGradient) {
  Tensor a = from_doubles({0.5, -1.5, 2.0}, {3});
  Tensor b = from_doubles({1.0, 0.25, -0.5}, {3});
  auto good = autograd::gradcheck(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{mulop(sq(in[0]), in[1])}; },
      {a, b});
  EXPECT_TRUE(good.ok) << good.message;
  auto bad_op = [](const Tensor& x) {
    Tensor y = map(x, [](double v) { return v * v * v; });
    Tensor xd = x.detach();
    autograd::record("cube_wrong", {x}, {y}, [xd](const Grads& g) -> Grads {
      return {map(xd, [](double v) { return 2 * v * v; })};  // should be 3 v^2
    });
    return y;
  };
  auto bad = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{bad_op(in[0])}; }, {a});
  EXPECT_FALSE(bad.ok);
  EXPECT_NE(bad.message.find("numeric"), std::string::npos) << bad.message;
}
