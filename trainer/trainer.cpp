#include "nxd/trainer/trainer.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <filesystem>

#include "nxd/api/lora.h"
#include "nxd/autograd/ops.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/layers/step_hooks.h"
#include "nxd/optim/zero_stage.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/sim/clock.h"
#include "nxd/trainer/step_metrics.h"
#include "nxd/trainer/training_step.h"

namespace nxd::trainer {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

sim::SimClock* sim_clock() {
  return dynamic_cast<sim::SimClock*>(current_context().cost_model());
}

}  // namespace

const Tensor& Trainer::scalar_loss(const Tensor& loss, const char* hook) {
  if (!loss.defined() || loss.numel() != 1)
    throw ConfigError(str("[trainer] ", hook, " must return a scalar loss, got ",
                          loss.defined() ? "shape " + shape_str(loss.shape()) : "no tensor"));
  return loss;
}

int64_t count_parameters(Module& model, int tensor_parallel_size) {
  int64_t n = 0;
  for (const auto& p : parallel_parameters(model))
    n += p.attrs.tensor_model_parallel
             ? p.tensor.numel() * tensor_parallel_size / std::max<int64_t>(1, p.attrs.kv_replicas)
             : p.tensor.numel();
  return n;
}

namespace {
// count_parameters over norm parameters (a tied copy marked shared is counted by its owner).
int64_t count_norm_params(const std::vector<optim::NormParam>& ps, int tp, bool trainable_only) {
  int64_t n = 0;
  for (const auto& p : ps)
    if (!p.shared && (!trainable_only || p.param.requires_grad()))
      n += p.attrs.tensor_model_parallel
               ? p.param.numel() * tp / std::max<int64_t>(1, p.attrs.kv_replicas)
               : p.param.numel();
  return n;
}

void check_options(const TrainerOptions& opts) {
  auto fail = [](auto&&... a) { throw ConfigError(str("[trainer] ", a...)); };
  if (opts.max_steps < 0) fail("max_steps must be >= 0 (0: evaluate only), got ", opts.max_steps);
  if (opts.accumulate_grad_batches <= 0)
    fail("accumulate_grad_batches must be positive, got ", opts.accumulate_grad_batches);
  if (opts.log_every_n_steps <= 0)
    fail("log_every_n_steps must be positive, got ", opts.log_every_n_steps);
  if (opts.val_check_interval < 0 || opts.limit_val_batches < 0)
    fail("val_check_interval and limit_val_batches must be >= 0, got ", opts.val_check_interval,
         " and ", opts.limit_val_batches);
  if (opts.max_epochs == 0 || opts.max_epochs < -1)
    fail("max_epochs must be positive or -1 (no limit), got ", opts.max_epochs);
  if (opts.on_nonfinite != "stop" && opts.on_nonfinite != "skip")
    fail("on_nonfinite must be stop or skip, got '", opts.on_nonfinite, "'");
  if (!(opts.gradient_clip_val >= 0))
    fail("gradient_clip_val must be >= 0, got ", opts.gradient_clip_val);
  if (opts.nxd.tensor_parallel_size <= 0)
    fail("nxd.tensor_parallel_size must be positive, got ", opts.nxd.tensor_parallel_size);
  if (opts.nxd.pipeline_parallel_size <= 0 || opts.nxd.pipeline_config.virtual_pipeline_size <= 0)
    fail(
        "nxd.pipeline_parallel_size and pipeline_config.virtual_pipeline_size must be positive, "
        "got ",
        opts.nxd.pipeline_parallel_size, " and ", opts.nxd.pipeline_config.virtual_pipeline_size);
  if (!(opts.nxd.grad_bucket_mb > 0))
    fail("nxd.grad_bucket_mb must be positive, got ", opts.nxd.grad_bucket_mb);
}
}  // namespace

Trainer::Trainer(TrainerOptions opts) : opts_(std::move(opts)) {
  check_options(opts_);
}

bool is_logging_rank() {
  if (!parallel_state::model_parallel_is_initialized()) return current_context().rank() == 0;
  return parallel_state::get_data_parallel_rank() == 0 &&
         parallel_state::get_context_parallel_rank() == 0 &&
         parallel_state::get_tensor_model_parallel_rank() == 0 &&
         parallel_state::is_pipeline_last_stage();
}

