// bf16 parameters in the optimizers (optim/precision.h): master weights follow the f32 update
// exactly and the parameter is their rounding; without masters each step rounds to nearest;
// stochastic rounding is unbiased, counter-based (the same bits for the same (seed, name, step,
// element) however the elements are split) and moves parameters whose updates are below an ulp.
#include <gtest/gtest.h>

#include <cmath>

#include "nxd/optim/optimizer.h"
#include "nxd/optim/precision.h"
#include "nxd/runtime/init.h"
#include "support/compare.h"

using namespace nxd;
using namespace nxd::optim;

namespace {

Tensor param(const std::vector<double>& v, DType dt) {
  Tensor t = from_doubles(v, {static_cast<int64_t>(v.size())}, dt);
  t.set_requires_grad(true);
  return t;
}

// Values exactly representable in bf16, so an f32 and a bf16 parameter start equal.
std::vector<double> start_values(int64_t n) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(bf16(static_cast<float>(0.37 * std::sin(0.7 * i + 0.1))));
  return v;
}

std::vector<double> grads_at(int step, int64_t n) {
  std::vector<double> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = 0.05 * std::cos(0.3 * i + step) + 0.01 * step;
  return g;
}

}  // namespace

TEST(MixedPrecision, AdamWMasterWeightsFollowTheF32UpdateExactly) {
  constexpr int64_t N = 300;
  Tensor pf = param(start_values(N), DType::f32), pb = param(start_values(N), DType::bf16);
  AdamW ref({ParamGroup{"g", {{"w", pf}}, 1e-3, 0.1}});
  AdamWOptions o;
  o.precision.master_weights = true;
  AdamW mp({ParamGroup{"g", {{"w", pb}}, 1e-3, 0.1}}, o);
  ASSERT_EQ(mp.state_tensors().size(), 4u);  // exp_avg, exp_avg_sq, step, master
  EXPECT_EQ(mp.state_tensors()[0].second.dtype(), DType::f32);
  for (int step = 0; step < 20; ++step) {
    const std::vector<double> g = grads_at(step, N);
    pf.set_grad(from_doubles(g, {N}, DType::f32));
    pb.set_grad(from_doubles(g, {N}, DType::f32));  // an f32 gradient (fp32 accumulation)
    ref.step();
    mp.step();
    const NamedParam np{"w", pb};
    EXPECT_BITWISE_EQ(mp.master(np), pf.detach()) << "step " << step;
    EXPECT_BITWISE_EQ(pb.detach(), pf.detach().to(DType::bf16)) << "step " << step;
  }
}

TEST(MixedPrecision, WithoutMastersEachStepRoundsToNearest) {
  constexpr int64_t N = 64;
  Tensor pb = param(start_values(N), DType::bf16);
  SGD opt({ParamGroup{"g", {{"w", pb}}, 0.5, 0.0}}, SGDOptions{.momentum = 0.9});
  std::vector<float> ref(N), buf(N);
  for (int64_t i = 0; i < N; ++i) ref[i] = static_cast<float>(start_values(N)[i]);
  for (int step = 0; step < 5; ++step) {
    const std::vector<double> g = grads_at(step, N);
    pb.set_grad(from_doubles(g, {N}, DType::bf16));
    opt.step();
    for (int64_t i = 0; i < N; ++i) {
      const float gi = static_cast<float>(bf16(static_cast<float>(g[i])));
      buf[i] = step == 0 ? gi : 0.9f * buf[i] + gi;
      ref[i] = static_cast<float>(bf16(ref[i] - 0.5f * buf[i]));  // rounded every step
    }
    std::vector<double> want(ref.begin(), ref.end());
    EXPECT_BITWISE_EQ(pb.detach(), from_doubles(want, {N}, DType::bf16)) << "step " << step;
  }
}

