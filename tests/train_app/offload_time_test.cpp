// Optimizer offload on the sim clock (runtime/sim/host_offload.h, optim/offload.h): the round
// trips of the buckets' shards pipeline over the link's two directions and the host's memory, a
// run's modeled step grows by exactly the modeled round trip, nxd-plan's step equals the run's,
// and the losses are bitwise those without offload.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nxd/optim/offload.h"
#include "nxd/runtime/sim/clock.h"
#include "nxd/runtime/sim/host_offload.h"
#include "nxd/runtime/sim/machine.h"
#include "nxd/train_app/plan.h"
#include "nxd/train_app/train.h"
#include "nxd/trainer/preempt.h"
#include "train_util.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::train_app;

// Three buckets on a link of 10 B/s per direction and a host of 1 B/s: bucket k waits for its
// own transfer down, for the host to finish bucket k-1, and for the link up to finish bucket
// k-1's parameters. By hand: down ends 1, 2, 3; updates end 1+2=3, 3+2=5, 5+1=6; up ends 3+2=5,
// 5+2=7, 6+4=10 (the third waits for its update only, the second for its update, not the link).
TEST(OffloadTime, BucketsPipelineOverTheLinkAndTheHost) {
  sim::MachineSpec m;
  m.cores_per_chip = 2;
  m.chips_per_instance = 2;
  m.host_link_bandwidth = 20;   // 10 per core
  m.host_memory_bandwidth = 4;  // 1 per core
  const sim::OffloadRates rates(m);
  EXPECT_EQ(rates.link, 10);
  EXPECT_EQ(rates.host_memory, 1);
  const std::vector<double> ready =
      sim::offload_ready_times(rates, 0.0, {{10, 2, 20}, {10, 2, 20}, {10, 1, 40}});
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_DOUBLE_EQ(ready[0], 5);
  EXPECT_DOUBLE_EQ(ready[1], 7);
  EXPECT_DOUBLE_EQ(ready[2], 11);
  // a machine without a host model charges nothing
  EXPECT_EQ(sim::offload_ready_times(sim::OffloadRates(sim::MachineSpec{}), 2.0, {{1, 1, 1}})[0],
            2.0);
  // the published instances have one
  for (const char* name : {"trn1.32xlarge", "trn2.48xlarge"}) {
    const sim::OffloadRates r(sim::machine(name));
    std::printf("    %s: PCIe %.2f GB/s per core per direction, host memory %.2f GB/s per core\n",
                name, r.link / 1e9, r.host_memory / 1e9);
    EXPECT_GT(r.link, 0);
    EXPECT_GT(r.host_memory, 0);
  }
}

// One rank (ZeRO-1 at DP 1: no all-gather), one bucket, f32: with offload the modeled step is
// longer by the gradient and weights down (8 bytes an element), the host's AdamW (reads the
// gradient, reads and writes weights, exp_avg, exp_avg_sq: 28 bytes) and the weights up (4
// bytes), one after the other, and shorter by the device's AdamW pass it no longer runs (the same
// 28 bytes and 8 flops an element on the NeuronCore's roofline, optim/meta_update.h: 4.70 us
// here); the losses are bitwise the same; the plan's step is the run's.
TEST(OffloadTime, StepGrowsByTheModeledRoundTripWithTheSameLosses) {
  auto d = nxd::testing::test_temp_dir("nxd_offload_time_");
  // a timeline puts one rank on the sim device (train.cpp), and shows the offload's waits
  const std::string timeline = (d / "timeline.json").string();
  const std::vector<std::string> base = {"backend.world_size=1", "distributed_strategy.zero1=true",
                                         "distributed_strategy.grad_bucket_mb=1024",
                                         "precision.type=fp32"};
  auto with = base;
  with.push_back("distributed_strategy.optimizer_offload=true");
  with.push_back("backend.timeline=" + timeline);
  auto without = base;
  without.push_back("backend.timeline=" + (d / "device.json").string());
  const auto dev = nxd::testing::train_rows(d, "device", without);
  const auto off = nxd::testing::train_rows(d, "offload", with);
  EXPECT_EQ(off.rows.loss, dev.rows.loss);
  ASSERT_FALSE(off.rows.loss.empty());
  EXPECT_NE(nxd::testing::slurp(timeline).find("optimizer offload"), std::string::npos);

  const sim::MachineSpec m = sim::machine("trn1.32xlarge");
  const double link = m.host_link_bandwidth / m.cores_per_chip;
  const double host = m.host_memory_bandwidth / m.cores_per_instance();
  const double n = static_cast<double>(off.result.num_parameters);
  const double expected = 8 * n / link + 28 * n / host + 4 * n / link -
                          sim::roofline_seconds(m.core, 8 * n, 28 * n, DType::f32);
  const double grown = off.result.sim_step_seconds - dev.result.sim_step_seconds;
  std::printf(
      "    %.0f parameters: step %.3f -> %.3f us, grown %.4f us, modeled round trip %.4f us\n", n,
      dev.result.sim_step_seconds * 1e6, off.result.sim_step_seconds * 1e6, grown * 1e6,
      expected * 1e6);
  EXPECT_GT(grown, 0);
  EXPECT_NEAR(grown, expected, 1e-6 * expected);
}