bool Trainer::is_logging_rank() const {
  if (opts_.log_rank0) return current_context().rank() == 0;
  return trainer::is_logging_rank();
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
  if (!nxd_optimizer_) throw InternalError("[trainer] optimizer() outside fit");
  return nxd_optimizer_->inner();
}

api::NxDModel& Trainer::nxd_model() {
  if (!nxd_model_) throw InternalError("[trainer] nxd_model() outside fit");
  return *nxd_model_;
}

api::NxDConfig Trainer::nxd_config() const {
  return nxd_config_of(opts_);
}

api::NxDConfig nxd_config_of(const TrainerOptions& opts) {
  check_options(opts);
  api::NxDConfig c = opts.nxd;
  c.pipeline_config.num_microbatches = static_cast<int>(opts.accumulate_grad_batches);
  c.optimizer_config.grad_clipping = opts.gradient_clip_val > 0;
  c.optimizer_config.max_grad_norm = opts.gradient_clip_val > 0 ? opts.gradient_clip_val : 1.0;
  return c;
}

std::vector<double> data_parallel_sum(std::vector<double> v) {
  if (parallel_state::get_data_parallel_size() > 1)
    parallel_state::get_data_parallel_group().all_reduce(
        v.data(), v.data(), static_cast<int64_t>(v.size()), DType::f64, ReduceOp::sum);
  return v;
}

std::vector<double> Trainer::dp_sum(std::vector<double> v) const {
  return data_parallel_sum(std::move(v));
}

// Parallel layout, model, optimizer (with gradient buckets) and data, in that order.
void Trainer::setup(TrainingModule& module, DataModule& data) {
  Context& ctx = current_context();
  nxd_config_ = nxd_config();
  const int tp = nxd_config_.tensor_parallel_size, pp = nxd_config_.pipeline_parallel_size;
  if (ctx.world_size() % (tp * pp) != 0)
    throw ConfigError(str("[trainer] world size ", ctx.world_size(),
                          " is not a multiple of tensor_parallel_size ", tp,
                          " x pipeline_parallel_size ", pp));
  if (parallel_state::model_parallel_is_initialized() &&
      (parallel_state::get_tensor_model_parallel_size() != tp ||
       parallel_state::get_pipeline_model_parallel_size() != pp))
    throw ConfigError(str("[trainer] strategy tensor x pipeline parallel size ", tp, " x ", pp,
                          " but parallel_state is initialized with ",
                          parallel_state::get_tensor_model_parallel_size(), " x ",
                          parallel_state::get_pipeline_model_parallel_size()));
  nxd_config_ = api::neuronx_distributed_config(nxd_config_);
  dp_ = parallel_state::get_data_parallel_size();
  dp_rank_ = parallel_state::get_data_parallel_rank();
  module_ = &module;
  data_ = &data;
  module.trainer_ = this;
  batches_ = 0;
  if (!module.automatic_optimization) check_manual_options();
  build_model(module);
  OptimizerSetup os = module.configure_optimizers();
  if (!os.optimizer) throw ConfigError("[trainer] configure_optimizers() returned no optimizer");
  schedule_ = std::move(os.schedule);
  // DP reduction or ZeRO-1, SP sums, clipping, precision: NxD's optimizer wrapper (manual
  // optimization reduces in the step: its backward passes accumulate freely)
  nxd_optimizer_ = std::make_unique<api::NxDOptimizer>(
      nxd_config_, *nxd_model_, std::move(os.optimizer),
      module.automatic_optimization ? optim::GradSyncMode::overlap : optim::GradSyncMode::at_step);
  if (!module.automatic_optimization) setup_manual();
  const auto np = nxd_model_->norm_params();
  std::vector<double> n = {static_cast<double>(count_norm_params(np, tp, /*trainable_only=*/false)),
                           static_cast<double>(count_norm_params(np, tp, /*trainable_only=*/true))};
  if (pipeline_)
    parallel_state::get_pipeline_model_parallel_group().all_reduce(n.data(), n.data(), 2,
                                                                   DType::f64, ReduceOp::sum);
  num_parameters_ = static_cast<int64_t>(n[0]);
  num_trainable_parameters_ = static_cast<int64_t>(n[1]);
  data.setup(DataSetup{
      .dp_rank = dp_rank_, .dp_size = dp_, .accumulation = opts_.accumulate_grad_batches});
  if (opts_.max_epochs > 0 && !data.epochs_completed())
    throw ConfigError(str("[trainer] max_epochs=", opts_.max_epochs,
                          " needs a data module that counts its epochs "
                          "(DataModule::epochs_completed)"));
  setup_validation(data);
  if (!opts_.ckpt_path.empty()) resume(opts_.ckpt_path);
}

