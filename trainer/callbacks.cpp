#include "nxd/trainer/callbacks.h"

#include <cmath>

#include "nxd/runtime/error.h"
#include "nxd/trainer/trainer.h"

namespace nxd::trainer {

ProgressBarCallback::ProgressBarCallback(ProgressOptions opts) : opts_(opts) {}

void ProgressBarCallback::on_fit_start(Trainer& trainer, TrainingModule&) {
  if (trainer.is_logging_rank())
    bar_.emplace(trainer.options().max_steps, opts_.tty.value_or(ProgressBar::stdout_is_tty()),
                 opts_.out);
}

void ProgressBarCallback::on_log(Trainer&, const MetricsRow& row) {
  if (bar_) bar_->update(row);
}

void ProgressBarCallback::on_message(Trainer& trainer, const std::string& line) {
  if (bar_)
    bar_->message(line);
  else if (trainer.is_logging_rank())
    std::fprintf(opts_.out, "%s\n", line.c_str());
}

void ProgressBarCallback::on_fit_end(Trainer&, TrainingModule&) {
  if (bar_) bar_->finish();
  bar_.reset();
}

EarlyStopping::EarlyStopping(EarlyStoppingOptions opts) : opts_(std::move(opts)) {
  if (opts_.monitor != "val_loss" && opts_.monitor != "loss")
    throw ConfigError(
        str("[early_stopping] monitor=", opts_.monitor, " is not one of val_loss, loss"));
  if (opts_.mode != "min" && opts_.mode != "max")
    throw ConfigError(str("[early_stopping] mode=", opts_.mode, " is not one of min, max"));
  if (opts_.patience < 0)
    throw ConfigError(str("[early_stopping] patience must be >= 0, got ", opts_.patience));
  if (!(opts_.min_delta >= 0))
    throw ConfigError(str("[early_stopping] min_delta must be >= 0, got ", opts_.min_delta));
}

void EarlyStopping::check(Trainer& trainer, int64_t step, double value) {
  if (!std::isfinite(value)) {
    trainer.request_stop(str("early stopping: ", opts_.monitor, " = ", value, " at step ", step));
    return;
  }
  const double sign = opts_.mode == "min" ? 1.0 : -1.0;
  if (!best_ || sign * (*best_ - value) > opts_.min_delta) {
    best_ = value;
    wait_ = 0;
    return;
  }
  if (++wait_ > opts_.patience)
    trainer.request_stop(str("early stopping: ", opts_.monitor, " did not improve on ", *best_,
                             " for ", wait_, " checks (patience ", opts_.patience, ", min_delta ",
                             opts_.min_delta, ") at step ", step));
}

void EarlyStopping::on_validation_end(Trainer& trainer, TrainingModule&, int64_t step,
                                      double val_loss) {
  if (opts_.monitor == "val_loss") check(trainer, step, val_loss);
}

void EarlyStopping::on_train_batch_end(Trainer& trainer, TrainingModule&, const StepOutput& out) {
  if (opts_.monitor == "loss" && out.step % trainer.options().log_every_n_steps == 0)
    check(trainer, out.step, out.loss);
}

void LearningRateMonitor::on_train_batch_end(Trainer& trainer, TrainingModule&, const StepOutput&) {
  const auto& groups = trainer.optimizer().param_groups();
  for (size_t i = 0; i < groups.size(); ++i)
    trainer.log("lr-" + (groups[i].name.empty() ? std::to_string(i) : groups[i].name),
                groups[i].lr);
}

}  // namespace nxd::trainer
