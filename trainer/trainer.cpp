#include "nxd/trainer/trainer.h"

#include <algorithm>
#include <cmath>

#include <filesystem>

#include "nxd/autograd/ops.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/sim/clock.h"

namespace nxd::trainer {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The loss a module's step returned, checked to be a scalar.
const Tensor& scalar_loss(const Tensor& loss, const char* hook) {
  if (!loss.defined() || loss.numel() != 1)
    throw ConfigError(str("[trainer] ", hook, " must return a scalar loss, got ",
                          loss.defined() ? "shape " + shape_str(loss.shape()) : "no tensor"));
  return loss;
}

sim::SimClock* sim_clock() {
  return dynamic_cast<sim::SimClock*>(current_context().cost_model());
}

}  // namespace

int64_t count_parameters(Module& model, int tensor_parallel_size) {
  int64_t n = 0;
  for (const auto& p : parallel_parameters(model))
    n += p.attrs.tensor_model_parallel
             ? p.tensor.numel() * tensor_parallel_size / std::max<int64_t>(1, p.attrs.kv_replicas)
             : p.tensor.numel();
  return n;
}

Trainer::Trainer(TrainerOptions opts) : opts_(std::move(opts)) {
  auto fail = [](auto&&... a) { throw ConfigError(str("[trainer] ", a...)); };
  if (opts_.max_steps <= 0) fail("max_steps must be positive, got ", opts_.max_steps);
  if (opts_.accumulate_grad_batches <= 0)
    fail("accumulate_grad_batches must be positive, got ", opts_.accumulate_grad_batches);
  if (opts_.log_every_n_steps <= 0)
    fail("log_every_n_steps must be positive, got ", opts_.log_every_n_steps);
  if (opts_.val_check_interval < 0 || opts_.limit_val_batches < 0)
    fail("val_check_interval and limit_val_batches must be >= 0, got ", opts_.val_check_interval,
         " and ", opts_.limit_val_batches);
  if (!(opts_.gradient_clip_val >= 0))
    fail("gradient_clip_val must be >= 0, got ", opts_.gradient_clip_val);
  if (opts_.strategy.tensor_parallel_size <= 0)
    fail("strategy.tensor_parallel_size must be positive, got ",
         opts_.strategy.tensor_parallel_size);
  if (!(opts_.strategy.grad_bucket_mb > 0))
    fail("strategy.grad_bucket_mb must be positive, got ", opts_.strategy.grad_bucket_mb);
}

bool Trainer::is_logging_rank() const {
  if (!parallel_state::model_parallel_is_initialized()) return current_context().rank() == 0;
  return parallel_state::get_data_parallel_rank() == 0 &&
         parallel_state::get_tensor_model_parallel_rank() == 0 &&
         parallel_state::is_pipeline_last_stage();
}

void Trainer::request_stop(const std::string& reason) {
  if (stop_reason_.empty()) stop_reason_ = reason.empty() ? "stopped" : reason;
}

void Trainer::log(const std::string& name, double value) {
  pending_[name] = value;
}

void Trainer::message(const std::string& line) {
  for (auto& cb : opts_.callbacks) cb->on_message(*this, line);
}

optim::Optimizer& Trainer::optimizer() {
  if (!optimizer_) throw InternalError("[trainer] optimizer() outside fit");
  return *optimizer_;
}

std::vector<double> Trainer::dp_sum(std::vector<double> v) const {
  if (dp_ > 1)
    parallel_state::get_data_parallel_group().all_reduce(
        v.data(), v.data(), static_cast<int64_t>(v.size()), DType::f64, ReduceOp::sum);
  return v;
}

// Parallel layout, model, optimizer, gradient sync and data, in that order.
void Trainer::setup(TrainingModule& module, DataModule& data) {
  Context& ctx = current_context();
  const int tp = static_cast<int>(opts_.strategy.tensor_parallel_size);
  if (ctx.world_size() % tp != 0)
    throw ConfigError(str("[trainer] world size ", ctx.world_size(),
                          " is not a multiple of tensor_parallel_size ", tp));
  if (ctx.world_size() > 1 && !parallel_state::model_parallel_is_initialized())
    parallel_state::initialize_model_parallel(tp);
  else if (parallel_state::model_parallel_is_initialized() &&
           parallel_state::get_tensor_model_parallel_size() != tp)
    throw ConfigError(str("[trainer] strategy.tensor_parallel_size=", tp,
                          " but parallel_state is initialized with tensor parallel size ",
                          parallel_state::get_tensor_model_parallel_size()));
  dp_ = parallel_state::get_data_parallel_size();
  dp_rank_ = parallel_state::get_data_parallel_rank();
  module_ = &module;
  data_ = &data;
  module.trainer_ = this;
  module.model_ = module.build_model();
  if (!module.model_) throw ConfigError("[trainer] build_model() returned no model");
  Module& model = *module.model_;
  model.train();
  for (const auto& p : parallel_parameters(model))
    sequence_parallel_ = sequence_parallel_ || p.attrs.sequence_parallel_enabled;
  OptimizerSetup os = module.configure_optimizers();
  if (!os.optimizer) throw ConfigError("[trainer] configure_optimizers() returned no optimizer");
  optimizer_ = std::move(os.optimizer);
  schedule_ = std::move(os.schedule);
  grad_sync_ = std::make_unique<optim::GradSync>(
      model,
      optim::GradSyncOptions{static_cast<int64_t>(opts_.strategy.grad_bucket_mb * (1 << 20))});
  norm_params_ = optim::norm_params(model);
  norm_groups_ = optim::NormGroups::from_parallel_state();
  data.setup(DataSetup{dp_rank_, dp_});
  if (opts_.val_check_interval > 0 && opts_.limit_val_batches > 0)
    val_batches_ = data.val_batches(opts_.limit_val_batches);
  if (!opts_.ckpt_path.empty()) resume(opts_.ckpt_path);
}

