#include <gtest/gtest.h>

#include <cmath>

#include "nxd/optim/elementwise_optimizer.h"
#include "nxd/optim/optimizer.h"
#include "support/compare.h"

using namespace nxd;
using namespace nxd::optim;

namespace {

Tensor leaf(const std::vector<double>& v, DType dt = DType::f64) {
  Tensor t = from_doubles(v, {static_cast<int64_t>(v.size())}, dt);
  t.set_requires_grad(true);
  return t;
}
void set_grad(const Tensor& p, const std::vector<double>& g) {
  p.set_grad(from_doubles(g, p.shape(), p.dtype()));
}

}  // namespace

TEST(AdamW, MatchesHandComputedStepsInDouble) {
  // Three steps with weight decay and bias correction, against the formula written out.
  const double lr = 0.01, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::vector<double> p0{0.5, -1.25, 2.0};
  std::vector<std::vector<double>> grads{{0.1, -0.2, 0.3}, {-0.05, 0.4, 0.3}, {0.2, 0.0, -1.0}};
  Tensor p = leaf(p0);
  AdamW opt({ParamGroup{"all", {{"w", p}}, lr, wd}}, AdamWOptions{b1, b2, eps});
  std::vector<double> ref = p0, m(3, 0.0), v(3, 0.0);
  for (int t = 1; t <= 3; ++t) {
    set_grad(p, grads[t - 1]);
    opt.step();
    for (int i = 0; i < 3; ++i) {
      double g = grads[t - 1][i];
      ref[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
      ref[i] -= lr / (1 - std::pow(b1, t)) * m[i] / denom;
    }
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(p.at({i}), ref[i], 1e-15) << "step " << t << " i " << i;
  }
  // the state is reachable by name and holds m, v and the step count
  const auto& st = opt.state_tensors();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].first, "w.exp_avg");
  EXPECT_EQ(st[1].first, "w.exp_avg_sq");
  EXPECT_EQ(st[2].first, "w.step");
  EXPECT_NEAR(st[0].second.at({1}), m[1], 1e-17);
  EXPECT_NEAR(st[1].second.at({2}), v[2], 1e-17);
  EXPECT_EQ(st[2].second.item(), 3.0);
}

TEST(AdamW, FirstStepMovesByLrTimesSign) {
  // After one step m_hat = g and v_hat = g^2, so p1 = p0 - lr * g / (|g| + eps).
  Tensor p = leaf({1.0, 1.0, 1.0});
  AdamW opt({ParamGroup{"all", {{"w", p}}, 0.1, 0.0}});
  set_grad(p, {3.0, -0.001, 0.0});
  opt.step();
  EXPECT_NEAR(p.at({0}), 1.0 - 0.1 * 3.0 / (3.0 + 1e-8), 1e-15);
  EXPECT_NEAR(p.at({1}), 1.0 + 0.1 * 0.001 / (0.001 + 1e-8), 1e-15);
  EXPECT_EQ(p.at({2}), 1.0);  // zero gradient: 0 / eps = 0
}

TEST(AdamW, DecoupledWeightDecayAndGroups) {
  // Zero gradients: only the decoupled decay acts, p *= 1 - lr * wd, and only in the decay group.
  Tensor w = leaf({2.0, -4.0});
  Tensor b = leaf({2.0, -4.0});
  auto groups = default_param_groups({{"fc.weight", w}, {"fc.bias", b}}, 0.5, 0.1);
  ASSERT_EQ(groups.size(), 2u);
  AdamW opt(std::move(groups));
  set_grad(w, {0.0, 0.0});
  set_grad(b, {0.0, 0.0});
  opt.step();
  opt.step();
  EXPECT_DOUBLE_EQ(w.at({0}), 2.0 * 0.95 * 0.95);
  EXPECT_DOUBLE_EQ(w.at({1}), -4.0 * 0.95 * 0.95);
  EXPECT_EQ(b.at({0}), 2.0);
  EXPECT_EQ(b.at({1}), -4.0);
}

