#pragma once
// trainer/ (library nxd_trainer): the Lightning-style Trainer, the middle way to train
// (docs/MAP.md). A user writes a TrainingModule (its model, loss and optimizer) and a DataModule
// (module.h; datasets, the DP sampler and the loader in data.h) and calls Trainer::fit, which runs
// the loop on NxD's training API (api/): accumulation, validation, callbacks (callbacks.h, the
// checkpoint callback in checkpointing.h), loggers (loggers.h, metrics.csv in log.h) and graceful
// preemption (preempt.h). It knows no configuration file and no particular model: nxd-train
// (train_app/) is one user of it.
//
// Trainer: Lightning's Trainer over nxd's parallel runtime. fit(module, data) runs on the current
// Context (the single rank, an MPI process, or a sim rank thread — every rank of the world calls
// it): it applies the strategy's NxDConfig (neuronx_distributed_config: parallel_state as tensor x
// data x pipeline parallel, the matmul precision), builds the module's model (converted to bf16
// for mixed precision) and wraps it and the module's optimizer in NxD's wrappers (NxDModel,
// NxDOptimizer: the one wiring path nxd's training API also gives users), and runs the loop:
//
//   per step:  lr = schedule(step - 1)
//              for each of accumulate_grad_batches micro batches:
//                loss = module.training_step(batch); backward(loss / accumulation)
//              (DP gradient reduction in buckets during the last micro batch's backward)
//              NxDOptimizer::step: SP gradient sums over TP, the DP reduction (all-reduce, or
//              ZeRO-1's reduce-scatter), the global grad norm (clipped), the update
//              on_train_batch_end (module, callbacks); validation at val_check_interval and the
//              last step; a logged row every log_every_n_steps, at validations and the last step
//              (written and flushed); callbacks' on_step_end (ModelCheckpoint saves: after the row)
//
// With pipeline parallelism the step's micro batches are the pipeline's microbatches: they are
// concatenated and run by NxDModel::run_train on the schedule (SP sums and the tied embedding's
// gradient sum happen inside it), then NxDOptimizer::step as above. Validation runs run_eval over
// groups of that many validation micro batches.
//
// Manual optimization (TrainingModule::automatic_optimization = false, manual.h): training_step
// runs once per micro batch and the module calls manual_backward and the optimizer step; the
// trainer's step ends when the module steps the optimizer.
//
// Losses reported are the global batch's mean, the same on every rank (reduced over DP). The
// loop stops at max_steps or when a callback calls request_stop(). Same config and seed give
// bitwise-identical losses on either backend.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "nxd/api/nxd_api.h"
#include "nxd/trainer/callbacks.h"
#include "nxd/trainer/loggers.h"
#include "nxd/trainer/manual.h"
#include "nxd/trainer/module.h"

