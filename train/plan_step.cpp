// One training step on meta tensors on the sim clock (plan_internal.h): what nxd-plan models.
#include <optional>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/runtime/context.h"
#include "nxd/train/plan_internal.h"

namespace nxd::trainer::detail {

namespace {

struct GradOn {
  bool prev = GradMode::is_enabled();
  GradOn() { GradMode::set_enabled(true); }
  ~GradOn() { GradMode::set_enabled(prev); }
};

}  // namespace

void time_meta_step(const TrainConfig& cfg, const ResolvedPrecision& rp, MetaModel& mm,
                    optim::GradSync* sync, RankMemory& r) {
  sim::SimClock* clock = sim::current_sim_clock();
  NXD_INTERNAL_CHECK(clock != nullptr, "time_meta_step outside a sim world");
  world().barrier();  // every rank starts the step at one simulated time
  const double t0 = clock->now(), c0 = clock->compute_seconds();
  GradOn on;
  // CP: this rank's seq_length / CP tokens of each sequence
  const int64_t mb = cfg.data.micro_batch_size,
                S = cfg.data.seq_length / cfg.dist.context_parallel_size;
  // The step's microbatches are alike: the planner runs a few of them (a pipeline's schedule
  // over M1 <= 2 x pp microbatches, two accumulation steps) and adds the others at the
  // steady-state time of one (the slowest stage's forward and backward for a pipeline, whose
  // bubble does not grow with M).
  double extra = 0, extra_compute = 0;
  if (mm.pipe) {
    const int64_t M1 = mm.pipe->schedule().num_microbatches, M = cfg.grad_accum_steps;
    const Tensor ids = zeros({M1 * mb, S}, DType::i64, Device::meta);
    const double span0 = mm.pipe->modeled_schedule_seconds();
    const double phase0 = mm.pipe->modeled_phase_seconds(), cc0 = clock->compute_seconds();
    mm.pipe->run_train(ids, ids);
    const double phase = mm.pipe->modeled_phase_seconds() - phase0;
    r.bubble_seconds = std::max(0.0, (mm.pipe->modeled_schedule_seconds() - span0) - phase);
    double slope = phase / static_cast<double>(M1);
    world().all_reduce(&slope, &slope, 1, DType::f64, ReduceOp::max);
    extra = static_cast<double>(M - M1) * slope;
    extra_compute =
        static_cast<double>(M - M1) * (clock->compute_seconds() - cc0) / static_cast<double>(M1);
  } else {
    const Tensor ids = zeros({mb, S}, DType::i64, Device::meta);
    const int64_t accum = cfg.grad_accum_steps, run = std::min<int64_t>(accum, 2);
    for (int64_t a = 0; a < run; ++a) {
      std::optional<optim::GradSync::NoSync> no_sync;
      if (sync && a + 1 < run) no_sync.emplace(*sync);
      const double t = clock->now(), c = clock->compute_seconds();
      backward(mm.chunks[0]->loss(ids, ids));
      if (a + 1 == run && run < accum) {  // a later microbatch, as the ones not run
        extra = static_cast<double>(accum - run) * (clock->now() - t);
        extra_compute = static_cast<double>(accum - run) * (clock->compute_seconds() - c);
      }
    }
  }
  if (sync) sync->finish();
  // the update: the sim device charges no time for the optimizer's elementwise pass (as in a
  // real run on it); ZeRO-1's all-gather of every bucket's updated shards in place
  const int dp = parallel_state::get_data_context_parallel_size();  // ZeRO-1's group: DP x CP
  if (cfg.dist.zero1 && sync && dp > 1) {
    Communicator& g = parallel_state::get_data_context_parallel_group();
    for (int b = 0; b < sync->num_buckets(); ++b)
      g.all_gather(nullptr, nullptr, sync->shard_numel(b), rp.param_dtype);
  }
  // the global gradient norm: one scalar reduced over the world
  double norm = 0;
  world().all_reduce(&norm, &norm, 1, DType::f64, ReduceOp::sum);
  r.step_seconds = clock->now() - t0 + extra;
  r.compute_seconds = clock->compute_seconds() - c0 + extra_compute;
}

}  // namespace nxd::trainer::detail
