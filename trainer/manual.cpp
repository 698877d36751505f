// Manual optimization (trainer/manual.h): the module's optimizer and scheduler objects and the
// trainer's step over micro batches until the module steps the optimizer.
#include "nxd/trainer/manual.h"

#include <cmath>

#include "nxd/api/nxd_optimizer.h"
#include "nxd/runtime/error.h"
#include "nxd/trainer/trainer.h"

namespace nxd::trainer {

void ManualOptimizer::step() {
  const auto& groups = opt_.inner().param_groups();
  lr_ = groups.empty() ? 0.0 : groups.front().lr;
  applied_ = opt_.step_if_finite(0.0);  // skipped on every rank alike if the norm is not finite
  grad_norm_ = opt_.grad_norm();
  ++trainer_.step_;
}

void ManualOptimizer::zero_grad() {
  opt_.zero_grad();
}

double ManualOptimizer::clip_grad_norm(double max_norm) {
  return opt_.clip_grad_norm(max_norm);
}

std::vector<optim::ParamGroup>& ManualOptimizer::param_groups() {
  return opt_.inner().param_groups();
}

optim::Optimizer& ManualOptimizer::inner() {
  return opt_.inner();
}

LRScheduler::LRScheduler(optim::LRSchedule schedule, optim::Optimizer& opt)
    : schedule_(std::move(schedule)), opt_(opt) {
  opt_.set_lr(schedule_.lr(0));
}

void LRScheduler::step() {
  ++last_step_;
  opt_.set_lr(schedule_.lr(last_step_));
}

void LRScheduler::set_last_step(int64_t s) {
  NXD_CHECK(s >= 0, "[LRScheduler] step must be >= 0, got ", s);
  last_step_ = s;
  opt_.set_lr(schedule_.lr(s));
}

ManualOptimizer& Trainer::manual_optimizer() {
  NXD_CHECK(manual_ != nullptr,
            "[trainer] manual_optimizer() needs a fit of a module with automatic_optimization = "
            "false");
  return *manual_;
}

// Lightning's refusals: accumulation and clipping are the module's calls under manual
// optimization; a pipeline runs forward and backward itself.
void Trainer::check_manual_options() const {
  if (opts_.accumulate_grad_batches != 1)
    throw ConfigError(str("[trainer] accumulate_grad_batches=", opts_.accumulate_grad_batches,
                          " with manual optimization (automatic_optimization = false): "
                          "accumulate in training_step (step the optimizer every N micro "
                          "batches) and set it to 1"));
  if (opts_.gradient_clip_val > 0)
    throw ConfigError(str("[trainer] gradient_clip_val=", opts_.gradient_clip_val,
                          " with manual optimization (automatic_optimization = false): call "
                          "clip_gradients() in training_step and set it to 0"));
  if (nxd_config_.pipeline_parallel_size > 1)
    throw ConfigError(str("[trainer] pipeline_parallel_size=", nxd_config_.pipeline_parallel_size,
                          " with manual optimization (automatic_optimization = false): the "
                          "pipeline runs forward and backward itself; use automatic optimization"));
}

void Trainer::setup_manual() {
  manual_ = std::make_unique<ManualOptimizer>(*this, *nxd_optimizer_);
  if (schedule_) lr_scheduler_.emplace(*schedule_, optimizer());
}

// Micro batches through the module's training_step until it steps the optimizer.
StepOutput Trainer::manual_train_step(TrainingModule& module, DataModule& data) {
  const int64_t before = step_;
  double loss_sum = 0;
  int64_t tokens = 0;
  while (step_ == before) {
    Batch b = data.next_train_batch();
    tokens += b.ids.defined() ? b.ids.numel() : 0;
    b = context_parallel_batch(b);
    loss_sum += scalar_loss(module.training_step(b, batches_++), "training_step").item();
  }
  if (step_tokens_ == 0) step_tokens_ = tokens * dp_;
  StepOutput out;
  out.step = step_;
  out.loss = dp_sum({loss_sum})[0] / dp_;
  out.lr = manual_->lr_;
  out.grad_norm = manual_->grad_norm_.value_or(0.0);
  out.skipped = !manual_->applied_ || !std::isfinite(out.loss);
  return out;
}

}  // namespace nxd::trainer