TEST(AdamW, StepCountIsPerParameter) {
  Tensor a = leaf({1.0});
  Tensor b = leaf({1.0});
  AdamW opt({ParamGroup{"all", {{"a", a}, {"b", b}}, 0.1, 0.0}});
  set_grad(a, {1.0});
  opt.step();  // b has no gradient: untouched, its step stays 0
  EXPECT_EQ(b.at({0}), 1.0);
  set_grad(b, {1.0});
  opt.step();
  // b's first step has bias correction for t = 1: it moves by lr * 1 / (1 + eps)
  EXPECT_NEAR(b.at({0}), 1.0 - 0.1 / (1.0 + 1e-8), 1e-15);
  EXPECT_EQ(opt.state_tensors()[2].second.item(), 2.0);  // a.step
  EXPECT_EQ(opt.state_tensors()[5].second.item(), 1.0);  // b.step
}

TEST(AdamW, Float32CloseToDoubleReference) {
  std::vector<double> p0, g;
  for (int i = 0; i < 1000; ++i) {
    p0.push_back(std::sin(0.37 * i));
    g.push_back(std::cos(1.3 * i) * (1 + i % 7));
  }
  Tensor p32 = leaf(p0, DType::f32), p64 = leaf(p0, DType::f64);
  AdamW o32({ParamGroup{"g", {{"p", p32}}, 1e-2, 0.01}});
  AdamW o64({ParamGroup{"g", {{"p", p64}}, 1e-2, 0.01}});
  for (int s = 0; s < 5; ++s) {
    set_grad(p32, g);
    set_grad(p64, g);
    o32.step();
    o64.step();
  }
  EXPECT_CLOSE_REL(p32, p64, 1e-6);
}

TEST(SGD, PlainWithWeightDecay) {
  Tensor p = leaf({1.0, -2.0});
  SGD opt({ParamGroup{"g", {{"p", p}}, 0.1, 0.5}});
  set_grad(p, {0.2, 0.4});
  opt.step();
  // g + wd * p = (0.7, -0.6); p -= 0.1 * that
  EXPECT_NEAR(p.at({0}), 1.0 - 0.07, 1e-15);
  EXPECT_NEAR(p.at({1}), -2.0 + 0.06, 1e-15);
  EXPECT_TRUE(opt.state_tensors().empty());
}

TEST(SGD, MomentumAndDampeningByHand) {
  // momentum 0.9, dampening 0.5, lr 0.1, grads 1, 2, 3 on p0 = 0:
  // buf1 = 1 (first step: clone), p = -0.1
  // buf2 = 0.9 * 1 + 0.5 * 2 = 1.9, p = -0.29
  // buf3 = 0.9 * 1.9 + 0.5 * 3 = 3.21, p = -0.611
  Tensor p = leaf({0.0});
  SGD opt({ParamGroup{"g", {{"p", p}}, 0.1, 0.0}}, SGDOptions{0.9, 0.5, false});
  const double expect[] = {-0.1, -0.29, -0.611};
  for (int s = 0; s < 3; ++s) {
    set_grad(p, {s + 1.0});
    opt.step();
    EXPECT_NEAR(p.at({0}), expect[s], 1e-15) << "step " << s;
  }
  EXPECT_EQ(opt.state_tensors()[0].first, "p.momentum_buffer");
  EXPECT_NEAR(opt.state_tensors()[0].second.at({0}), 3.21, 1e-15);
}

TEST(SGD, NesterovByHand) {
  // momentum 0.9, lr 0.1, grads 1, 2 on p0 = 0:
  // buf1 = 1, d = 1 + 0.9 * 1 = 1.9, p = -0.19
  // buf2 = 0.9 + 2 = 2.9, d = 2 + 0.9 * 2.9 = 4.61, p = -0.19 - 0.461 = -0.651
  Tensor p = leaf({0.0});
  SGD opt({ParamGroup{"g", {{"p", p}}, 0.1, 0.0}}, SGDOptions{0.9, 0.0, true});
  set_grad(p, {1.0});
  opt.step();
  EXPECT_NEAR(p.at({0}), -0.19, 1e-15);
  set_grad(p, {2.0});
  opt.step();
  EXPECT_NEAR(p.at({0}), -0.651, 1e-15);
  EXPECT_THROW(SGD({ParamGroup{"g", {{"p", p}}, 0.1, 0.0}}, SGDOptions{0.0, 0.0, true}),
               InvalidArgument);
}