namespace nxd::trainer {

struct TrainerOptions {
  // The parallel layout and precision the trainer runs, as NxD's config (api/nxd_config.h):
  // tensor_parallel_size, pipeline_parallel_size and context_parallel_size (data-parallel size =
  // world / (tp x pp x cp); pp > 1: the module's build_pipeline_model; cp > 1: the trainer gives
  // the module this rank's chunks of every sequence, context_parallel_batch), expert_parallel_size
  // (MoE experts split over that many DP ranks), pipeline_config (schedule, virtual_pipeline_size,
  // cuts), optimizer_config.zero_one_enabled (the module's optimizer becomes a Zero1Optimizer over
  // the same groups), precision and mixed_precision_config (the module builds its model in f32; the
  // trainer converts it to bf16 for mixed_precision and bf16SR), grad_bucket_mb. The trainer
  // sets pipeline_config.num_microbatches and optimizer_config's clipping itself, from
  // accumulate_grad_batches and gradient_clip_val below (nxd_config_of).
  api::NxDConfig nxd;
  int64_t max_steps = 100;  // 0: evaluate only (the validation at the start, logged as a row)
  // Lightning's max_epochs: stop after the optimizer step that finishes this many passes over
  // the training data (DataModule::epochs_completed; whichever of max_steps and max_epochs comes
  // first); -1: no limit.
  int64_t max_epochs = -1;
  // NeuronLTModule's log_rank0: loggers and the progress bar on global rank 0 instead of the last
  // pipeline stage's first rank (the losses are already on every rank: the pipeline broadcasts
  // them from its last stage).
  bool log_rank0 = false;
  int64_t accumulate_grad_batches = 1;  // micro batches per optimizer step on each DP rank
  int64_t log_every_n_steps = 10;
  int64_t val_check_interval = 0;  // validate every N steps and at the last; 0 = never
  int64_t limit_val_batches = 8;   // validation micro batches (over all DP ranks)
  double gradient_clip_val = 0.0;  // clip the global grad norm; 0 = no clipping
  // A step whose loss or global gradient norm is not finite is never applied (the update is
  // skipped on every rank alike); "stop": fit throws NonFiniteLoss after logging the step,
  // "skip": training goes on (StepOutput::skipped; callbacks see it).
  std::string on_nonfinite = "stop";
  std::vector<std::shared_ptr<Callback>> callbacks;
  std::vector<std::shared_ptr<Logger>> loggers;  // called on the logging rank only
  std::string hparams_yaml;  // given to the loggers' log_hyperparams when not empty
  // Resume from this checkpoint (a checkpoint folder <dir>/<tag>, or a folder of checkpoints:
  // its newest complete one) at the end of setup: model, optimizer, step, data position and RNG
  // counter, so the steps after it are bitwise those of an uninterrupted run. "" = start fresh.
  std::string ckpt_path;
};

// Training diverged: a step's loss or gradient norm was NaN or infinite (on_nonfinite = "stop").
class NonFiniteLoss : public UserError {
 public:
  using UserError::UserError;
};

struct FitResult {
  int64_t steps = 0;       // optimizer steps run by this fit (after a resume: since start_step)
  int64_t start_step = 0;  // the step the fit started at (the checkpoint's after a resume)
  double first_loss = 0, last_loss = 0;
  std::optional<double> initial_val_loss, final_val_loss;  // before training, last validation
  double seconds = 0;                                      // loop wall time (validation included)
  double setup_seconds = 0;                                // model, optimizer and data setup
  double tokens_per_s = 0;     // training tokens / training time (validation excluded)
  int64_t num_parameters = 0;  // of the whole model (TP shards counted once)
  std::string stop_reason;     // "" = ran max_steps
  // sim backend: modeled seconds per training step (this rank's clock) and this rank's
  // device-memory peak
  double sim_step_seconds = 0;
  int64_t hbm_peak_bytes = 0;
  // sim backend with pipeline parallelism: the modeled bubble, the mean over ranks of the part of
  // the (slowest rank's) pipeline schedule a rank spends outside its forwards and backwards
  // (-1 without a pipeline)
  double sim_bubble = -1;
  // The largest rank's device-memory peak above what stays resident between steps (parameters,
  // optimizer state): activations, gradients and temporaries (the allocator's counters).
  int64_t activation_peak_bytes = 0;
  // The largest rank's optimizer state (Optimizer::state_bytes: 1/DP of AdamW's with ZeRO-1).
  int64_t optimizer_state_bytes = 0;
};

// DP rank 0, TP rank 0 (and, with pipelines, the last stage) of the current parallel_state, or
// world rank 0 before it is initialized: the rank that prints and logs.
bool is_logging_rank();

// ConfigError on impossible options (what the Trainer's constructor checks); otherwise the
// NxDConfig a Trainer with these options runs (Trainer::nxd_config), without building one.
api::NxDConfig nxd_config_of(const TrainerOptions& opts);

class Trainer {
 public:
  explicit Trainer(TrainerOptions opts);  // ConfigError on impossible options
  FitResult fit(TrainingModule& module, DataModule& data);
  // Lightning's fit(model, datamodule, ckpt_path): resumes from ckpt_path ("" = start fresh;
  // otherwise it overrides TrainerOptions::ckpt_path for this fit).
  FitResult fit(TrainingModule& module, DataModule& data, const std::string& ckpt_path);