namespace {
// The slowest rank's planned step and the run's modeled step (as nxd-train runs it).
std::pair<double, double> planned_and_run(const TrainConfig& cfg) {
  const MemoryPlan plan = plan_memory(cfg, {.time_step = true});
  PreemptionGuard as_nxd_train;
  const TrainResult res = train(cfg, {.quiet = true});
  double planned = 0;
  for (const auto& r : plan.ranks) {
    planned = std::max(planned, r.step_seconds);
    // the plan's split of the step names the offload's wait (nxd-plan prints it)
    if (cfg.dist.optimizer_offload)
      EXPECT_GT(r.offload_seconds, 0) << "rank " << r.rank;
    else
      EXPECT_EQ(r.offload_seconds, 0) << "rank " << r.rank;
  }
  return {planned, res.sim_step_seconds};
}
}  // namespace

// nxd-plan's modeled step against the real run's sim clock with offload at DP 4, ZeRO-1 and ZeRO-2,
// f32 and mixed precision (bf16 parameters, their f32 masters on the host). One bucket (the
// default 25 MB): the steps agree within 0.1%, as every layout's
// (MemoryPlan.ModeledStepMatchesTheSimClockOfARealRun). Several buckets (0.05 MB: the round trips
// overlap one another and the earlier buckets' all-gathers): what offload adds to the planned
// step equals what it adds to the run's within 0.1% of the step. (There the planned step itself
// is 4-6% above the run's with or without offload: the planner reduce-scatters the buckets at
// the step, while the run, in overlap mode, reduces them during backward.) ZeRO-2's planned step
// was 3-4% below the run's, with or without offload, until the meta step charged the buckets'
// copy-in as the run does (optim/grad_sync.cpp).
TEST(OffloadTime, PlannedStepEqualsTheRunsSimClock) {
  auto d = nxd::testing::test_temp_dir("nxd_offload_plan_");
  const std::vector<std::vector<std::string>> runs = {
      {"backend.world_size=4", "distributed_strategy.zero1=true", "precision.type=fp32"},
      {"backend.world_size=4", "distributed_strategy.zero1=true", "precision.type=mixed_precision"},
      {"backend.world_size=4", "distributed_strategy.zero_stage=2", "precision.type=fp32"},
      {"backend.world_size=4", "distributed_strategy.zero_stage=2",
       "precision.type=mixed_precision"},
  };
  const std::string off = "distributed_strategy.optimizer_offload=true";
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string what;
    for (const auto& s : runs[i]) what += " " + s;
    const auto cfg = [&](const std::string& name, std::vector<std::string> extra) {
      extra.insert(extra.begin(), runs[i].begin(), runs[i].end());
      return nxd::testing::plan_run(d, name + std::to_string(i),
                                    {"model.num_layers=4", "data.global_batch_size=16"}, extra);
    };
    const auto [planned, run] = planned_and_run(cfg("one", {off}));
    const double err = (planned - run) / run;
    std::printf("    %s, offload, one bucket: planned step %.3f us, the run's %.3f us (%+.4f%%)\n",
                what.c_str(), planned * 1e6, run * 1e6, 100 * err);
    EXPECT_LE(std::abs(err), 0.001) << what;
    const std::string many = "distributed_strategy.grad_bucket_mb=0.05";
    const auto [plan_dev, run_dev] = planned_and_run(cfg("many", {many}));
    const auto [plan_off, run_off] = planned_and_run(cfg("many_off", {many, off}));
    std::printf(
        "    %s, 0.05 MB buckets: offload adds %.3f us to the planned step, %.3f us to the "
        "run's (step %.3f us)\n",
        what.c_str(), (plan_off - plan_dev) * 1e6, (run_off - run_dev) * 1e6, run_off * 1e6);
    EXPECT_GT(run_off - run_dev, 0) << what;
    EXPECT_LE(std::abs((plan_off - plan_dev) - (run_off - run_dev)), 0.001 * run_off) << what;
  }
}
