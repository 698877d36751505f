#pragma once
// The user's side of the trainer (PyTorch Lightning's LightningModule/LightningDataModule, as
// NeuronLTModule and NxD Training's BaseModelModule/BaseDataModule use them).
//
// A TrainingModule says how to build the model and how to compute a loss from a batch; the Trainer
// owns everything else (parallel layout, gradient accumulation, DP sync, clipping, the optimizer
// step, validation, logging, callbacks). Every rank builds its own module and calls the same hooks
// in the same order, so a module's collectives (TP layers) stay in lockstep.
//
// Hook order within Trainer::fit (tests/trainer/trainer_api_test.cpp records it):
//   build_model, configure_optimizers, (callbacks' on_fit_start) on_fit_start,
//   [validation_step x n]                                     (before the first step)
//   per step: training_step x accumulation, on_train_batch_end,
//             [validation_step x n at val_check_interval and the last step]
//   on_fit_end.
// Manual optimization (automatic_optimization = false; trainer/manual.h): training_step runs
// manual_backward and optimizers().step() itself and is called once per micro batch until it
// steps; on_train_batch_end follows each optimizer step.
// With pipeline parallelism (TrainerOptions::nxd.pipeline_parallel_size > 1) build_pipeline_model
// replaces build_model, and the pipeline computes each step's loss (its microbatches are the step's
// micro batches): training_step and validation_step are not called.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nxd/layers/module.h"
#include "nxd/optim/lr_schedule.h"
#include "nxd/optim/optimizer.h"
#include "nxd/pipeline/pipeline_model.h"
#include "nxd/trainer/data.h"
#include "nxd/trainer/manual.h"

namespace nxd::trainer {

class Trainer;

// What configure_optimizers returns: the optimizer and, optionally, the LR schedule the trainer
// applies before every step (lr = schedule.lr(step - 1)); without one the optimizer's own rates
// stay as they are.
struct OptimizerSetup {
  std::unique_ptr<optim::Optimizer> optimizer;
  std::optional<optim::LRSchedule> schedule;
};

// NxD's param_groups_by_weight_decay: `model`'s parameters in two groups at rate `lr`, weight
// decay `wd` except for biases and norm weights (names containing "bias" or "norm").
std::vector<optim::ParamGroup> param_groups_by_weight_decay(Module& model, double lr, double wd,
                                                            optim::WeightDecayOptions opts = {});
std::vector<optim::ParamGroup> param_groups_by_weight_decay(
    const std::vector<optim::NamedParam>& params, double lr, double wd,
    optim::WeightDecayOptions opts = {});

struct StepOutput {
  int64_t step = 0;      // optimizer steps done, this one included
  double loss = 0;       // mean training loss of the global batch (the same on every rank)
  double lr = 0;         // the rate this step used
  double grad_norm = 0;  // global norm before clipping
  bool skipped = false;  // not applied: the loss or grad_norm was not finite
};

class TrainingModule {
 public:
  virtual ~TrainingModule() = default;

  // Lightning's automatic_optimization: set it to false (in the constructor) and training_step
  // does backward and the optimizer step itself (manual optimization, trainer/manual.h).
  bool automatic_optimization = true;

  // Builds the model on the current rank, after the trainer initialized the parallel layout
  // (parallel_state), so parallel layers see their TP group. Called once per fit.
  virtual std::shared_ptr<Module> build_model() = 0;
  // The loss of one micro batch (a scalar with a graph). The trainer scales it for gradient
  // accumulation and runs backward. Manual optimization: the module runs manual_backward and
  // the optimizer step itself and returns the loss it backpropagated (for the step's report).
  virtual Tensor training_step(const Batch& batch, int64_t batch_idx) = 0;
  // The loss of one validation micro batch; runs in eval mode without a graph. Default: the
  // training step's loss (ConfigError under manual optimization: its training_step steps the
  // optimizer, so a module that validates overrides this).
  virtual Tensor validation_step(const Batch& batch, int64_t batch_idx);
  // The optimizer (and schedule) over local_parameters(). Default: AdamW at 1e-3 with
  // param_groups_by_weight_decay(local_parameters(), 1e-3, 0.01), no schedule.
  virtual OptimizerSetup configure_optimizers();
  // After every optimizer step, on every rank.
  virtual void on_train_batch_end(const StepOutput& out) { (void)out; }
  virtual void on_fit_start() {}
  virtual void on_fit_end() {}
  // The class name (Module::type_name) of the model's repeated transformer layer
  // ("LlamaDecoderLayer", NxD's transformer_layer_cls): the unit pipeline cuts and activation
  // checkpointing work on. A pipeline checks that every decoder layer it cuts is one module of
  // this type (PieceOptions::layer_type). "" = none declared.
  virtual std::string transformer_layer_type() const { return ""; }