// The module's model (or, with pipeline parallelism, its pipeline over the step's micro batches
// as microbatches) in the precision's parameter dtype, wrapped in an NxDModel.
void Trainer::build_model(TrainingModule& module) {
  if (nxd_config_.pipeline_parallel_size > 1) {
    module.pipeline_ = module.build_pipeline_model(api::pipeline_options_for(nxd_config_));
    if (!module.pipeline_)
      throw ConfigError("[trainer] build_pipeline_model() returned no pipeline");
    pipeline_ = module.pipeline_.get();
    nxd_model_ = std::make_shared<api::NxDModel>(nxd_config_, module.pipeline_);
  } else {
    module.model_ = module.build_model();
    if (!module.model_) throw ConfigError("[trainer] build_model() returned no model");
    nxd_model_ = std::make_shared<api::NxDModel>(nxd_config_, module.model_);
  }
  if (nxd_config_.lora_config)  // adapters on the built (and loaded) model, the rest frozen
    api::apply_lora_to_parts(*nxd_config_.lora_config, nxd_model_->local_modules(),
                             nxd_config_.model_init_config.seed);
  if (api::resolve_precision(nxd_config_).param_dtype == DType::bf16)
    for (Module* m : nxd_model_->local_modules()) m->to_dtype(DType::bf16);
  nxd_model_->train(true);
}

// The validation micro batches; with a pipeline, every DP rank runs the same number of
// pipeline evaluations (groups of M micro batches).
void Trainer::setup_validation(DataModule& data) {
  if (opts_.val_check_interval > 0 && opts_.limit_val_batches > 0)
    val_batches_ = data.val_batches(opts_.limit_val_batches);
  for (Batch& b : val_batches_) b = context_parallel_batch(b);  // CP: this rank's rows
  val_lockstep_ = 0;
  // A pipeline step, and a forward under ZeRO-3 (each layer gathered over the data-parallel
  // ranks), are collective over DP: every DP rank must validate the same number of times. Every
  // rank takes part here whatever its own count (a rank without batches returning first would
  // leave the others in the all-reduce).
  const bool zero3 = nxd_config_.optimizer_config.stage() == optim::ZeroStage::three;
  if ((!pipeline_ && !zero3) || opts_.val_check_interval <= 0 || opts_.limit_val_batches <= 0)
    return;
  std::vector<double> r = {static_cast<double>(val_batches_.size()),
                           -static_cast<double>(val_batches_.size())};
  if (dp_ > 1)
    parallel_state::get_data_parallel_group().all_reduce(r.data(), r.data(), 2, DType::f64,
                                                         ReduceOp::max);
  const auto most = static_cast<int64_t>(r[0]), least = static_cast<int64_t>(-r[1]);
  if (most == 0) return;  // no validation data on any rank
  if (pipeline_) {
    const int64_t m = opts_.accumulate_grad_batches;
    if (least < m)
      throw ConfigError(str("[trainer] limit_val_batches=", opts_.limit_val_batches, " gives ",
                            least,
                            " validation micro batch(es) per data-parallel rank, fewer than the ",
                            m, " microbatches of a pipeline step: raise it to at least ", m * dp_));
    val_batches_.resize(static_cast<size_t>(least / m * m));
    return;
  }
  if (least == 0)
    throw ConfigError(str("[trainer] limit_val_batches=", opts_.limit_val_batches,
                          " gives no validation micro batch to some of the ", dp_,
                          " data-parallel ranks (", most,
                          " to others): under ZeRO-3 every rank takes part in each validation "
                          "forward (its layers are gathered over them); raise it to at least ",
                          dp_));
  // ranks with fewer batches run their first again, uncounted (validate)
  val_lockstep_ = most;
}

