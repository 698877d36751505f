#include "nxd/trainer/training_step.h"

#include <optional>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/step_hooks.h"
#include "nxd/trainer/step_metrics.h"
#include "nxd/trainer/trainer.h"

namespace nxd::trainer {

namespace {
// A loss's value; a meta loss (nxd-plan's step) has none: 0.
double value_of(const Tensor& loss) {
  return loss.is_meta() ? 0.0 : loss.item();
}
}  // namespace

StepResult run_training_step(api::NxDModel& model, api::NxDOptimizer& optimizer,
                             const StepWork& work) {
  StepResult r;
  const int64_t accum = work.micro_batches;
  if (model.is_pipeline()) {
    const Batch b = work.pipeline_batch();
    r.loss = value_of(model.run_train(b.ids, b.targets));  // averaged over DP already
    if (work.after_backward) work.after_backward(accum - 1);
    r.metrics = pipeline_step_metrics(model.local_modules());
  } else {
    const double inv_accum = 1.0 / static_cast<double>(accum);
    double loss_sum = 0;
    TrainingLossScale loss_scale(inv_accum);  // for layers that inject an auxiliary loss's gradient
    for (int64_t a = 0; a < accum; ++a) {
      // only the last micro batch's backward launches the DP reductions
      std::optional<optim::GradSync::NoSync> no_sync;
      if (a + 1 < accum) no_sync.emplace(optimizer.sync());
      const Tensor loss = work.micro_batch_loss(a);
      loss_sum += value_of(loss);
      backward(accum == 1 ? loss : mul(loss, inv_accum));
      if (work.after_backward) work.after_backward(a);
    }
    // the global batch's mean
    r.loss =
        data_parallel_sum({loss_sum * inv_accum})[0] / parallel_state::get_data_parallel_size();
  }
  // SP sums, the DP reduction (or ZeRO-1's reduce-scatter), the norm and clipping, the update
  r.applied = optimizer.step_if_finite(r.loss);
  r.grad_norm = optimizer.grad_norm().value_or(0.0);
  optimizer.zero_grad();
  return r;
}

}  // namespace nxd::trainer
