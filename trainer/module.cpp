#include "nxd/trainer/module.h"

#include "nxd/autograd/ops.h"
#include "nxd/runtime/error.h"
#include "nxd/trainer/trainer.h"

namespace nxd::trainer {

std::vector<optim::ParamGroup> param_groups_by_weight_decay(Module& model, double lr, double wd,
                                                            optim::WeightDecayOptions opts) {
  std::vector<optim::NamedParam> named;
  for (auto& [name, t] : model.named_parameters()) named.push_back({name, t});
  return optim::default_param_groups(named, lr, wd, opts);
}

std::vector<optim::ParamGroup> param_groups_by_weight_decay(
    const std::vector<optim::NamedParam>& params, double lr, double wd,
    optim::WeightDecayOptions opts) {
  return optim::default_param_groups(params, lr, wd, opts);
}

Tensor TrainingModule::validation_step(const Batch& batch, int64_t batch_idx) {
  if (!automatic_optimization)
    throw ConfigError(
        "[trainer] validation under manual optimization (automatic_optimization = false) needs "
        "the module's own validation_step: its training_step steps the optimizer");
  return training_step(batch, batch_idx);
}

OptimizerSetup TrainingModule::configure_optimizers() {
  OptimizerSetup s;
  s.optimizer =
      std::make_unique<optim::AdamW>(param_groups_by_weight_decay(local_parameters(), 1e-3, 0.01));
  return s;
}

std::shared_ptr<pipeline::PipelineModel> TrainingModule::build_pipeline_model(
    const pipeline::PipelineOptions&) {
  throw ConfigError(
      "[trainer] this module has no pipeline-parallel path (build_pipeline_model): train it "
      "with pipeline_parallel_size 1");
}

Module& TrainingModule::model() const {
  if (pipeline_)
    throw InvalidArgument(
        "[trainer] TrainingModule::model() under pipeline parallelism: use pipeline(), "
        "local_parameters() or model_parts()");
  if (!model_) throw InternalError("[trainer] TrainingModule::model() before build_model()");
  return *model_;
}

std::vector<optim::NamedParam> TrainingModule::local_parameters() const {
  if (pipeline_) return pipeline_->local_named_parameters();
  std::vector<optim::NamedParam> named;
  for (auto& [name, t] : model().named_parameters()) named.push_back({name, t});
  return named;
}

std::vector<Module*> TrainingModule::model_parts() const {
  if (!pipeline_) return {&model()};
  std::vector<Module*> parts;
  for (const auto& c : pipeline_->chunks()) parts.push_back(c.get());
  return parts;
}

Trainer& TrainingModule::trainer() const {
  if (!trainer_) throw InternalError("[trainer] TrainingModule::trainer() outside Trainer::fit");
  return *trainer_;
}

namespace {
void check_manual(const TrainingModule& m, const char* what) {
  NXD_CHECK(!m.automatic_optimization, "[trainer] ", what,
            " is for manual optimization: set automatic_optimization = false (the trainer runs "
            "backward and the optimizer step in automatic optimization)");
}
}  // namespace

ManualOptimizer& TrainingModule::optimizers() const {
  check_manual(*this, "optimizers()");
  return trainer().manual_optimizer();
}

LRScheduler& TrainingModule::lr_schedulers() const {
  check_manual(*this, "lr_schedulers()");
  LRScheduler* s = trainer().lr_scheduler();
  if (!s)
    throw ConfigError(
        "[trainer] lr_schedulers(): configure_optimizers() returned no schedule "
        "(OptimizerSetup::schedule)");
  return *s;
}

void TrainingModule::manual_backward(const Tensor& loss) {
  check_manual(*this, "manual_backward()");
  NXD_CHECK(loss.defined() && loss.numel() == 1,
            "[trainer] manual_backward needs a scalar loss, got ",
            loss.defined() ? loss.desc() : std::string("no tensor"));
  backward(loss);
}

double TrainingModule::clip_gradients(double gradient_clip_val) {
  check_manual(*this, "clip_gradients()");
  NXD_CHECK(gradient_clip_val > 0, "[trainer] clip_gradients: gradient_clip_val must be > 0, got ",
            gradient_clip_val);
  return optimizers().clip_grad_norm(gradient_clip_val);
}

DatasetDataModule::DatasetDataModule(std::shared_ptr<const Dataset> train,
                                     std::shared_ptr<const Dataset> val, DatasetDataOptions opts,
                                     std::string description)
    : train_(std::move(train)),
      val_(std::move(val)),
      opts_(opts),
      description_(std::move(description)) {
  if (!train_) throw ConfigError("[data] DatasetDataModule needs a training dataset");
  if (opts_.micro_batch_size <= 0)
    throw ConfigError(
        str("[data] micro_batch_size must be positive, got ", opts_.micro_batch_size));
}

void DatasetDataModule::setup(const DataSetup& where) {
  where_ = where;
  loader_.emplace(train_, opts_.micro_batch_size,
                  SamplerOptions{.seed = opts_.seed,
                                 .shuffle = opts_.shuffle,
                                 .dp_rank = where.dp_rank,
                                 .dp_size = where.dp_size,
                                 .accumulation = where.accumulation});
}

DataLoader& DatasetDataModule::loader() {
  if (!loader_) throw InternalError("[data] DatasetDataModule used before setup()");
  return *loader_;
}

Batch DatasetDataModule::next_train_batch() {
  return loader().next();
}

std::optional<DataState> DatasetDataModule::state() const {
  if (!loader_) return std::nullopt;
  return DataState{loader_->epoch(), loader_->position()};
}

void DatasetDataModule::set_state(const DataState& s) {
  loader().set_state(s.epoch, s.position);
}

int64_t DatasetDataModule::epoch() const {
  return loader_ ? loader_->epoch() : 0;
}

std::optional<int64_t> DatasetDataModule::epochs_completed() const {
  if (!loader_) return 0;
  return loader_->epoch() + (loader_->position() == loader_->batches_per_epoch() ? 1 : 0);
}

std::vector<Batch> DatasetDataModule::val_batches(int64_t limit) {
  std::vector<Batch> out;
  if (!val_ || val_->size() == 0 || limit <= 0) return out;
  const int64_t b = opts_.micro_batch_size;
  const int64_t n = std::min(limit, (val_->size() + b - 1) / b);
  for (int64_t i = where_.dp_rank; i < n; i += where_.dp_size) {  // dealt round-robin over DP
    std::vector<int64_t> idx;
    for (int64_t k = i * b; k < std::min((i + 1) * b, val_->size()); ++k) idx.push_back(k);
    out.push_back(make_batch(*val_, idx));
  }
  return out;
}

}  // namespace nxd::trainer