namespace {
// The micro batches `bs` as one batch (their rows concatenated in order).
Batch concat_batches(const std::vector<Batch>& bs) {
  std::vector<Tensor> ids, tg;
  for (const Batch& b : bs) ids.push_back(b.ids), tg.push_back(b.targets);
  return {cat_raw(ids, 0), cat_raw(tg, 0)};
}
}  // namespace

// One optimizer step over accumulate_grad_batches micro batches.
StepOutput Trainer::train_step(TrainingModule& module, DataModule& data) {
  StepOutput out;
  out.step = step_ + 1;
  optim::Optimizer& opt = optimizer();
  out.lr = schedule_ ? schedule_->lr(step_) : opt.param_groups().front().lr;
  if (schedule_) opt.set_lr(out.lr);
  const int64_t accum = opts_.accumulate_grad_batches;
  int64_t tokens = 0;
  StepWork work{.micro_batches = accum};
  if (pipeline_) {
    // the accumulation micro batches are the pipeline's microbatches
    work.pipeline_batch = [&] {
      std::vector<Batch> bs;
      for (int64_t a = 0; a < accum; ++a) {
        bs.push_back(data.next_train_batch());
        tokens += bs.back().ids.numel();
      }
      return context_parallel_batch(concat_batches(bs));
    };
  } else {
    work.micro_batch_loss = [&](int64_t a) {
      Batch b = data.next_train_batch();
      tokens += b.ids.defined() ? b.ids.numel() : 0;
      b = context_parallel_batch(b);  // CP: this rank's rows of each sequence
      return scalar_loss(module.training_step(b, step_ * accum + a), "training_step");
    };
  }
  // forward and backward, the DP reduction, clipping, the update (training_step.h)
  const StepResult r = run_training_step(*nxd_model_, *nxd_optimizer_, work);
  // the stages' figures (step_metrics.h), logged as the module's training_step logs them without PP
  for (const auto& [name, value] : r.metrics) log(name, value);
  if (step_tokens_ == 0) step_tokens_ = tokens * dp_;
  out.loss = r.loss;
  out.skipped = !r.applied;
  out.grad_norm = r.grad_norm;
  ++step_;
  return out;
}

std::vector<std::pair<std::string, double>> pipeline_step_metrics(
    const std::vector<Module*>& chunks) {
  StepMetrics m;
  for (Module* c : chunks) c->step_metrics(m);
  std::vector<std::pair<std::string, double>> out;
  if (m.empty()) return out;
  using C = StepMetrics::Combine;
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> sums, maxes;  // max figures as they are, min figures negated; none: -inf
  for (const StepMetrics::Metric& x : m.metrics()) {
    if (x.combine == C::sum)
      sums.push_back(x.value);
    else
      maxes.push_back(!x.any ? -inf : x.combine == C::max ? x.value : -x.value);
  }
  if (parallel_state::get_pipeline_model_parallel_size() > 1) {
    Communicator& pp = parallel_state::get_pipeline_model_parallel_group();
    if (!sums.empty())
      pp.all_reduce(sums.data(), sums.data(), static_cast<int64_t>(sums.size()), DType::f64,
                    ReduceOp::sum);
    if (!maxes.empty())
      pp.all_reduce(maxes.data(), maxes.data(), static_cast<int64_t>(maxes.size()), DType::f64,
                    ReduceOp::max);
  }
  size_t si = 0, mi = 0;
  for (const StepMetrics::Metric& x : m.metrics()) {
    if (x.combine == C::sum) {
      out.emplace_back(x.name, sums[si++]);
      continue;
    }
    const double v = maxes[mi++];  // no value on any stage: 0
    out.emplace_back(x.name, !std::isfinite(v) ? 0.0 : x.combine == C::max ? v : -v);
  }
  return out;
}