nlohmann::json Trainer::loop_state() const {
  nlohmann::json s = {{"step", step_},
                      {"rng_seed", current_context().rng().seed()},
                      {"rng_counter", current_context().rng().counter()},
                      {"dp_size", dp_},
                      {"data", nullptr}};
  if (data_)
    if (auto d = data_->state()) s["data"] = {{"epoch", d->epoch}, {"position", d->position}};
  return s;
}

void Trainer::restore_loop_state(const nlohmann::json& s) {
  try {
    const int64_t step = s.at("step").get<int64_t>();
    if (step < 0) throw ConfigError(str("[trainer] checkpoint step ", step, " is negative"));
    Generator& g = current_context().rng();
    g.set_seed(s.at("rng_seed").get<uint64_t>());
    g.set_counter(s.at("rng_counter").get<uint64_t>());
    if (data_ && !s.at("data").is_null()) {
      // Positions count this rank's micro batches: at another DP size the same number of
      // samples taken is position * saved_dp / dp (the epoch's sample order is the same).
      const int64_t saved_dp = s.value("dp_size", int64_t{dp_});
      int64_t pos = s["data"].at("position").get<int64_t>();
      if (saved_dp != dp_) {
        if (pos * saved_dp % dp_ != 0)
          throw ConfigError(str("[trainer] cannot resume at data parallel size ", dp_,
                                ": the checkpoint was saved at ", saved_dp, " after ", pos,
                                " micro batches per rank in its epoch, not a whole number at ",
                                dp_));
        pos = pos * saved_dp / dp_;
      }
      data_->set_state(DataState{s["data"].at("epoch").get<int64_t>(), pos});
    }
    step_ = step;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str("[trainer] checkpoint trainer state ", s.dump(), ": ", e.what()));
  }
}

// Model, optimizer (its steps and state) and the loop's state from a checkpoint (collective).
void Trainer::resume(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path root = path;
  std::string tag;
  if (fs::exists(root / "checkpoint")) {  // a checkpoint folder itself
    tag = root.filename().string();
    root = root.parent_path();
  } else if (auto newest = ckpt::newest_checkpoint(root)) {
    tag = *newest;
  }
  const nlohmann::json user =
      ckpt::load_checkpoint(root, module_->model_.get(), optimizer_.get(), nullptr, {.tag = tag});
  if (!user.is_object() || !user.contains("trainer"))
    throw ConfigError(str("[trainer] ", path,
                          " holds no trainer state (not saved by the trainer's "
                          "ModelCheckpoint)"));
  restore_loop_state(user["trainer"]);
  message(str("resumed from ", (root / tag).string(), " at step ", step_));
}

// One optimizer step over accumulate_grad_batches micro batches.
StepOutput Trainer::train_step(TrainingModule& module, DataModule& data) {
  StepOutput out;
  out.step = step_ + 1;
  out.lr = schedule_ ? schedule_->lr(step_) : optimizer_->param_groups().front().lr;
  if (schedule_) optimizer_->set_lr(out.lr);
  const int64_t accum = opts_.accumulate_grad_batches;
  const double inv_accum = 1.0 / static_cast<double>(accum);
  double loss_sum = 0;
  int64_t tokens = 0;
  for (int64_t a = 0; a < accum; ++a) {
    Batch b = data.next_train_batch();
    tokens += b.ids.defined() ? b.ids.numel() : 0;
    // only the last micro batch's backward launches the DP all-reduces
    std::optional<optim::GradSync::NoSync> no_sync;
    if (a + 1 < accum) no_sync.emplace(*grad_sync_);
    Tensor loss = scalar_loss(module.training_step(b, step_ * accum + a), "training_step");
    loss_sum += loss.item();
    backward(accum == 1 ? loss : mul(loss, inv_accum));
  }
  if (step_tokens_ == 0) step_tokens_ = tokens * dp_;
  // the order matters: DP average, then the SP sums over TP, then the norm over TP
  grad_sync_->finish();
  if (sequence_parallel_) allreduce_sequence_parallel_gradients(*module.model_);
  out.grad_norm =
      opts_.gradient_clip_val > 0
          ? optim::clip_parallel_grad_norm(norm_params_, opts_.gradient_clip_val, norm_groups_)
          : optim::parallel_grad_norm(norm_params_, norm_groups_);
  optimizer_->step();
  optimizer_->zero_grad(/*set_to_none=*/true);
  out.loss = dp_sum({loss_sum * inv_accum})[0] / dp_;  // the global batch's mean
  ++step_;
  return out;
}

