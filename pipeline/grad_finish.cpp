#include "nxd/pipeline/grad_finish.h"

#include "nxd/collectives/parallel_state.h"

namespace nxd::pipeline {

namespace ps = parallel_state;

std::unique_ptr<optim::GradSync> dp_grad_sync_at_step(std::vector<optim::NamedParam> params,
                                                      int64_t bucket_bytes) {
  if (!ps::model_parallel_is_initialized()) return nullptr;
  auto group = ps::get_data_context_parallel_group_ptr();
  if (!group || group->size() < 2) return nullptr;
  optim::GradSyncOptions go;
  go.bucket_bytes = bucket_bytes;
  go.mode = optim::GradSyncMode::at_step;
  go.group = group;
  return std::make_unique<optim::GradSync>(std::move(params), go);
}

optim::NormGroups pipeline_norm_groups() {
  if (!ps::model_parallel_is_initialized()) return {};
  return optim::NormGroups::from_parallel_state();
}

}  // namespace nxd::pipeline