TEST(ParamGroups, NxdDefaultGrouping) {
  EXPECT_TRUE(is_no_decay_param("layers.0.attn.q_proj.bias"));
  EXPECT_TRUE(is_no_decay_param("layers.3.input_layernorm.weight"));
  EXPECT_TRUE(is_no_decay_param("norm.weight"));
  EXPECT_TRUE(is_no_decay_param("final_layer_norm.weight"));
  EXPECT_FALSE(is_no_decay_param("layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(is_no_decay_param("embed_tokens.weight"));
  Tensor a = leaf({1.0}), b = leaf({1.0});
  auto only_decay = default_param_groups({{"w", a}, {"v", b}}, 1e-3, 0.01);
  ASSERT_EQ(only_decay.size(), 1u);
  EXPECT_EQ(only_decay[0].params.size(), 2u);
  EXPECT_EQ(only_decay[0].weight_decay, 0.01);
}

TEST(Optimizer, ZeroGradAndSetLr) {
  Tensor p = leaf({1.0, 2.0});
  SGD opt({ParamGroup{"a", {{"p", p}}, 0.1, 0.0, 1.0}, ParamGroup{"b", {}, 0.1, 0.0, 0.5}});
  set_grad(p, {3.0, 4.0});
  opt.zero_grad();
  EXPECT_EQ(p.grad().at({1}), 0.0);
  opt.zero_grad(true);
  EXPECT_FALSE(p.grad().defined());
  opt.set_lr(2.0);
  EXPECT_EQ(opt.param_groups()[0].lr, 2.0);
  EXPECT_EQ(opt.param_groups()[1].lr, 1.0);
}

TEST(ClipGradNorm, L2NormAcrossParamsAndScaling) {
  Tensor a = leaf({3.0}), b = leaf({0.0, 4.0}), c = leaf({7.0});  // c has no gradient
  set_grad(a, {3.0});
  set_grad(b, {0.0, 4.0});
  std::vector<Tensor> ps{a, b, c};
  EXPECT_DOUBLE_EQ(grad_norm(ps), 5.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 10.0), 5.0);  // under the limit: unchanged
  EXPECT_EQ(a.grad().at({0}), 3.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 1.0), 5.0);  // returns the norm before clipping
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_DOUBLE_EQ(a.grad().at({0}), 3.0 * coef);
  EXPECT_DOUBLE_EQ(b.grad().at({1}), 4.0 * coef);
  EXPECT_NEAR(grad_norm(ps), 1.0, 1e-6);
}

TEST(ClipGradNorm, InfNorm) {
  Tensor a = leaf({1.0, -6.0}, DType::f32), b = leaf({2.5}, DType::f32);
  set_grad(a, {1.0, -6.0});
  set_grad(b, {2.5});
  std::vector<Tensor> ps{a, b};
  EXPECT_EQ(grad_norm(ps, kInfNorm), 6.0);
  EXPECT_EQ(clip_grad_norm(ps, 3.0, kInfNorm), 6.0);
  EXPECT_NEAR(a.grad().at({1}), -3.0, 1e-6);
  EXPECT_NEAR(b.grad().at({0}), 1.25, 1e-6);
  EXPECT_THROW(grad_norm(ps, 1.0), InvalidArgument);
}