TEST(MixedPrecision, StochasticRoundingIsUnbiasedAndCounterBased) {
  // 1 + 0.3 ulp (bf16's ulp at 1 is 2^-7): rounds up with probability 0.3
  constexpr int64_t N = 200000;
  const float x = 1.0f + 0.3f * 0.0078125f;
  std::vector<float> src(N, x);
  std::vector<bf16> a(N), b(N);
  const RoundingNoise noise(7, "layer.weight", 3);
  round_to_bf16(a.data(), src.data(), N, &noise);
  int64_t up = 0;
  for (const bf16& v : a) {
    const float f = static_cast<float>(v);
    ASSERT_TRUE(f == 1.0f || f == 1.0078125f) << f;
    up += f > 1.0f;
  }
  const double frac = static_cast<double>(up) / N;
  EXPECT_NEAR(frac, 0.3, 0.005) << "fraction rounded up";
  // the same bits for the same elements, however the range is split
  round_to_bf16(b.data(), src.data(), 1001, &noise, 0);
  round_to_bf16(b.data() + 1001, src.data() + 1001, N - 1001, &noise, 1001);
  for (int64_t i = 0; i < N; ++i) ASSERT_EQ(a[i].bits, b[i].bits) << "element " << i;
  // another step, parameter or seed draws other bits
  for (const RoundingNoise& other :
       {RoundingNoise(7, "layer.weight", 4), RoundingNoise(7, "layer.bias", 3),
        RoundingNoise(8, "layer.weight", 3)}) {
    round_to_bf16(b.data(), src.data(), N, &other);
    int64_t same = 0;
    for (int64_t i = 0; i < N; ++i) same += a[i].bits == b[i].bits;
    EXPECT_LT(same, N * 0.7) << "noise did not change";
  }
  // exact bf16 values, NaN and Inf are kept
  std::vector<float> special = {1.5f, -2.0f, INFINITY, -INFINITY, NAN};
  std::vector<bf16> out(special.size());
  round_to_bf16(out.data(), special.data(), static_cast<int64_t>(special.size()), &noise);
  EXPECT_EQ(static_cast<float>(out[0]), 1.5f);
  EXPECT_EQ(static_cast<float>(out[1]), -2.0f);
  EXPECT_EQ(static_cast<float>(out[2]), INFINITY);
  EXPECT_EQ(static_cast<float>(out[3]), -INFINITY);
  EXPECT_TRUE(std::isnan(static_cast<float>(out[4])));
}

TEST(MixedPrecision, StochasticRoundingMovesParametersBelowAnUlp) {
  // lr 1e-4 on values near 1 (ulp 2^-7): round to nearest never moves, SR moves on average
  constexpr int64_t N = 4096;
  auto run = [&](bool sr) {
    Tensor p = param(std::vector<double>(N, 1.0), DType::bf16);
    SGD opt({ParamGroup{"g", {{"w", p}}, 1e-4, 0.0}},
            SGDOptions{.precision = {.stochastic_rounding = sr, .seed = 3}});
    for (int step = 0; step < 50; ++step) {
      p.set_grad(from_doubles(std::vector<double>(N, -1.0), {N}, DType::f32));
      opt.step();
    }
    double mean = 0;
    for (double v : p.detach().to_vector()) mean += v / N;
    return mean;
  };
  EXPECT_EQ(run(false), 1.0);
  const double sr = run(true);  // expected 1 + 50 * 1e-4 = 1.005
  EXPECT_NEAR(sr, 1.005, 0.0005);
  EXPECT_EQ(run(true), sr) << "not reproducible";
}

TEST(MixedPrecision, PrecisionIsChosenBeforeTheFirstStep) {
  Tensor p = param({1.0, 2.0}, DType::bf16);
  AdamW opt({ParamGroup{"g", {{"emb.weight", p}}, 1e-3, 0.0}});
  EXPECT_EQ(opt.state_tensors().size(), 3u);
  opt.set_precision({.master_weights = true});
  ASSERT_EQ(opt.state_tensors().size(), 4u);
  EXPECT_EQ(opt.state_tensors()[3].first, "emb.weight.master");
  EXPECT_BITWISE_EQ(opt.state_tensors()[3].second, from_doubles({1.0, 2.0}, {2}, DType::f32));
  p.set_grad(from_doubles({1.0, 1.0}, {2}, DType::bf16));
  opt.step();
  try {
    opt.set_precision({});
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("after 1 step"), std::string::npos) << e.what();
  }
  // integer parameters are refused, naming the parameter
  Tensor bad = from_vector<int64_t>({1, 2}, {2});
  try {
    AdamW o({ParamGroup{"g", {{"ids", bad}}, 1e-3, 0.0}});
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ids"), std::string::npos) << e.what();
  }
}
