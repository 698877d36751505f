#pragma once
// The planner's pieces shared by plan.cpp (memory), plan_state.cpp (the gradient buckets and the
// optimizer state) and plan_step.cpp (the modeled step).
#include <memory>
#include <vector>

#include "nxd/api/nxd_config.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/pipeline/pipeline_model.h"
#include "nxd/train_app/plan.h"

namespace nxd::train_app::detail {

// The model this rank holds, on the meta device, as the trainer builds it.
struct MetaModel {
  std::shared_ptr<pipeline::PipelineModel> pipe;
  std::vector<std::shared_ptr<CausalLM>> chunks;
  std::vector<optim::NamedParam> params;  // registration order
};

// Parameters whose gradients are averaged (and, with ZeRO-1, whose optimizer state is sharded)
// over one group, as the trainer's optimizer lays them out (api/nxd_optimizer.cpp): the dense
// parameters over data x context parallel; with expert parallelism the experts' weights over the
// expert-data-parallel group (NxD's second ZeRO-1 optimizer).
struct ReductionGroup {
  bool experts = false;                   // the experts' weights (EP > 1)
  std::vector<optim::NamedParam> params;  // registration order
  std::shared_ptr<Communicator> group;
  std::unique_ptr<optim::GradSync> sync;  // null where the trainer has no buckets either
  // ZeRO-3: per parameter its unit (optim::UnitModules::unit_of: the decoder layers, then the
  // lookup and root units; 0 none); the units' parameters are sharded (optim::shard_meta_units).
  // Empty below stage 3.
  std::vector<int> unit_of;
};

// The reduction groups of this rank's model, with their gradient buckets allocated (measured
// into r.gradients), and the optimizer state and the step's buffers counted into r.parameters
// (ZeRO-1's flat buffers' padding), r.optimizer_state and r.collective_buffers.
std::vector<ReductionGroup> plan_resident_state(const TrainConfig& cfg,
                                                const api::ResolvedPrecision& rp,
                                                const MetaModel& mm, RankMemory& r);

// The microbatches of a step the planner did not run, and what one of them costs this rank:
// plan_memory adds count x the slowest rank's `seconds` to every rank's step (and count x its
// own `compute` to its compute), after the ranks are done, so that the bookkeeping moves no sim
// clock.
struct StepExtrapolation {
  int64_t count = 0;
  double seconds = 0, compute = 0;
};

// One training step of `mm` on meta tensors from a common start of every rank (a barrier) to the
// end of nxd-train's step (its preemption agreement included), filling r's step, compute and
// bubble seconds: the Trainer's own step (trainer/training_step.h) over `mm` wrapped in the
// trainer's NxDModel and NxDOptimizer, whose buckets replace `groups`' (freed here).
StepExtrapolation time_meta_step(const TrainConfig& cfg, const api::ResolvedPrecision& rp,
                                 MetaModel& mm, std::vector<ReductionGroup>& groups, RankMemory& r);

}  // namespace nxd::train_app::detail
