// One training step on meta tensors on the sim clock (plan_internal.h): what nxd-plan models.
#include <memory>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/runtime/context.h"
#include "nxd/train/plan_internal.h"

namespace nxd::trainer::detail {

namespace {

struct GradOn {
  bool prev = GradMode::is_enabled();
  GradOn() { GradMode::set_enabled(true); }
  ~GradOn() { GradMode::set_enabled(prev); }
};

// The groups the gradient norm sums a scalar over, in order: optim/grad_norm.cpp (EP, TP, PP);
// ZeRO-1 (optim/zero1.cpp, zero1_experts.cpp) per reduction group: TP, PP, EP (the experts'
// group only) and the group's own.
std::vector<Communicator*> norm_groups(const TrainConfig& cfg,
                                       const std::vector<ReductionGroup>& groups) {
  namespace ps = parallel_state;
  Communicator* tp = &ps::get_tensor_model_parallel_group();
  Communicator* pp = &ps::get_pipeline_model_parallel_group();
  Communicator* ep =
      ps::get_expert_model_parallel_size() > 1 ? &ps::get_expert_model_parallel_group() : nullptr;
  std::vector<Communicator*> out;
  auto add = [&](Communicator* c) {
    if (c && c->size() > 1) out.push_back(c);
  };
  if (!cfg.dist.zero1()) {
    for (Communicator* c : {ep, tp, pp}) add(c);
    return out;
  }
  for (const ReductionGroup& g : groups)
    for (Communicator* c : {tp, pp, g.experts ? ep : nullptr, g.group.get()}) add(c);
  return out;
}

// After the update: the step's loss summed over DP (Trainer::dp_sum; a pipeline averages it in
// run_train), the MoE layers' figures over the stages (trainer.cpp: log_pipeline_step_metrics), the
// gradient norm's sums over the groups it spans, and nxd-train's preemption agreement (one i32
// over the world after every step: Trainer::check_preemption under cli.cpp's PreemptionGuard).
void step_end_collectives(const TrainConfig& cfg, const MetaModel& mm,
                          const std::vector<ReductionGroup>& groups) {
  double norm = 0;
  if (mm.pipe && cfg.model.moe.enabled() && parallel_state::get_pipeline_model_parallel_size() > 1)
    for (int i = 0; i < 2; ++i) {
      double figures[2] = {0, 0};
      parallel_state::get_pipeline_model_parallel_group().all_reduce(figures, figures, 2,
                                                                     DType::f64, ReduceOp::sum);
    }
  if (!mm.pipe && parallel_state::get_data_parallel_size() > 1)
    parallel_state::get_data_parallel_group().all_reduce(&norm, &norm, 1, DType::f64,
                                                         ReduceOp::sum);
  for (Communicator* g : norm_groups(cfg, groups))
    g->all_reduce(&norm, &norm, 1, DType::f64, ReduceOp::sum);
  int32_t signal = 0;
  world().all_reduce(&signal, &signal, 1, DType::i32, ReduceOp::max);
}

// The sums of every chunk's sequence-parallel weights' gradients over TP (the norms' weights:
// allreduce_sequence_parallel_gradients, one flat all-reduce in f32 per chunk), shape only: the
// layers' function skips meta gradients.
void sequence_parallel_sums(const MetaModel& mm) {
  Communicator& tp = parallel_state::get_tensor_model_parallel_group();
  if (tp.size() == 1) return;
  for (const auto& c : mm.chunks) {
    int64_t total = 0;
    DType dt = DType::f32;
    for (const ParallelParameter& p : parallel_parameters(*c))
      if (p.attrs.sequence_parallel_enabled) {
        total += p.tensor.numel();
        if (p.tensor.dtype() == DType::f64) dt = DType::f64;
      }
    if (total > 0) tp.all_reduce(nullptr, nullptr, total, dt, ReduceOp::sum);
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

StepExtrapolation time_meta_step(const TrainConfig& cfg, const ResolvedPrecision& rp, MetaModel& mm,
                                 std::vector<ReductionGroup>& groups, RankMemory& r) {
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
  // NxDOptimizer::reduce's order (a pipeline sums them at the end of run_train)
  if (mm.pipe || cfg.dist.zero1()) sequence_parallel_sums(mm);
  for (ReductionGroup& g : groups)
    if (g.sync) g.sync->finish();
  if (!mm.pipe && !cfg.dist.zero1()) sequence_parallel_sums(mm);
  // the update: the sim device charges no time for the optimizer's elementwise pass (as in a
  // real run on it); ZeRO-1's all-gather of every bucket's updated shards in place, over each
  // group (DP x CP; the experts' over expert-DP)
  for (ReductionGroup& g : groups)
    if (cfg.dist.zero1() && g.sync && g.group->size() > 1)
      for (int b = 0; b < g.sync->num_buckets(); ++b)
        g.group->all_gather(nullptr, nullptr, g.sync->shard_numel(b), rp.param_dtype);
  step_end_collectives(cfg, mm, groups);
  r.step_seconds = clock->now() - start.time;
  r.compute_seconds = clock->compute_seconds() - start.compute;
  return x;
}

}  // namespace nxd::trainer::detail
