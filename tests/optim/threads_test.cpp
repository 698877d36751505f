// The optimizer, the gradient norms and clipping, and the backward engine's gradient accumulation
// run on the compute pool: their results are bitwise the same at 1 and 2 threads and across runs.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "nxd/autograd/ops.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/optimizer.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/init.h"
#include "nxd/runtime/parallel.h"
#include "support/compare.h"
#include "support/random.h"
#include "support/threads.h"

using namespace nxd;
using namespace nxd::optim;

namespace {

Tensor randn(const Shape& s, DType dt, uint64_t seed) {
  return nxd::testing::randn_from(s, dt, {seed, 41}, 1.0);
}

using nxd::testing::expect_thread_invariant;

// Parameters of several sizes (one below a work item, ragged ones above), with gradients.
std::vector<Tensor> make_params(DType dt) {
  std::vector<Tensor> ps;
  const std::vector<Shape> shapes{{1000}, {300, 257}, {70001}, {2, 3}, {129, 1024}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = randn(shapes[i], dt, 10 + i);
    p.set_requires_grad(true);
    p.set_grad(randn(shapes[i], dt, 20 + i));
    ps.push_back(p);
  }
  return ps;
}

class OptimThreads : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(Dtypes, OptimThreads, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace

TEST_P(OptimThreads, AdamWSteps) {
  const DType dt = GetParam();
  expect_thread_invariant([&] {
    std::vector<Tensor> ps = make_params(dt);
    std::vector<NamedParam> named;
    for (size_t i = 0; i < ps.size(); ++i) named.push_back({str("layer", i, ".weight"), ps[i]});
    named.push_back({"norm.weight", ps[0]});
    named.erase(named.begin());  // ps[0] is in the no-decay group only
    AdamW opt(default_param_groups(named, 1e-2, 0.1));
    for (int s = 0; s < 3; ++s) {
      for (size_t i = 0; i < ps.size(); ++i) ps[i].set_grad(randn(ps[i].shape(), dt, 100 * s + i));
      opt.step();
    }
    std::vector<Tensor> r;
    for (const Tensor& p : ps) r.push_back(p.detach().clone());
    return r;
  });
}

TEST_P(OptimThreads, GradNormAndClipping) {
  const DType dt = GetParam();
  expect_thread_invariant([&] {
    std::vector<Tensor> ps = make_params(dt);
    std::vector<NormParam> nps;
    for (size_t i = 0; i < ps.size(); ++i) nps.push_back({str("p", i), ps[i], {}, false});
    const double l2 = grad_norm(ps), inf = grad_norm(ps, kInfNorm);
    const double pl2 = parallel_grad_norm(nps, NormGroups{}),
                 pinf = parallel_grad_norm(nps, NormGroups{}, kInfNorm);
    EXPECT_NEAR(l2, pl2, 1e-9 * l2);
    EXPECT_EQ(inf, pinf);
    const double clipped = clip_grad_norm(ps, 0.5);
    EXPECT_EQ(clipped, l2);
    clip_grads_with_norm(nps, 0.25, grad_norm(ps));  // scales again
    std::vector<Tensor> r{from_doubles({l2, inf, pl2, pinf}, {4}, DType::f64)};
    for (const Tensor& p : ps) r.push_back(p.grad().clone());
    return r;
  });
}

TEST_P(OptimThreads, BackwardAccumulation) {
  // x feeds three products: the engine sums their gradients into one buffer and into x.grad
  const DType dt = GetParam();
  Tensor a = randn({512, 300}, dt, 1), b = randn({512, 300}, dt, 2), c = randn({512, 300}, dt, 3);
  expect_thread_invariant([&] {
    Tensor x = randn({512, 300}, dt, 4);
    x.set_requires_grad(true);
    Tensor h = mul(x, a);
    Tensor y = add(add(mul(h, b), mul(h, c)), mul(x, c));
    backward(sum(y));
    return std::vector<Tensor>{x.grad().clone()};
  });
}
