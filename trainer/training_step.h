#pragma once
// One automatic-optimization training step on NxD's training API, the one function the Trainer
// (Trainer::train_step) and nxd-plan's modeled step (train_app/plan_step.cpp, on the meta model)
// both run:
//   without a pipeline: per micro batch the module's forward (StepWork::micro_batch_loss), the
//   backward of loss / micro_batches (all but the last under the DP buckets' no_sync), the loss's
//   sum over DP; with a pipeline: NxDModel::run_train over the step's micro batches as the
//   pipeline's microbatches and the stages' step metrics (step_metrics.h);
//   then NxDOptimizer::step_if_finite (SP sums, the DP reduction or ZeRO-1's reduce-scatter, the
//   global norm and clipping, the optimizer's update and ZeRO-1's all-gather) and zero_grad.
// A meta loss (nxd-plan) has no value: it counts as 0, so the step runs every collective and
// charges every kernel of a real one on the sim clock.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nxd/api/nxd_model.h"
#include "nxd/api/nxd_optimizer.h"
#include "nxd/trainer/data.h"

namespace nxd::trainer {

struct StepWork {
  int64_t micro_batches = 1;
  // Without a pipeline: micro batch a's scalar loss (its forward).
  std::function<Tensor(int64_t a)> micro_batch_loss;
  // Optional: called after micro batch a's backward, before the DP reduction (nxd-plan times
  // them); with a pipeline once, after run_train, with a = micro_batches - 1.
  std::function<void(int64_t a)> after_backward;
  // With a pipeline: the step's micro batches as one batch (rows in micro batch order).
  std::function<Batch()> pipeline_batch;
};

struct StepResult {
  double loss = 0;       // the global batch's mean loss (the same on every rank)
  bool applied = true;   // false: the loss or the gradient norm was not finite, nothing updated
  double grad_norm = 0;  // the global norm before clipping
  // With a pipeline: the stages' figures to log (pipeline_step_metrics).
  std::vector<std::pair<std::string, double>> metrics;
};

StepResult run_training_step(api::NxDModel& model, api::NxDOptimizer& optimizer,
                             const StepWork& work);

}  // namespace nxd::trainer
