// One training step on meta tensors on the sim clock (plan_internal.h): what nxd-plan models.
#include <memory>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/offload.h"
#include "nxd/optim/zero1.h"
#include "nxd/runtime/context.h"
#include "nxd/train_app/plan_internal.h"
#include "nxd/trainer/preempt.h"
#include "nxd/trainer/step_metrics.h"
#include "nxd/trainer/trainer.h"

namespace nxd::train_app::detail {

namespace {

struct GradOn {
  bool prev = GradMode::is_enabled();
  GradOn() { GradMode::set_enabled(true); }
  ~GradOn() { GradMode::set_enabled(prev); }
};

// The step's loss summed over DP (Trainer::dp_sum; a pipeline averages it in run_train) or, in a
// pipeline, the MoE layers' figures over the stages (what Trainer::pipeline_train_step logs).
void loss_collectives(const MetaModel& mm) {
  if (!mm.pipe) {
    trainer::data_parallel_sum({0.0});
    return;
  }
  std::vector<Module*> chunks;
  for (const auto& c : mm.chunks) chunks.push_back(c.get());
  trainer::pipeline_step_metrics(chunks);
}

// The gradient norm by the optimizer's own functions (NxDOptimizer::clip, over the groups it
// builds): parallel_grad_norm over the model's norm parameters, whose meta gradients add nothing
// but whose sums go over the run's groups; with ZeRO-1 each reduction group's optimizer's sum
// (zero1_norm_sum: the experts' over EP too).
void gradient_norm(const TrainConfig& cfg, const MetaModel& mm,
                   const std::vector<ReductionGroup>& groups) {
  const optim::NormGroups ng =
      mm.pipe ? mm.pipe->norm_groups() : optim::NormGroups::from_parallel_state();
  if (!cfg.dist.zero1()) {
    optim::parallel_grad_norm(mm.pipe ? mm.pipe->norm_params() : optim::norm_params(*mm.chunks[0]),
                              ng);
    return;
  }
  for (const ReductionGroup& g : groups) {
    optim::NormGroups mine = ng;
    if (!g.experts) mine.ep = nullptr;  // NxDOptimizer: the dense parameters' optimizer
    optim::zero1_norm_sum(0.0, mine, *g.group);
  }
}

// Where the timed step starts on this rank's clock (its time and compute so far).
struct StepStart {
  double time = 0, compute = 0;
};

// A pipeline's step: the schedule over M1 = min(M, 2 pp) microbatches, timed from the common
// start. The schedules' step time is affine in M from M = pp (1F1B, GPipe and interleaved,
// measured: docs/design/plan.md), so for M > M1 a first schedule of pp microbatches (its gradients
// kept in the buckets, as an accumulation step's) gives the cost of one more microbatch:
// (span(M1) - span(pp)) / (M1 - pp) on this rank, which includes the point-to-point transfers a
// stage waits for in the steady state, not only its forwards and backwards.
StepExtrapolation time_pipeline(const TrainConfig& cfg, MetaModel& mm,
                                std::vector<ReductionGroup>& groups, RankMemory& r,
                                StepStart& start) {
  sim::SimClock* clock = sim::current_sim_clock();
  const int64_t mb = cfg.data.micro_batch_size,
                S = cfg.data.seq_length / cfg.dist.context_parallel_size;
  const int M1 = mm.pipe->num_microbatches(), pp = mm.pipe->schedule().pp;
  const int64_t M = cfg.grad_accum_steps;
  StepExtrapolation x;
  if (M > M1) {
    mm.pipe->set_num_microbatches(pp);
    {
      std::vector<std::unique_ptr<optim::GradSync::NoSync>> no_sync;
      for (ReductionGroup& g : groups)
        if (g.sync) no_sync.push_back(std::make_unique<optim::GradSync::NoSync>(*g.sync));
      const double c = clock->compute_seconds();
      mm.pipe->run_train(zeros({pp * mb, S}, DType::i64, Device::meta),
                         zeros({pp * mb, S}, DType::i64, Device::meta));
      x.seconds = -(clock->now() - start.time);
      x.compute = -(clock->compute_seconds() - c);
    }
    mm.pipe->set_num_microbatches(M1);
    world().barrier();  // the step proper starts at one simulated time again
    start = {clock->now(), clock->compute_seconds()};
  }
  const Tensor ids = zeros({M1 * mb, S}, DType::i64, Device::meta);
  const double span0 = mm.pipe->modeled_schedule_seconds();
  const double phase0 = mm.pipe->modeled_phase_seconds();
  mm.pipe->run_train(ids, ids);
  const double phase = mm.pipe->modeled_phase_seconds() - phase0;
  r.bubble_seconds = std::max(0.0, (mm.pipe->modeled_schedule_seconds() - span0) - phase);
  if (M > M1) {
    const double n = static_cast<double>(M1 - pp);
    x.count = M - M1;
    x.seconds = (x.seconds + clock->now() - start.time) / n;
    x.compute = (x.compute + clock->compute_seconds() - start.compute) / n;
  }
  return x;
}

}  // namespace

StepExtrapolation time_meta_step(const TrainConfig& cfg, const api::ResolvedPrecision& rp,
                                 MetaModel& mm, std::vector<ReductionGroup>& groups,
                                 RankMemory& r) {
  sim::SimClock* clock = sim::current_sim_clock();
  NXD_INTERNAL_CHECK(clock != nullptr, "time_meta_step outside a sim world");
  world().barrier();  // every rank starts the step at one simulated time
  StepStart start{clock->now(), clock->compute_seconds()};
  GradOn on;
  StepExtrapolation x;
  if (mm.pipe) {
    x = time_pipeline(cfg, mm, groups, r, start);
  } else {  // two accumulation steps; the later ones cost what the second did
    // CP: this rank's seq_length / CP tokens of each sequence
    const Tensor ids =
        zeros({cfg.data.micro_batch_size, cfg.data.seq_length / cfg.dist.context_parallel_size},
              DType::i64, Device::meta);
    const int64_t accum = cfg.grad_accum_steps, run = std::min<int64_t>(accum, 2);
    for (int64_t a = 0; a < run; ++a) {
      std::vector<std::unique_ptr<optim::GradSync::NoSync>> no_sync;
      for (ReductionGroup& g : groups)
        if (g.sync && a + 1 < run)
          no_sync.push_back(std::make_unique<optim::GradSync::NoSync>(*g.sync));
      const double t = clock->now(), c = clock->compute_seconds();
      backward(mm.chunks[0]->loss(ids, ids));
      if (a + 1 == run && run < accum)  // a later microbatch, as the ones not run
        x = {accum - run, clock->now() - t, clock->compute_seconds() - c};
    }
  }
  // the DP reduction and the sums of the sequence-parallel weights' gradients over TP, in
  // NxDOptimizer::reduce's order (a pipeline summed them at the end of run_train), by the layers'
  // function, which charges meta gradients' sum
  auto sp_sums = [&] {
    if (!mm.pipe)
      for (const auto& c : mm.chunks) allreduce_sequence_parallel_gradients(*c);
  };
  if (cfg.dist.zero1()) sp_sums();
  for (ReductionGroup& g : groups)
    if (g.sync) g.sync->finish();
  if (!cfg.dist.zero1()) sp_sums();
  // the update: the sim device charges no time for the optimizer's elementwise pass (as in a
  // real run on it); ZeRO-1's all-gather of every bucket's updated shards in place, over each
  // group (DP x CP; the experts' over expert-DP), with optimizer offload once the bucket's
  // round trip to the host is done (Zero1Optimizer::step's schedule); ZeRO-3's units are
  // gathered at their next use instead
  for (ReductionGroup& g : groups) {
    if (!cfg.dist.zero1() || !g.sync) continue;
    const optim::OffloadSchedule offload = cfg.dist.optimizer_offload
                                               ? optim::OffloadSchedule(offload_buckets(cfg, rp, g))
                                               : optim::OffloadSchedule();
    const auto layout = g.sync->bucket_layout();
    for (int b = 0; b < g.sync->num_buckets(); ++b) {
      r.offload_seconds += offload.wait(static_cast<size_t>(b));
      const bool unit = !g.unit_of.empty() && g.unit_of[static_cast<size_t>(layout[b][0])] != 0;
      if (g.group->size() > 1 && !unit)
        optim::zero1_all_gather(*g.group, nullptr, nullptr, g.sync->shard_numel(b), rp.param_dtype);
    }
  }
  // the loss's and the norm's sums (the plan keeps them after the update, as it has timed them)
  loss_collectives(mm);
  gradient_norm(cfg, mm, groups);
  // nxd-train's preemption agreement after every step (Trainer::check_preemption under cli.cpp's
  // PreemptionGuard: one i32 over the world)
  trainer::agreed_preemption_signal();
  r.step_seconds = clock->now() - start.time;
  r.compute_seconds = clock->compute_seconds() - start.compute;
  return x;
}

}  // namespace nxd::train_app::detail