// Lion (lion-pytorch's order): decay, the sign of the interpolated momentum, then the momentum.
// Values chosen exact in f32.
TEST(Lion, MatchesHandComputedSteps) {
  Tensor p = from_vector<float>({1.0f, -2.0f, 0.5f}, {3});
  p.set_requires_grad(true);
  optim::Lion lion({{"all", {{"p", p}}, 0.25, 0.5, 1.0}}, {.beta1 = 0.5, .beta2 = 0.75});
  p.set_grad(from_vector<float>({0.5f, -1.0f, 0.0f}, {3}));
  lion.step();
  // decay 1 - 0.25 * 0.5 = 0.875; c = 0.5 * g: signs +, -, 0; m = 0.25 * g
  EXPECT_EQ(p.to_vector_as<float>(), (std::vector<float>{0.875f - 0.25f, -1.75f + 0.25f, 0.4375f}));
  EXPECT_EQ(lion.state_tensors()[0].second.to_vector_as<float>(),
            (std::vector<float>{0.125f, -0.25f, 0.0f}));
  EXPECT_EQ(lion.state_tensors()[1].first, "p.step");
  p.set_grad(from_vector<float>({-1.0f, 0.25f, 1.0f}, {3}));
  lion.step();
  // c = 0.5 * m + 0.5 * g = -0.4375, 0 (-0.125 + 0.125), 0.5; m = 0.75 * m + 0.25 * g
  EXPECT_EQ(p.to_vector_as<float>(), (std::vector<float>{0.625f * 0.875f + 0.25f, -1.5f * 0.875f,
                                                         0.4375f * 0.875f - 0.25f}));
  EXPECT_EQ(lion.state_tensors()[0].second.to_vector_as<float>(),
            (std::vector<float>{0.125f * 0.75f - 0.25f, -0.25f * 0.75f + 0.0625f, 0.25f}));
  EXPECT_EQ(*lion.state_tensors()[1].second.data<int64_t>(), 2);
  EXPECT_EQ(std::string(lion.kind()), "Lion");
}

TEST(Lion, RefusesBadBetasAndF64Parameters) {
  Tensor p = zeros({2});
  p.set_requires_grad(true);
  EXPECT_THROW(optim::Lion({{"all", {{"p", p}}, 0.1, 0.0, 1.0}}, {.beta1 = 0.9, .beta2 = 1.0}),
               InvalidArgument);
  Tensor d = zeros({2}, DType::f64);
  d.set_requires_grad(true);
  try {
    optim::Lion({{"all", {{"w64", d}}, 0.1, 0.0, 1.0}});
    FAIL() << "an f64 parameter was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'w64' is f64"), std::string::npos) << e.what();
  }
}

// AdamW's and SGD's elementwise rules are their step(): the rule run on a copy gives bitwise the
// optimizer's update (what ZeRO-1 relies on).
TEST(ElementwiseRule, AdamWAndSgdRulesAreTheirSteps) {
  for (int kind = 0; kind < 2; ++kind) {
    Tensor p = from_vector<float>({0.3f, -1.2f, 2.5f, 0.0f}, {4});
    p.set_requires_grad(true);
    std::vector<optim::ParamGroup> groups = {{"all", {{"p", p}}, 0.05, 0.1, 1.0}};
    std::unique_ptr<optim::Optimizer> o;
    if (kind == 0)
      o = std::make_unique<optim::AdamW>(groups);
    else
      o = std::make_unique<optim::SGD>(groups, optim::SGDOptions{.momentum = 0.9});
    const optim::ElementwiseRule rule = *o->elementwise_rule();
    std::vector<float> w = p.to_vector_as<float>();
    std::vector<std::vector<float>> st(rule.state.size(), std::vector<float>(4, 0.0f));
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> g = {0.1f * t, -0.7f, 0.25f, 1.0f / t};
      p.set_grad(from_vector<float>(g, {4}));
      o->step();
      optim::ElementwiseStep e{w.data(), g.data(), {}, 4, 0.05, 0.1, t};
      for (size_t k = 0; k < st.size(); ++k) e.state[k] = st[k].data();
      rule.update(e);
      EXPECT_EQ(p.to_vector_as<float>(), w) << o->kind() << " step " << t;
    }
  }
}
