#pragma once
// What both pipelines (PipelineModel, GenericPipelineModel) set up for their gradients.
#include <cstdint>
#include <memory>
#include <vector>

#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"

namespace nxd::pipeline {

// The average of `params`' gradients over data x context parallel (the DP group at CP 1) at the
// end of the step (GradSync, at_step, buckets of bucket_bytes); null without parallel_state or
// with a group of one rank.
std::unique_ptr<optim::GradSync> dp_grad_sync_at_step(std::vector<optim::NamedParam> params,
                                                      int64_t bucket_bytes);
// The gradient norm's groups: parallel_state's; none (one rank) without it.
optim::NormGroups pipeline_norm_groups();

}  // namespace nxd::pipeline
