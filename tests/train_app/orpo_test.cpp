// ORPO's loss (train_app/orpo_loss.h) against a hand computation of the loss, its figures and its
// gradient, and a finite-difference gradient check in f64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "nxd/autograd/ops.h"
#include "nxd/train_app/dpo_module.h"
#include "nxd/train_app/orpo_loss.h"
#include "support/errors.h"
#include "support/random.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;

TEST(Orpo, LossFiguresAndGradientAgainstAHandComputation) {
  // two pairs (chosen, rejected): sums of response log-probs s and token counts t; a = s / t,
  // lo(a) = a - log(1 - e^a), h = lo(a_c) - lo(a_r), nll = -(s_c0 + s_c1) / (t_c0 + t_c1),
  // loss = nll - beta mean(log sigmoid h). d loss / d s_c = -1/Tc - beta/N sigmoid(-h) / (1 -
  // e^a_c) / t_c, d loss / d s_r = +beta/N sigmoid(-h) / (1 - e^a_r) / t_r.
  const double beta = 0.25;
  const std::vector<double> s{-6.0, -12.0, -9.0, -4.5};
  const std::vector<int64_t> t{4, 5, 6, 3};
  Tensor lp = from_vector<double>(s, {4});
  lp.set_requires_grad(true);
  const OrpoLoss l = orpo_loss(lp, t, {.beta = beta});
  backward(l.loss);
  auto lo = [](double a) { return a - std::log(1 - std::exp(a)); };
  const double tc = 4 + 6, nll = -(s[0] + s[2]) / tc;
  double ratio = 0, odds = 0, acc = 0, rc = 0, rr = 0;
  std::vector<double> grad(4);
  for (int k = 0; k < 2; ++k) {
    const double ac = s[2 * k] / t[2 * k], ar = s[2 * k + 1] / t[2 * k + 1];
    const double h = lo(ac) - lo(ar), sig = 1 / (1 + std::exp(-h));
    ratio += std::log(sig) / 2;
    odds += h / 2;
    rc += beta * ac / 2;
    rr += beta * ar / 2;
    acc += (ac > ar ? 0.5 : 0.0);
    grad[2 * k] = -1 / tc - beta / 2 * (1 - sig) / (1 - std::exp(ac)) / t[2 * k];
    grad[2 * k + 1] = beta / 2 * (1 - sig) / (1 - std::exp(ar)) / t[2 * k + 1];
  }
  // log sigmoid is computed as -(relu(-h) + log(1 + e^-|h|)) there: a few ulps of the loss (~1.6)
  EXPECT_NEAR(l.loss.item(), nll - beta * ratio, 1e-14);
  EXPECT_NEAR(l.nll, nll, 1e-15);
  EXPECT_NEAR(l.log_odds_ratio, ratio, 1e-15);
  EXPECT_NEAR(l.log_odds, odds, 1e-15);
  EXPECT_NEAR(l.chosen_reward, rc, 1e-15);
  EXPECT_NEAR(l.rejected_reward, rr, 1e-15);
  EXPECT_EQ(l.accuracy, 0.5);  // pair 0: -1.5 > -2.4; pair 1: -1.5 < -1.5 is not larger
  // pair 1 has h = 0 exactly: its gradient is sigmoid(0) = 1/2 of the derivative, not zero
  const std::vector<double> g = lp.grad().to_vector();
  double worst = 0;
  for (int i = 0; i < 4; ++i) worst = std::max(worst, std::abs(g[i] - grad[i]));
  std::printf("    ORPO gradient vs hand computation: largest difference %.3g\n", worst);
  EXPECT_LT(worst, 1e-15);
}

TEST(Orpo, GradcheckAndRefusals) {
  const std::vector<int64_t> t{3, 7, 2, 5, 4, 4};
  nxd::testing::check_grad(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{orpo_loss(in[0], t, {.beta = 0.3}).loss};
      },
      {from_vector<double>({-3.1, -9.2, -2.7, -4.4, -6.0, -1.9}, {6})}, "orpo loss");
  EXPECT_NE(nxd::testing::user_error_message([&] {
              orpo_loss(from_vector<double>({-1, -2, -3}, {3}), {1, 1, 1});
            }).find("[orpo] log-probabilities must be [2N]"),
            std::string::npos);
  EXPECT_NE(nxd::testing::user_error_message([&] {
              orpo_loss(from_vector<double>({-1, 0}, {2}), {1, 2});
            }).find("[orpo] row 1 has mean log-probability 0"),
            std::string::npos);
  EXPECT_NE(nxd::testing::user_error_message([&] {
              orpo_loss(from_vector<double>({-1, -2}, {2}), {0, 2});
            }).find("[orpo] row 0 has 0 response tokens"),
            std::string::npos);
}

// DPO starts with the policy equal to its reference: h = 0 in every pair, where -log sigmoid's
// derivative is -1/2, not the zero subgradient of a relu/abs form (no step would move the policy).
TEST(Dpo, SigmoidLossHasItsGradientWhereThePolicyEqualsTheReference) {
  const double beta = 0.1;
  const std::vector<double> p{-3.0, -5.0, -7.5, -2.0};
  Tensor pol = from_vector<double>(p, {4});
  pol.set_requires_grad(true);
  const DpoLoss l = dpo_loss(pol, from_vector<double>(p, {4}), {.beta = beta});
  backward(l.loss);
  EXPECT_NEAR(l.loss.item(), std::log(2.0), 1e-15);
  const std::vector<double> g = pol.grad().to_vector();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(g[i], (i % 2 ? 1 : -1) * beta * 0.5 / 2, 1e-17) << i;
}
