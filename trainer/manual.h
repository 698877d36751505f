#pragma once
// Manual optimization (Lightning's automatic_optimization = False; NeuronLTModule's only mode):
// the module's training_step runs backward and the optimizer step itself, through the objects
// TrainingModule::optimizers() and lr_schedulers() return during fit:
//
//   MyModule() { automatic_optimization = false; }
//   Tensor training_step(const Batch& b, int64_t batch_idx) override {
//     Tensor loss = div(model_loss(b), kAccum);   // gradient accumulation: a call pattern
//     manual_backward(loss);
//     if ((batch_idx + 1) % kAccum == 0) {
//       clip_gradients(1.0);                       // optional: reduce now, clip the global norm
//       optimizers().step();                       // the reduction (unless clipped), the update
//       optimizers().zero_grad();
//       lr_schedulers().step();
//     }
//     return loss;
//   }
//
// The trainer calls training_step once per micro batch (batch_idx counts them over the fit) until
// the module steps the optimizer; that is one trainer step: on_train_batch_end, validation,
// logging and checkpoints follow it as in automatic optimization. The step's reported loss is the
// DP mean of the sum of what training_step returned since the previous step (return each micro
// batch's loss as it was backpropagated, divided by the accumulation, and the sum is the batch's
// mean). Gradients are reduced over DP in the optimizer step (NxD's order on XLA), not during
// backward, so any number of manual_backward calls accumulate before a step. The trainer refuses
// accumulate_grad_batches != 1 and gradient_clip_val > 0 with manual optimization (as Lightning
// does): both are the module's calls, above.
#include <cstdint>
#include <optional>

#include "nxd/optim/lr_schedule.h"
#include "nxd/optim/optimizer.h"

namespace nxd::api {
class NxDOptimizer;
}  // namespace nxd::api

namespace nxd::trainer {

class Trainer;

// Lightning's LightningOptimizer over NxD's optimizer wrapper: step() is NxDOptimizer's (SP sums,
// DP reduction or ZeRO-1's reduce-scatter, the global norm, the update), one trainer step.
class ManualOptimizer {
 public:
  ManualOptimizer(Trainer& trainer, api::NxDOptimizer& opt) : trainer_(trainer), opt_(opt) {}
  // The update; not applied (every rank alike) when the global gradient norm is not finite
  // (StepOutput::skipped, the trainer's on_nonfinite).
  void step();
  void zero_grad();  // sets every gradient to none
  // Reduces the gradients and clips their global norm to max_norm; returns the norm before
  // clipping. The next step() uses these gradients as they are.
  double clip_grad_norm(double max_norm);
  // The global norm (before clipping) of the last step; nullopt before the first step.
  std::optional<double> grad_norm() const { return grad_norm_; }
  std::vector<optim::ParamGroup>& param_groups();
  optim::Optimizer& inner();  // the optimizer configure_optimizers returned (or ZeRO-1's)

 private:
  friend class Trainer;
  Trainer& trainer_;
  api::NxDOptimizer& opt_;
  std::optional<double> grad_norm_;
  double lr_ = 0;        // the first group's rate used by the last step
  bool applied_ = true;  // the last step was applied
};

// torch's LRScheduler over a schedule (optim/lr_schedule.h): at construction the optimizer's
// rate becomes lr(0), and each step() moves to the next one, so the optimizer's update number s
// (0 for the first) runs at lr(s) when step() follows each optimizer step, as in the automatic
// loop.
class LRScheduler {
 public:
  LRScheduler(optim::LRSchedule schedule, optim::Optimizer& opt);
  void step();
  int64_t last_step() const { return last_step_; }  // step() calls so far
  double lr() const { return schedule_.lr(last_step_); }
  void set_last_step(int64_t s);  // resume: the rate of that point
  const optim::LRSchedule& schedule() const { return schedule_; }

 private:
  optim::LRSchedule schedule_;
  optim::Optimizer& opt_;
  int64_t last_step_ = 0;
};

}  // namespace nxd::trainer