// The mean of run_eval over groups of M validation micro batches (the same count on every DP
// rank, set in setup); run_eval averages each over DP.
std::optional<double> Trainer::pipeline_validate() {
  const size_t m = static_cast<size_t>(opts_.accumulate_grad_batches);
  if (val_batches_.empty()) return std::nullopt;
  double sum = 0;
  for (size_t g = 0; g < val_batches_.size(); g += m) {
    const Batch b = concat_batches({val_batches_.begin() + g, val_batches_.begin() + g + m});
    sum += nxd_model_->run_eval(b.ids, b.targets).item();
  }
  return sum / static_cast<double>(val_batches_.size() / m);
}

// The mean over the world's ranks of 1 - busy / span, against the slowest rank's span: the
// part of the pipeline schedules spent outside forwards and backwards.
double Trainer::modeled_bubble(double span_seconds, double busy_seconds) const {
  Communicator& w = world();
  std::vector<double> slowest = {span_seconds}, busy = {busy_seconds};
  w.all_reduce(slowest.data(), slowest.data(), 1, DType::f64, ReduceOp::max);
  if (!(slowest[0] > 0)) return 0;
  std::vector<double> idle = {1.0 - busy[0] / slowest[0]};
  w.all_reduce(idle.data(), idle.data(), 1, DType::f64, ReduceOp::avg);
  return idle[0];
}

// The mean validation loss over every DP rank's batches (the same value on every rank).
std::optional<double> Trainer::validate(TrainingModule& module) {
  if (pipeline_) {
    std::optional<double> v = pipeline_validate();
    if (v)
      for (auto& cb : opts_.callbacks) cb->on_validation_end(*this, module, step_, *v);
    return v;
  }
  const int64_t n = static_cast<int64_t>(dp_sum({static_cast<double>(val_batches_.size())})[0]);
  if (n == 0) return std::nullopt;
  NoGradGuard ng;
  module.model_->eval();
  // each micro batch's mean loss weighted by its samples: the mean over the samples validated,
  // whatever the micro batch size (the split's last micro batch may be partial)
  double sum = 0, samples = 0;
  for (size_t i = 0; i < val_batches_.size(); ++i) {
    const double b = static_cast<double>(val_batches_[i].ids.size(0));
    sum += b * scalar_loss(module.validation_step(val_batches_[i], static_cast<int64_t>(i)),
                           "validation_step")
                   .item();
    samples += b;
  }
  // ZeRO-3: as many forwards as the rank with the most batches (setup_validation), the extra
  // ones on this rank's first batch and not counted, so every layer gather has every rank
  for (int64_t i = static_cast<int64_t>(val_batches_.size()); i < val_lockstep_; ++i)
    module.validation_step(val_batches_[0], i);
  module.model_->train();
  const std::vector<double> t = dp_sum({sum, samples});
  const double v = t[0] / t[1];
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
  manual_.reset();
  lr_scheduler_.reset();
  nxd_optimizer_.reset();
  nxd_model_.reset();
  pipeline_ = nullptr;
  val_batches_.clear();
}

// The one row of an evaluation-only fit (max_steps 0): the validation loss, no training loss.
void Trainer::log_evaluation_only(double val_loss) {
  if (!is_logging_rank()) return;
  MetricsRow row;
  row.step = step_;
  row.loss = std::numeric_limits<double>::quiet_NaN();  // no training loss: an empty cell
  row.val_loss = val_loss;
  row.epoch = data_->epoch();
  for (auto& l : opts_.loggers) l->log_metrics(row, {{"val_perplexity", std::exp(val_loss)}});
}

