#pragma once
// Callbacks: code that hooks into Trainer::fit without changing the loop (Lightning's Callback).
// Every hook runs on every rank, in the order the callbacks were given; a hook that decides
// something (early stopping) sees the same values on every rank (losses are reduced over DP
// before callbacks see them), so every rank decides alike. Output goes through the trainer's
// logging rank (Trainer::is_logging_rank()).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "nxd/trainer/log.h"
#include "nxd/trainer/module.h"

namespace nxd::trainer {

class Callback {
 public:
  virtual ~Callback() = default;
  virtual void on_fit_start(Trainer& trainer, TrainingModule& module) {
    (void)trainer, (void)module;
  }
  // After every optimizer step, before its validation and metrics row.
  virtual void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepOutput& out) {
    (void)trainer, (void)module, (void)out;
  }
  // Last in every step, after its validation and its metrics row (written and flushed): where a
  // step's checkpoint is saved, so a checkpoint never exists without its step's row (a rank killed
  // between the two leaves a row whose step the relaunch trains again, never a missing row).
  virtual void on_step_end(Trainer& trainer, TrainingModule& module, const StepOutput& out) {
    (void)trainer, (void)module, (void)out;
  }
  // After every validation (step 0 is the one before training).
  virtual void on_validation_end(Trainer& trainer, TrainingModule& module, int64_t step,
                                 double val_loss) {
    (void)trainer, (void)module, (void)step, (void)val_loss;
  }
  // On logging steps (every log_every_n_steps, validation steps and the last), with the row the
  // loggers get.
  virtual void on_log(Trainer& trainer, const MetricsRow& row) { (void)trainer, (void)row; }
  // A line of text from the trainer (setup summary, final result).
  virtual void on_message(Trainer& trainer, const std::string& line) { (void)trainer, (void)line; }
  virtual void on_fit_end(Trainer& trainer, TrainingModule& module) { (void)trainer, (void)module; }
};

// The terminal progress bar and the trainer's messages, printed by the logging rank only (DP rank
// 0, TP rank 0, the last pipeline stage, as NxD filters its progress output).
struct ProgressOptions {
  std::FILE* out = stdout;
  std::optional<bool> tty;  // redraw in place; default: isatty(stdout)
};
class ProgressBarCallback : public Callback {
 public:
  explicit ProgressBarCallback(ProgressOptions opts = {});
  void on_fit_start(Trainer& trainer, TrainingModule& module) override;
  void on_log(Trainer& trainer, const MetricsRow& row) override;
  void on_message(Trainer& trainer, const std::string& line) override;
  void on_fit_end(Trainer& trainer, TrainingModule& module) override;

 private:
  ProgressOptions opts_;
  std::optional<ProgressBar> bar_;
};

// Stops training when `monitor` ("val_loss" or "loss") has not improved by more than min_delta
// for `patience` consecutive checks (validations for val_loss, logged steps for loss), or when it
// is not finite. mode "min" (lower is better) or "max".
struct EarlyStoppingOptions {
  std::string monitor = "val_loss";
  int64_t patience = 3;
  double min_delta = 0.0;
  std::string mode = "min";
};
class EarlyStopping : public Callback {
 public:
  explicit EarlyStopping(EarlyStoppingOptions opts = {});  // ConfigError on a bad monitor/mode
  void on_validation_end(Trainer& trainer, TrainingModule& module, int64_t step,
                         double val_loss) override;
  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepOutput& out) override;
  std::optional<double> best() const { return best_; }
  int64_t wait_count() const { return wait_; }

 private:
  void check(Trainer& trainer, int64_t step, double value);
  EarlyStoppingOptions opts_;
  std::optional<double> best_;
  int64_t wait_ = 0;
};

// Lightning's LearningRateMonitor: logs every parameter group's rate as "lr-<group name>"
// (TensorBoard scalars; metrics.csv keeps its single lr column).
class LearningRateMonitor : public Callback {
 public:
  void on_train_batch_end(Trainer& trainer, TrainingModule& module, const StepOutput& out) override;
};

}  // namespace nxd::trainer