// The mean validation loss over every DP rank's batches (the same value on every rank).
std::optional<double> Trainer::validate(TrainingModule& module) {
  const int64_t n = static_cast<int64_t>(dp_sum({static_cast<double>(val_batches_.size())})[0]);
  if (n == 0) return std::nullopt;
  NoGradGuard ng;
  module.model_->eval();
  double sum = 0;
  for (size_t i = 0; i < val_batches_.size(); ++i)
    sum += scalar_loss(module.validation_step(val_batches_[i], static_cast<int64_t>(i)),
                       "validation_step")
               .item();
  module.model_->train();
  const double v = dp_sum({sum})[0] / static_cast<double>(n);
  for (auto& cb : opts_.callbacks) cb->on_validation_end(*this, module, step_, v);
  return v;
}

void Trainer::log_row(MetricsRow row) {
  row.tokens_per_s = interval_seconds_ > 0 ? interval_tokens_ / interval_seconds_ : 0;
  row.epoch = data_->epoch();
  row.elapsed_s = seconds_since(t0_);
  if (sim_clock()) row.hbm_peak_bytes = current_context().memory().peak();
  if (is_logging_rank())
    for (auto& l : opts_.loggers) l->log_metrics(row, pending_);
  pending_.clear();
  for (auto& cb : opts_.callbacks) cb->on_log(*this, row);
  interval_seconds_ = 0;
  interval_tokens_ = 0;
}

void Trainer::teardown() {
  if (module_) module_->trainer_ = nullptr;
  module_ = nullptr;
  data_ = nullptr;
  optimizer_.reset();
  grad_sync_.reset();
  norm_params_.clear();
  val_batches_.clear();
}

FitResult Trainer::fit(TrainingModule& module, DataModule& data) {
  struct Teardown {
    Trainer* t;
    ~Teardown() { t->teardown(); }
  } teardown{this};
  const auto t_setup = Clock::now();
  step_ = 0;
  stop_reason_.clear();
  pending_.clear();
  setup(module, data);
  FitResult res;
  res.num_parameters =
      count_parameters(*module.model_, static_cast<int>(opts_.strategy.tensor_parallel_size));
  if (is_logging_rank() && !opts_.hparams_yaml.empty())
    for (auto& l : opts_.loggers) l->log_hyperparams(opts_.hparams_yaml);
  for (auto& cb : opts_.callbacks) cb->on_fit_start(*this, module);
  module.on_fit_start();
  res.setup_seconds = seconds_since(t_setup);

  sim::SimClock* clock = sim_clock();
  res.initial_val_loss = opts_.val_check_interval > 0 ? validate(module) : std::nullopt;
  t0_ = Clock::now();
  double train_seconds = 0, sim_train_seconds = 0;
  while (step_ < opts_.max_steps && !should_stop()) {
    const auto ts = Clock::now();
    const double sim_t0 = clock ? clock->now() : 0.0;
    StepOutput out = train_step(module, data);
    const double sim_step = clock ? clock->now() - sim_t0 : 0.0;
    sim_train_seconds += sim_step;
    const double step_s = seconds_since(ts);
    train_seconds += step_s;
    interval_seconds_ += step_s;
    interval_tokens_ += step_tokens_;
    if (step_ == 1) res.first_loss = out.loss;
    res.last_loss = out.loss;
    res.steps = step_;
    module.on_train_batch_end(out);
    for (auto& cb : opts_.callbacks) cb->on_train_batch_end(*this, module, out);

    const bool last = step_ == opts_.max_steps || should_stop();
    MetricsRow row;
    row.step = step_;
    row.loss = out.loss;
    row.lr = out.lr;
    row.grad_norm = out.grad_norm;
    if (clock) row.sim_step_s = sim_step;
    if (opts_.val_check_interval > 0 && (step_ % opts_.val_check_interval == 0 || last)) {
      row.val_loss = validate(module);
      if (row.val_loss) res.final_val_loss = row.val_loss;
    }
    if (step_ % opts_.log_every_n_steps == 0 || last || row.val_loss) log_row(row);
  }
  res.seconds = seconds_since(t0_);
  res.tokens_per_s = train_seconds > 0 ? res.steps * step_tokens_ / train_seconds : 0;
  res.stop_reason = stop_reason_;
  if (clock) {
    res.sim_step_seconds = res.steps > 0 ? sim_train_seconds / static_cast<double>(res.steps) : 0;
    res.hbm_peak_bytes = current_context().memory().peak();
  }
  for (auto& cb : opts_.callbacks) cb->on_fit_end(*this, module);
  module.on_fit_end();
  if (is_logging_rank())
    for (auto& l : opts_.loggers) l->finalize();
  return res;
}

}  // namespace nxd::trainer