  // ---- for callbacks and modules ----
  const TrainerOptions& options() const { return opts_; }
  int64_t global_step() const { return step_; }
  // The rank that prints and logs (the free is_logging_rank(), or global rank 0 with log_rank0).
  bool is_logging_rank() const;
  // Ends training after the current step (every rank must ask alike; callbacks do).
  void request_stop(const std::string& reason);
  bool should_stop() const { return !stop_reason_.empty(); }
  // The signal (SIGTERM, SIGINT) that stopped this fit under a PreemptionGuard (preempt.h), or 0;
  // the checkpoint callback then saves the last step whatever save_last says.
  int preempted_by() const { return preempt_signal_; }
  // A scalar for the loggers' next row (Lightning's self.log); the last value per name wins.
  void log(const std::string& name, double value);
  // A line for the callbacks' on_message (the progress bar prints it on the logging rank).
  void message(const std::string& line);
  optim::Optimizer& optimizer();  // during fit
  // Manual optimization (trainer/manual.h), during fit: what TrainingModule::optimizers() and
  // lr_schedulers() return (InvalidArgument in automatic optimization; the scheduler is null
  // without a schedule).
  ManualOptimizer& manual_optimizer();
  LRScheduler* lr_scheduler() { return lr_scheduler_ ? &*lr_scheduler_ : nullptr; }
  api::NxDModel& nxd_model();  // during fit: the module's model or pipeline, wrapped
  // The NxDConfig of a fit with these options (sizes, pipeline, ZeRO-1, clipping, precision).
  api::NxDConfig nxd_config() const;
  const std::optional<optim::LRSchedule>& schedule() const { return schedule_; }
  int dp_rank() const { return dp_rank_; }
  int dp_size() const { return dp_; }
  // The whole model's parameters (TP shards and tied copies counted once), after setup.
  int64_t num_parameters() const { return num_parameters_; }
  // Those that train (with LoRA: the adapters; else num_parameters()), TP shards counted once.
  int64_t num_trainable_parameters() const { return num_trainable_parameters_; }
  // What a checkpoint keeps of the loop besides model and optimizer (step, data position, RNG
  // counter) as JSON, and its restoration (trainer/checkpointing.h saves and loads it).
  nlohmann::json loop_state() const;
  void restore_loop_state(const nlohmann::json& s);

 private:
  using Clock = std::chrono::steady_clock;
  void setup(TrainingModule& module, DataModule& data);
  void build_model(TrainingModule& module);
  void setup_validation(DataModule& data);
  StepOutput train_step(TrainingModule& module, DataModule& data);
  StepOutput manual_train_step(TrainingModule& module, DataModule& data);  // manual.cpp
  void check_manual_options() const;                                       // manual.cpp
  void setup_manual();                                                     // manual.cpp
  // The loss a module's step returned, checked to be a scalar (ConfigError naming `hook`).
  static const Tensor& scalar_loss(const Tensor& loss, const char* hook);
  std::optional<double> validate(TrainingModule& module);
  std::optional<double> pipeline_validate();
  double modeled_bubble(double span_seconds, double busy_seconds) const;
  void log_row(MetricsRow row);
  void on_nonfinite_step(const StepOutput& out, double sim_step_s);
  void check_preemption();
  void teardown();
  void log_evaluation_only(double val_loss);
  void summarize_fit(FitResult& res, double train_seconds, double sim_train_seconds);
  void resume(const std::string& path);  // trainer_resume.cpp
  std::vector<double> dp_sum(std::vector<double> v) const;

  TrainerOptions opts_;
  api::NxDConfig nxd_config_;  // of the current fit
  int preempt_signal_ = 0;
  int64_t step_ = 0;
  std::string stop_reason_;
  std::map<std::string, double> pending_;
  int dp_ = 1, dp_rank_ = 0;
  int64_t num_parameters_ = 0, num_trainable_parameters_ = 0;
  pipeline::PipelineModel* pipeline_ = nullptr;       // the module's, with pipeline parallelism
  std::shared_ptr<api::NxDModel> nxd_model_;          // the module's model or pipeline
  std::unique_ptr<api::NxDOptimizer> nxd_optimizer_;  // around the module's optimizer
  std::optional<optim::LRSchedule> schedule_;
  // manual optimization: the module's optimizer and scheduler, the micro batches run
  std::unique_ptr<ManualOptimizer> manual_;
  std::optional<LRScheduler> lr_scheduler_;
  int64_t batches_ = 0;
  friend class ManualOptimizer;
  std::vector<Batch> val_batches_;
  int64_t val_lockstep_ = 0;  // ZeRO-3: validation forwards every DP rank runs (0: its own)
  TrainingModule* module_ = nullptr;
  DataModule* data_ = nullptr;
  // the logging interval
  double interval_seconds_ = 0;
  int64_t interval_tokens_ = 0;
  int64_t step_tokens_ = 0;  // tokens of one global batch (measured on the first step)
  Clock::time_point t0_;
};

// `v` summed over the data-parallel group of parallel_state (collective over it; as is at DP 1):
// the step's loss (Trainer::train_step), and the same all-reduce in nxd-plan's meta step.
std::vector<double> data_parallel_sum(std::vector<double> v);

// The whole model's parameter count: TP shards counted once (K/V replicas once).
int64_t count_parameters(Module& model, int tensor_parallel_size);

}  // namespace nxd::trainer