// The fit's figures after its last step: rates, the modeled step and bubble, memory (collective).
void Trainer::summarize_fit(FitResult& res, double train_seconds, double sim_train_seconds) {
  res.seconds = seconds_since(t0_);
  res.tokens_per_s = train_seconds > 0 ? res.steps * step_tokens_ / train_seconds : 0;
  res.stop_reason = stop_reason_;
  if (sim_clock() != nullptr) {
    res.sim_step_seconds = res.steps > 0 ? sim_train_seconds / static_cast<double>(res.steps) : 0;
    res.hbm_peak_bytes = current_context().memory().peak();
    if (pipeline_ && res.steps > 0)  // collective: every rank has a clock
      res.sim_bubble =
          modeled_bubble(pipeline_->modeled_schedule_seconds(), pipeline_->modeled_phase_seconds());
  }
  {
    const MemoryCounter& mem = current_context().memory();
    std::vector<double> most = {static_cast<double>(mem.peak() - mem.live()),
                                static_cast<double>(optimizer().state_bytes())};
    world().all_reduce(most.data(), most.data(), 2, DType::f64, ReduceOp::max);
    res.activation_peak_bytes = static_cast<int64_t>(most[0]);
    res.optimizer_state_bytes = static_cast<int64_t>(most[1]);
  }
}

FitResult Trainer::fit(TrainingModule& module, DataModule& data, const std::string& ckpt_path) {
  const std::string saved = opts_.ckpt_path;
  opts_.ckpt_path = ckpt_path;
  struct Restore {
    TrainerOptions& o;
    std::string path;
    ~Restore() { o.ckpt_path = path; }
  } restore{opts_, saved};
  return fit(module, data);
}

FitResult Trainer::fit(TrainingModule& module, DataModule& data) {
  struct Teardown {
    Trainer* t;
    ~Teardown() { t->teardown(); }
  } teardown{this};
  const auto t_setup = Clock::now();
  step_ = 0;
  preempt_signal_ = 0;
  stop_reason_.clear();
  pending_.clear();
  setup(module, data);
  FitResult res;
  res.num_parameters = num_parameters_;
  if (is_logging_rank() && !opts_.hparams_yaml.empty())
    for (auto& l : opts_.loggers) l->log_hyperparams(opts_.hparams_yaml);
  for (auto& cb : opts_.callbacks) cb->on_fit_start(*this, module);
  module.on_fit_start();
  res.setup_seconds = seconds_since(t_setup);

  sim::SimClock* clock = sim_clock();
  res.initial_val_loss = opts_.val_check_interval > 0 ? validate(module) : std::nullopt;
  const int64_t start_step = step_;  // > 0 after a resume: res counts only this fit's steps
  res.start_step = start_step;
  if (opts_.max_steps == 0 && res.initial_val_loss) log_evaluation_only(*res.initial_val_loss);
  t0_ = Clock::now();
  double train_seconds = 0, sim_train_seconds = 0;
  while (step_ < opts_.max_steps && !should_stop()) {
    const auto ts = Clock::now();
    const double sim_t0 = clock ? clock->now() : 0.0;
    StepOutput out =
        module.automatic_optimization ? train_step(module, data) : manual_train_step(module, data);
    const double step_s = seconds_since(ts);
    train_seconds += step_s;
    interval_seconds_ += step_s;
    interval_tokens_ += step_tokens_;
    if (out.skipped) on_nonfinite_step(out, clock ? clock->now() - sim_t0 : -1.0);
    if (opts_.max_epochs > 0 && data.epochs_completed().value_or(0) >= opts_.max_epochs)
      request_stop(str("max_epochs=", opts_.max_epochs, " reached"));
    if (step_ == start_step + 1) res.first_loss = out.loss;
    res.last_loss = out.loss;
    res.steps = step_ - start_step;
    module.on_train_batch_end(out);
    for (auto& cb : opts_.callbacks) cb->on_train_batch_end(*this, module, out);
    check_preemption();  // only under a PreemptionGuard
    // The modeled step: from its start to the end of the preemption agreement, the period
    // between consecutive steps' ends when no validation or checkpoint comes between them
    // (the agreement's all-reduce over the world is one of every step's collectives).
    const double sim_step = clock ? clock->now() - sim_t0 : 0.0;
    sim_train_seconds += sim_step;

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
    for (auto& cb : opts_.callbacks)
      cb->on_step_end(*this, module, out);  // checkpoints: after the row
  }
  summarize_fit(res, train_seconds, sim_train_seconds);
  for (auto& cb : opts_.callbacks) cb->on_fit_end(*this, module);
  module.on_fit_end();
  if (is_logging_rank())
    for (auto& l : opts_.loggers) l->finalize();
  return res;
}

}  // namespace nxd::trainer
