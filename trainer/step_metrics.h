#pragma once
// The figures a pipeline's stages report for a step's last microbatch (Module::step_metrics: the
// MoE layers' aux loss, drops and expert loads), combined over this stage's chunks and over the
// stages. run_training_step (training_step.h) returns them for the Trainer to log; nxd-plan's meta
// step runs that function too, so the plan charges their all-reduces over PP (meta layers report
// no values).
#include <string>
#include <utility>
#include <vector>

#include "nxd/layers/module.h"

namespace nxd::trainer {

// Name and value of every figure, in declaration order (a figure no stage reported: 0). Collective
// over the pipeline group of parallel_state at PP > 1 whenever the chunks declare figures.
std::vector<std::pair<std::string, double>> pipeline_step_metrics(
    const std::vector<Module*>& chunks);

}  // namespace nxd::trainer
