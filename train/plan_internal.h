#pragma once
// The planner's pieces shared by plan.cpp (memory) and plan_step.cpp (the modeled step).
#include <memory>
#include <vector>

#include "nxd/api/nxd_config.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/pipeline/pipeline_model.h"
#include "nxd/train/plan.h"

namespace nxd::trainer::detail {

// The model this rank holds, on the meta device, as the trainer builds it.
struct MetaModel {
  std::shared_ptr<pipeline::PipelineModel> pipe;
  std::vector<std::shared_ptr<CausalLM>> chunks;
  std::vector<optim::NamedParam> params;  // registration order
};

// One training step of `mm` on meta tensors from a common start of every rank (a barrier),
// filling r's step, compute and bubble seconds. `sync`: the optimizer's gradient buckets (null
// without them).
void time_meta_step(const TrainConfig& cfg, const ResolvedPrecision& rp, MetaModel& mm,
                    optim::GradSync* sync, RankMemory& r);

}  // namespace nxd::trainer::detail