  // Pipeline parallelism: this rank's stages of the model as a PipelineModel over the pipeline
  // groups the trainer initialized, with the trainer's schedule and microbatches in `opts`.
  // Default: ConfigError (this module has no pipeline path).
  virtual std::shared_ptr<pipeline::PipelineModel> build_pipeline_model(
      const pipeline::PipelineOptions& opts);

  // The model build_model returned (throws before it was built, and with a pipeline).
  Module& model() const;
  std::shared_ptr<Module> model_ptr() const { return model_; }
  // The pipeline build_pipeline_model returned; null without pipeline parallelism.
  pipeline::PipelineModel* pipeline() const { return pipeline_.get(); }
  // What this rank trains, by whole-model name: model()'s parameters or the pipeline stage's.
  std::vector<optim::NamedParam> local_parameters() const;
  // What this rank holds as modules: {&model()} or the pipeline stage's chunks (checkpoints).
  std::vector<Module*> model_parts() const;
  // The trainer running this module (throws outside fit).
  Trainer& trainer() const;

  // ---- manual optimization, inside training_step (InvalidArgument otherwise) ----
  // Lightning's self.optimizers(): NxD's optimizer around what configure_optimizers returned.
  ManualOptimizer& optimizers() const;
  // Lightning's self.lr_schedulers(): the schedule configure_optimizers returned as a scheduler
  // (ConfigError when it returned none).
  LRScheduler& lr_schedulers() const;
  // backward(loss) for a scalar loss (InvalidArgument naming its shape otherwise).
  void manual_backward(const Tensor& loss);
  // Lightning's clip_gradients (by norm): reduces the gradients and clips their global norm to
  // gradient_clip_val (> 0); returns the norm before clipping.
  double clip_gradients(double gradient_clip_val);

 private:
  friend class Trainer;
  std::shared_ptr<Module> model_;
  std::shared_ptr<pipeline::PipelineModel> pipeline_;
  Trainer* trainer_ = nullptr;
};

// A resumable position in a training stream.
struct DataState {
  int64_t epoch = 0;
  int64_t position = 0;  // micro batches taken in the epoch
};

// Where the trainer runs the data module: this rank's place in the data-parallel group, and the
// micro batches each rank takes per optimizer step (accumulate_grad_batches).
struct DataSetup {
  int64_t dp_rank = 0;
  int64_t dp_size = 1;
  int64_t accumulation = 1;
};

class DataModule {
 public:
  virtual ~DataModule() = default;
  // Called once per fit, on every rank, before any batch is asked for.
  virtual void setup(const DataSetup& where) = 0;
  // This rank's next training micro batch (an endless stream).
  virtual Batch next_train_batch() = 0;
  // This rank's share of at most `limit` validation micro batches: the same list every time.
  virtual std::vector<Batch> val_batches(int64_t limit) {
    (void)limit;
    return {};
  }
  virtual int64_t epoch() const { return 0; }  // of the last training batch
  // Passes over the training data finished by the micro batches taken so far (an epoch whose last
  // micro batch was taken counts); nullopt: not known (TrainerOptions::max_epochs refuses it).
  virtual std::optional<int64_t> epochs_completed() const { return std::nullopt; }
  virtual std::string description() const { return ""; }  // one line for the log
  // Where the training stream is (epoch, micro batches taken in it), saved in checkpoints and
  // restored on resume; a module without a resumable stream returns nullopt.
  virtual std::optional<DataState> state() const { return std::nullopt; }
  virtual void set_state(const DataState& s) { (void)s; }
};

// A DataModule over a training and an optional validation Dataset: the training set through a
// DataLoader with a DistributedSampler (shuffled per epoch from the seed, epochs of whole global
// batches), the validation set in
// order, its micro batches dealt round-robin over the DP ranks.
struct DatasetDataOptions {
  int64_t micro_batch_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;
};
class DatasetDataModule : public DataModule {
 public:
  DatasetDataModule(std::shared_ptr<const Dataset> train, std::shared_ptr<const Dataset> val,
                    DatasetDataOptions opts, std::string description = "");
  void setup(const DataSetup& where) override;
  Batch next_train_batch() override;
  std::vector<Batch> val_batches(int64_t limit) override;
  int64_t epoch() const override;
  std::optional<int64_t> epochs_completed() const override;
  std::string description() const override { return description_; }
  std::optional<DataState> state() const override;
  void set_state(const DataState& s) override;
  DataLoader& loader();  // after setup

 private:
  std::shared_ptr<const Dataset> train_, val_;
  DatasetDataOptions opts_;
  std::string description_;
  DataSetup where_;
  std::optional<DataLoader> loader_;
};

}  // namespace nxd::trainer
