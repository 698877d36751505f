// ZeRO-3's prefetch (Zero1Options::prefetch, optim/zero_stage.h) on the sim clock: one training
// step of a 4-layer Llama at DP 2 with the reduction at the step (so the units' all-gathers are
// the only communication of the forward and backward), with and without prefetch. The losses are
// bitwise the same, the compute is the same, and the step is shorter with prefetch by exactly the
// hidden part of the gathers: their modeled time less the time the step waited for them (without
// prefetch every gather is waited for in full). Runs on sim::launch with a timeline (the clock is
// the sim device's), so not under mpirun.
#include <gtest/gtest.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/optim/zero1.h"
#include "nxd/optim/zero3_unit.h"
#include "nxd/runtime/sim/clock.h"
#include "support/ranks.h"
#include "zero_util.h"

using namespace nxd;
using namespace nxd::optim;

namespace {

struct ClockedStep {
  std::vector<double> losses;  // every step's, rank 0
  double step = 0, compute = 0;
  double gather_seconds = 0;  // the units' all-gathers' modeled time in the step
  double gather_waits = 0;    // the step's waits for them
  int gathers = 0;
};

// Three steps; the clock of rank 0 over the last one.
ClockedStep clocked_steps(UnitPrefetch prefetch) {
  ClockedStep out;
  double t0 = 0, t1 = 0;
  std::mutex mu;
  sim::LaunchOptions lo;
  lo.world_size = 2;
  lo.record_timeline = true;
  const sim::LaunchResult res = sim::launch(lo, [&] {
    parallel_state::initialize_model_parallel(1);
    ModelConfig c = nxd::testing::tiny_gqa_llama(4);
    c.hidden_size = 128;
    c.num_attention_heads = 4;
    c.ffn_hidden_size = 256;
    auto m = make_causal_lm(c, 5);
    Zero1Options zo{AdamWOptions{0.9, 0.99, 1e-8}, nullptr, NormGroups::from_parallel_state(),
                    norm_params(*m)};
    zo.registration_order = nxd::testing::named(*m);
    zo.mode = GradSyncMode::at_step;
    zo.stage = ZeroStage::three;
    for (const auto& l : m->decoder_stack()->layers()) zo.units.push_back(l.get());
    UnitModules roots;
    add_root_units({m.get()}, roots);
    zo.roots = roots.roots;
    zo.lookup_units = roots.lookups;
    zo.prefetch = prefetch;
    Zero1Optimizer opt(default_param_groups(nxd::testing::named(*m), 3e-2, 0.1), zo);
    sim::SimClock* clock = sim::current_sim_clock();
    const int d = parallel_state::get_data_parallel_rank();
    std::vector<double> losses;
    double a = 0, c0 = 0;
    for (int step = 0; step < 3; ++step) {
      if (step == 2) a = clock->now(), c0 = clock->compute_seconds();
      const Tensor ids = nxd::testing::zero_ids(3000u, d, step, c.vocab_size);
      const Tensor tg = nxd::testing::zero_ids(3050u, d, step, c.vocab_size);
      Tensor loss = m->loss(ids, tg);
      losses.push_back(loss.item());
      backward(loss);
      opt.clip_grad_norm(0.5);
      opt.step();
      opt.zero_grad(true);
    }
    if (d != 0) return;
    std::lock_guard<std::mutex> l(mu);
    out.losses = losses;
    t0 = a, t1 = clock->now();
    out.step = t1 - t0;
    out.compute = clock->compute_seconds() - c0;
  });
  for (const sim::TraceEvent& e : res.timeline->events(0)) {
    if (e.start < t0 || e.start >= t1 || e.name.find("all_gather") == std::string::npos) continue;
    if (std::string(e.category) == "comm-async") {
      out.gather_seconds += e.duration;
      ++out.gathers;
    } else if (std::string(e.category) == "wait") {
      out.gather_waits += e.duration;
    }
  }
  return out;
}

}  // namespace

TEST(Zero3Prefetch, HidesTheGathersUnderTheUnitsComputeOnTheSimClock) {
  if (nxd::testing::under_mpi()) GTEST_SKIP() << "the sim clock's test (sim::launch)";
  const ClockedStep on = clocked_steps(UnitPrefetch::next_unit);
  const ClockedStep off = clocked_steps(UnitPrefetch::none);
  auto print = [](const char* what, const ClockedStep& s) {
    std::printf(
        "    prefetch %-4s step %.3f us = compute %.3f + exposed communication %.3f (waits for "
        "the %d all-gathers %.3f of their %.3f us, the rest %.3f)\n",
        what, s.step * 1e6, s.compute * 1e6, (s.step - s.compute) * 1e6, s.gathers,
        s.gather_waits * 1e6, s.gather_seconds * 1e6, (s.step - s.compute - s.gather_waits) * 1e6);
  };
  print("on", on);
  print("off", off);
  const double hidden = on.gather_seconds - on.gather_waits;
  const double saved = off.step - on.step;
  std::printf("    saved %.3f us; the gathers' hidden part %.3f us (%.1f%% of their time)\n",
              saved * 1e6, hidden * 1e6, 100 * hidden / on.gather_seconds);
  EXPECT_EQ(on.losses, off.losses);  // bitwise: prefetch moves communication, not values
  EXPECT_EQ(on.compute, off.compute);
  // the root's two buckets (the embedding; the final norm and head, registered after the
  // layers), 4 layers in forward and 4 again in backward (reshard_after_forward)
  EXPECT_EQ(on.gathers, 10);
  EXPECT_EQ(off.gathers, on.gathers);
  EXPECT_NEAR(on.gather_seconds, off.gather_seconds, 1e-12);
  // without prefetch every gather is waited for in full
  EXPECT_NEAR(off.gather_waits, off.gather_seconds, 1e-12);
  // with it, each gather of a prefetched unit overlaps the previous unit's compute
  EXPECT_GT(hidden, 0.0);
  EXPECT_LT(on.step, off.step);
  EXPECT_NEAR(saved, hidden, 1e-9 * off.step);
}
