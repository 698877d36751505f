// One training step on meta tensors on the sim clock (plan_internal.h): what nxd-plan models. The
// step is the Trainer's own (trainer::run_training_step) over the meta model, wrapped as the
// Trainer wraps it (NxDModel, NxDOptimizer around the optimizer nxd-train configures), so its
// forward and backward, DP reduction, norm and clipping, the optimizer's update (charged, not
// computed, on meta parameters: optim/meta_update.h) and ZeRO-1's all-gather are the run's.
#include <algorithm>
#include <memory>

#include "nxd/api/nxd_model.h"
#include "nxd/api/nxd_optimizer.h"
#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/optim/zero1.h"
#include "nxd/runtime/context.h"
#include "nxd/train_app/lm_module.h"
#include "nxd/train_app/plan_internal.h"
#include "nxd/train_app/train.h"
#include "nxd/trainer/preempt.h"
#include "nxd/trainer/training_step.h"

namespace nxd::train_app::detail {

namespace {

struct GradOn {
  bool prev = GradMode::is_enabled();
  GradOn() { GradMode::set_enabled(true); }
  ~GradOn() { GradMode::set_enabled(prev); }
};

// Where the timed step starts on this rank's clock (its time and compute so far).
struct StepStart {
  double time = 0, compute = 0;
};

// The Trainer's wrapping of the meta model: NxDModel and, around the optimizer nxd-train
// configures (lm_module.h: optimizer_for), the NxDOptimizer with its gradient buckets or ZeRO-1.
struct MetaTrainer {
  std::shared_ptr<api::NxDModel> model;
  std::unique_ptr<api::NxDOptimizer> optimizer;
};
MetaTrainer wrap_as_the_trainer(const TrainConfig& cfg, MetaModel& mm) {
  const api::NxDConfig nc = nxd_config_of(cfg);
  MetaTrainer t;
  t.model = mm.pipe ? std::make_shared<api::NxDModel>(nc, mm.pipe)
                    : std::make_shared<api::NxDModel>(nc, std::shared_ptr<Module>(mm.chunks[0]));
  t.optimizer =
      std::make_unique<api::NxDOptimizer>(nc, *t.model, optimizer_for(cfg, mm.params).optimizer);
  return t;
}

// A pipeline's step runs the schedule over M1 = min(M, 2 pp) microbatches, timed from the common
// start. The schedules' step time is affine in M from M = pp (1F1B, GPipe and interleaved,
// measured: docs/design/plan.md), so for M > M1 a first schedule of pp microbatches (its gradients
// kept in the buckets, as an accumulation step's) gives the cost of one more microbatch:
// (span(M1) - span(pp)) / (M1 - pp) on this rank, which includes the point-to-point transfers a
// stage waits for in the steady state, not only its forwards and backwards. This runs the first
// schedule and returns -span(pp); `start` moves to the step's common start.
StepExtrapolation time_first_schedule(const TrainConfig& cfg, MetaModel& mm, MetaTrainer& t,
                                      StepStart& start) {
  sim::SimClock* clock = sim::current_sim_clock();
  const int64_t mb = cfg.data.micro_batch_size,
                S = cfg.data.seq_length / cfg.dist.context_parallel_size;
  const int M1 = mm.pipe->num_microbatches(), pp = mm.pipe->schedule().pp;
  StepExtrapolation x;
  if (cfg.grad_accum_steps <= M1) return x;
  mm.pipe->set_num_microbatches(pp);
  {
    optim::GradSync::NoSync no_sync = t.optimizer->no_sync();
    const double c = clock->compute_seconds();
    const Tensor ids = zeros({pp * mb, S}, DType::i64, Device::meta);
    t.model->run_train(ids, ids);
    x.seconds = -(clock->now() - start.time);
    x.compute = -(clock->compute_seconds() - c);
  }
  mm.pipe->set_num_microbatches(M1);
  world().barrier();  // the step proper starts at one simulated time again
  start = {clock->now(), clock->compute_seconds()};
  return x;
}

}  // namespace

StepExtrapolation time_meta_step(const TrainConfig& cfg, const api::ResolvedPrecision& /*rp*/,
                                 MetaModel& mm, std::vector<ReductionGroup>& groups,
                                 RankMemory& r) {
  sim::SimClock* clock = sim::current_sim_clock();
  NXD_INTERNAL_CHECK(clock != nullptr, "time_meta_step outside a sim world");
  // the trainer's optimizer holds the gradient buckets from here (the memory plan's go first:
  // two sets of buckets would both hook the parameters)
  for (ReductionGroup& g : groups) g.sync.reset();
  MetaTrainer t = wrap_as_the_trainer(cfg, mm);
  world().barrier();  // every rank starts the step at one simulated time
  StepStart start{clock->now(), clock->compute_seconds()};
  GradOn on;
  StepExtrapolation x;
  // Everything the step's callbacks read lives here, for the whole step. A pipeline runs the
  // schedule of M1 = min(M, 2 pp) microbatches (after a first of pp when M > M1); without one the
  // step runs min(M, 3) accumulation steps, and the M - 3 not run cost what the second did: like
  // them it is neither the first (whose backward creates the gradients) nor the last (whose
  // backward launches the DP reduction; ZeRO-2's copies the gradients into the buckets).
  const int64_t accum = cfg.grad_accum_steps;
  const int64_t run = mm.pipe ? mm.pipe->num_microbatches() : std::min<int64_t>(accum, 3);
  // a microbatch's token ids (the pipeline: the step's); CP: this rank's seq_length / CP tokens
  // of each sequence
  const Tensor ids = zeros({cfg.data.micro_batch_size * (mm.pipe ? run : 1),
                            cfg.data.seq_length / cfg.dist.context_parallel_size},
                           DType::i64, Device::meta);
  double t0 = 0, c0 = 0, span0 = 0, phase0 = 0;
  trainer::StepWork work{.micro_batches = run};
  if (mm.pipe) {
    x = time_first_schedule(cfg, mm, t, start);
    span0 = mm.pipe->modeled_schedule_seconds();
    phase0 = mm.pipe->modeled_phase_seconds();
    work.pipeline_batch = [&] { return trainer::Batch{ids, ids}; };
    work.after_backward = [&](int64_t) {  // the schedule is done
      const double phase = mm.pipe->modeled_phase_seconds() - phase0;
      r.bubble_seconds = std::max(0.0, (mm.pipe->modeled_schedule_seconds() - span0) - phase);
      if (accum <= run) return;
      const double n = static_cast<double>(run - mm.pipe->schedule().pp);
      x.count = accum - run;
      x.seconds = (x.seconds + clock->now() - start.time) / n;
      x.compute = (x.compute + clock->compute_seconds() - start.compute) / n;
    };
  } else {
    work.micro_batch_loss = [&](int64_t) {
      t0 = clock->now();
      c0 = clock->compute_seconds();
      return mm.chunks[0]->loss(ids, ids);
    };
    work.after_backward = [&](int64_t a) {
      if (a == 1 && run < accum)  // a middle microbatch, as the ones not run
        x = {accum - run, clock->now() - t0, clock->compute_seconds() - c0};
    };
  }
  trainer::run_training_step(*t.model, *t.optimizer, work);
  // optimizer offload: what the update waited for the shards' round trips to the host
  if (const auto* z = dynamic_cast<const optim::Zero1Optimizer*>(&t.optimizer->inner()))
    r.offload_seconds = z->offload_wait_seconds();
  // nxd-train's preemption agreement after every step (Trainer::check_preemption under cli.cpp's
  // PreemptionGuard: one i32 over the world)
  trainer::agreed_preemption_signal();
  r.step_seconds = clock->now() - start.time;
  r.compute_seconds = clock->compute_seconds() - start.compute;
  return x;
}

}  // namespace nxd::train_app::detail
