#pragma once
// ModelCheckpoint: Lightning's checkpoint callback (NxD Training's exp_manager
// checkpoint_callback_params) over nxd's sharded checkpoints (checkpoint/checkpoint.h).
//
// Saves <dirpath>/step_<N> every every_n_train_steps optimizer steps (0: only at the end), after
// the step's validation and metrics row (Callback::on_step_end), and at the end of fit
// (save_last): the model, the optimizer state and the loop's state (step, data position, RNG
// counter; Trainer::loop_state) as user content under "trainer", so that
// TrainerOptions::ckpt_path resumes with bitwise the losses of an uninterrupted run. save_top_k
// keeps that many: the newest ones without a monitor, else the best by `monitor` ("loss": the
// step's training loss; "val_loss": the latest validation loss, the step's own on a validation
// step) in `mode` (checkpoints of earlier runs are not ranked). -1 keeps all. async_save writes in
// the background; the stall per save (the snapshot copy) is reported as a message.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/trainer/callbacks.h"

namespace nxd::trainer {

struct ModelCheckpointOptions {
  std::string dirpath;  // required
  int64_t every_n_train_steps = 0;
  int64_t save_top_k = -1;
  std::string monitor;  // "", "loss" or "val_loss"
  std::string mode = "min";
  bool save_last = true;
  bool async_save = false;
  bool compress = false;
  // NxD Training's exp_manager.save_bf16: the model's weights in bf16 (SaveOptions::
  // down_cast_bf16; the optimizer state, f32 masters included, as held).
  bool save_bf16 = false;
  // A ZeRO-3 model: each DP rank's blocks (per_rank) or whole tensors gathered unit by unit
  // (SaveOptions::zero3_files; nxd-train's exp_manager.zero3_checkpoint_format).
  ckpt::Zero3ModelFiles zero3_files = ckpt::Zero3ModelFiles::per_rank;
};

class ModelCheckpoint : public Callback {
 public:
  explicit ModelCheckpoint(ModelCheckpointOptions opts);  // ConfigError on bad options
  void on_fit_start(Trainer& trainer, TrainingModule& module) override;
  void on_step_end(Trainer& trainer, TrainingModule& module, const StepOutput& out) override;
  void on_validation_end(Trainer& trainer, TrainingModule& module, int64_t step,
                         double val_loss) override;
  void on_fit_end(Trainer& trainer, TrainingModule& module) override;

  // The tags saved by this callback and kept, with their monitored value (0 without a monitor).
  const std::vector<std::pair<double, std::string>>& kept() const { return kept_; }
  double total_stall_seconds() const { return stall_; }

 private:
  void save(Trainer& trainer, TrainingModule& module, int64_t step, double loss);
  bool holds_this_state(const Trainer& trainer, int64_t step, const std::string& tag) const;
  ModelCheckpointOptions opts_;
  std::vector<std::pair<double, std::string>> kept_;
  int64_t last_saved_ = -1;
  int64_t start_step_ = 0;
  double last_loss_ = 0, last_val_ = 0;
  bool have_val_ = false;
  double stall_ = 0;
};

}  // namespace nxd::trainer
