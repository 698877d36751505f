// The optimizers on meta parameters (nxd-plan's meta model, optim/meta_update.h): no arithmetic,
// and the same charge on the sim clock as the update of real parameters of the same shapes.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/optim/elementwise_optimizer.h"
#include "nxd/optim/optimizer.h"
#include "nxd/optim/zero1.h"
#include "nxd/runtime/context.h"

namespace nxd::optim {
namespace {

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)>;

struct Timed {
  double now = 0, compute = 0;
};

// One step of `make`'s optimizer over three parameters of `dt` on `device`, with gradients from a
// backward (so ZeRO-1's buckets hold them), at DP `dp` on the sim backend: what the step moved
// rank 0's clock by (its collectives included).
Timed step_time(const MakeOptimizer& make, Device device, DType dt, int dp) {
  Timed out;
  sim::launch(dp, [&] {
    parallel_state::initialize_model_parallel(1);
    std::vector<NamedParam> ps;
    for (const Shape& s : std::vector<Shape>{{64, 48}, {48}, {1000}}) {
      Tensor t = zeros(s, dt, device);
      if (device == Device::host) t.fill_(0.25);
      t.set_requires_grad(true);
      ps.push_back({"p" + std::to_string(ps.size()), t});
    }
    std::unique_ptr<Optimizer> opt = make({ParamGroup{"all", ps, 1e-2, 0.1, 1.0}});
    for (const NamedParam& p : ps) backward(sum(mul(p.param, p.param)));
    sim::SimClock* clock = sim::current_sim_clock();
    world().barrier();
    const double t0 = clock->now(), c0 = clock->compute_seconds();
    opt->step();
    if (current_context().rank() == 0) out = {clock->now() - t0, clock->compute_seconds() - c0};
    if (device == Device::meta)
      for (const NamedParam& p : ps) EXPECT_TRUE(p.param.is_meta()) << p.name;
  });
  return out;
}

TEST(MetaUpdate, OptimizersOnMetaParametersChargeWhatTheirRealUpdateCharges) {
  const std::vector<std::pair<std::string, MakeOptimizer>> optimizers = {
      {"AdamW", [](std::vector<ParamGroup> g) { return std::make_unique<AdamW>(std::move(g)); }},
      {"AdamW master weights",
       [](std::vector<ParamGroup> g) {
         return std::make_unique<AdamW>(std::move(g),
                                        AdamWOptions{.precision = {.master_weights = true}});
       }},
      {"SGD momentum",
       [](std::vector<ParamGroup> g) {
         return std::make_unique<SGD>(std::move(g), SGDOptions{.momentum = 0.9});
       }},
      {"Lion", [](std::vector<ParamGroup> g) { return std::make_unique<Lion>(std::move(g)); }},
      {"ZeRO-1 AdamW",
       [](std::vector<ParamGroup> g) {
         return std::make_unique<Zero1Optimizer>(std::move(g), Zero1Options{});
       }},
      {"ZeRO-1 Lion",
       [](std::vector<ParamGroup> g) {
         std::optional<ElementwiseRule> rule = Lion(g).elementwise_rule();
         return std::make_unique<Zero1Optimizer>(std::move(g), Zero1Options{.rule = rule});
       }},
  };
  for (const auto& [name, make] : optimizers)
    for (DType dt : {DType::f32, DType::bf16})
      for (int dp : {1, 2}) {
        const bool zero1 = name.starts_with("ZeRO-1");
        if (!zero1 && dp > 1) continue;
        const Timed real = step_time(make, Device::host, dt, dp);
        const Timed meta = step_time(make, Device::meta, dt, dp);
        std::printf("    %s %s DP %d: real step %.4f us (compute %.4f), meta %.4f us (%.4f)\n",
                    name.c_str(), dtype_name(dt), dp, real.now * 1e6, real.compute * 1e6,
                    meta.now * 1e6, meta.compute * 1e6);
        EXPECT_GT(real.compute, 0) << name;  // the update is charged
        EXPECT_EQ(meta.compute, real.compute) << name << " " << dtype_name(dt) << " DP " << dp;
        EXPECT_EQ(meta.now, real.now) << name << " " << dtype_name(dt) << " DP " << dp;
      }
}

}  // namespace
}  // namespace nxd::optim
