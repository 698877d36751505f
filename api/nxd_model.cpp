#include "nxd/api/nxd_model.h"

#include "nxd/api/lora.h"
#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/activation_checkpoint.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/layers/parallel/pad.h"
#include "nxd/runtime/error.h"

namespace nxd::api {

namespace {

// Gives a module built on the meta device its memory, and bf16 parameters their dtype.
void finish_module(const NxDConfig& cfg, Module& m, DType param_dtype) {
  const ModelInitConfig& mi = cfg.model_init_config;
  if (mi.meta_device_init) m.materialize(mi.seed, mi.param_init_fn);
  if (param_dtype == DType::bf16) m.to_dtype(DType::bf16);
}

// activation_checkpoint_classes: selects every instance of each class in the modules this rank
// holds; ConfigError naming a class none of them has.
void select_checkpointed_classes(const NxDConfig& cfg, const std::vector<Module*>& modules) {
  for (const ModuleClass& cls : cfg.activation_checkpoint_classes) {
    int n = 0;
    for (Module* m : modules)
      for (auto& [name, inst] : instances_of(*m, cls)) {
        inst->set_recompute_activations(true);
        ++n;
      }
    if (n > 0) continue;
    try {
      require_instances(*modules.front(), cls, "NxDModel");
    } catch (const InvalidArgument& e) {
      throw ConfigError(str(e.what(), ": activation_checkpoint_classes names it"));
    }
  }
}

}  // namespace

ModelConfig model_config_for(const NxDConfig& cfg, ModelConfig mc) {
  mc.dtype = resolve_precision(cfg).param_dtype;
  mc.device = cfg.model_init_config.meta_device_init ? Device::meta : Device::host;
  mc.sequence_parallel = cfg.sequence_parallel;
  mc.activations_checkpoint_granularity = parse_checkpoint_granularity(
      cfg.activation_checkpoint_config.empty() ? "null" : cfg.activation_checkpoint_config);
  return mc;
}

pipeline::PipelineOptions pipeline_options_for(const NxDConfig& cfg) {
  pipeline::PipelineOptions po;
  const PipelineConfig& pc = cfg.pipeline_config;
  po.num_microbatches = pc.num_microbatches;
  po.schedule = pc.schedule;
  po.virtual_pipeline_size = pc.virtual_pipeline_size;
  po.pipeline_cuts = pc.pipeline_cuts;
  po.balance = pc.partition;
  po.dp_bucket_bytes = static_cast<int64_t>(cfg.grad_bucket_mb * (1 << 20));
  po.dp_grad_sync = false;  // the optimizer wrapper's gradient buckets reduce over DP
  return po;
}

NxDModel::NxDModel(const NxDConfig& cfg, std::shared_ptr<Module> module)
    : cfg_(cfg), module_(std::move(module)) {
  NXD_CHECK_T(ConfigError, module_ != nullptr, "[NxDModel] no module");
  select_checkpointed_classes(cfg_, {module_.get()});
}

NxDModel::NxDModel(const NxDConfig& cfg, std::shared_ptr<pipeline::PipelineModel> pipeline)
    : cfg_(cfg), pipeline_(std::move(pipeline)) {
  NXD_CHECK_T(ConfigError, pipeline_ != nullptr, "[NxDModel] no pipeline");
  select_checkpointed_classes(cfg_, local_modules());
}

NxDModel::NxDModel(const NxDConfig& cfg, std::shared_ptr<pipeline::GenericPipelineModel> pipeline)
    : cfg_(cfg), generic_(std::move(pipeline)) {
  NXD_CHECK_T(ConfigError, generic_ != nullptr, "[NxDModel] no pipeline");
}

Module& NxDModel::local_module() const {
  if (module_) return *module_;
  if (generic_) return *generic_->local_pieces().front()->module;
  return *pipeline_->chunks().front();
}

std::vector<Module*> NxDModel::local_modules() const {
  if (module_) return {module_.get()};
  std::vector<Module*> out;
  if (generic_) {
    for (const pipeline::Piece* p : generic_->local_pieces()) out.push_back(p->module.get());
    return out;
  }
  for (const auto& c : pipeline_->chunks()) out.push_back(c.get());
  return out;
}

std::vector<optim::NamedParam> NxDModel::local_named_parameters() const {
  if (pipeline_) return pipeline_->local_named_parameters();
  if (generic_) return generic_->local_named_parameters();
  std::vector<optim::NamedParam> out;
  for (auto& [n, t] : module_->named_parameters()) out.push_back({n, t});
  return out;
}

std::vector<optim::NormParam> NxDModel::norm_params() const {
  if (generic_) return generic_->norm_params();
  return pipeline_ ? pipeline_->norm_params() : optim::norm_params(*module_);
}

optim::NormGroups NxDModel::norm_groups() const {
  if (pipeline_) return pipeline_->norm_groups();
  if (generic_) return generic_->norm_groups();
  return parallel_state::model_parallel_is_initialized() ? optim::NormGroups::from_parallel_state()
                                                         : optim::NormGroups{};
}

bool NxDModel::needs_sequence_parallel_sums() const {
  if (pipeline_ || generic_) return false;  // run_train sums them
  for (const auto& p : parallel_parameters(*module_))
    if (p.attrs.sequence_parallel_enabled) return true;
  return false;
}

int NxDModel::num_microbatches() const {
  if (generic_) return generic_->num_microbatches();
  return pipeline_ ? pipeline_->num_microbatches() : 1;
}

void NxDModel::train(bool on) {
  if (pipeline_)
    pipeline_->train(on);
  else if (generic_)
    generic_->train(on);
  else
    module_->train(on);
}

DType NxDModel::dtype() const {
  for (const auto& p : local_named_parameters())
    if (is_floating(p.param.dtype())) return p.param.dtype();
  return DType::f32;
}

const ModelConfig& NxDModel::model_config() const {
  const auto* lm = dynamic_cast<const CausalLM*>(&local_module());
  NXD_CHECK_T(ConfigError, lm != nullptr, "[NxDModel] model_config: the model is ",
              local_module().type_name(),
              ", not a decoder model built from a ModelConfig (a module of your own keeps its "
              "config itself)");
  return lm->config();
}

Tensor NxDModel::run_train(const std::function<Tensor(Module&)>& loss_fn) {
  NXD_CHECK_T(ConfigError, !pipeline_ && !generic_,
              "[NxDModel] run_train(loss_fn) with pipeline parallelism: the pipeline computes the "
              "loss, call run_train(",
              generic_ ? "batch" : "ids, targets", ")");
  Tensor loss = loss_fn(*module_);
  NXD_CHECK_T(ConfigError, loss.defined() && loss.numel() == 1,
              "[NxDModel] run_train's loss_fn must return a scalar, got ",
              loss.defined() ? loss.desc() : std::string("no tensor"));
  backward(loss);
  if (!checked_checkpointing_) {  // once: a selected class whose forward recomputes nothing
    try {
      check_activation_checkpoint_ran({module_.get()}, cfg_.activation_checkpoint_classes);
    } catch (const InvalidArgument& e) {
      throw ConfigError(e.what());
    }
    checked_checkpointing_ = true;
  }
  return loss;
}

namespace {
const char* kGenericCalls =
    "[NxDModel] a pipeline of pieces (GenericPipelineModel) runs "
    "run_train(batch) / run_eval(batch)";
CausalLM& as_lm(Module& m) {
  auto* lm = dynamic_cast<CausalLM*>(&m);
  NXD_CHECK_T(ConfigError, lm != nullptr, "[NxDModel] run_train(ids, targets) needs a decoder ",
              "model (CausalLM), got ", m.type_name());
  return *lm;
}
}  // namespace

pipeline::PipelineResult NxDModel::run_train(const pipeline::Batch& batch) {
  NXD_CHECK_T(ConfigError, generic_ != nullptr,
              "[NxDModel] run_train(batch) needs a model built as a pipeline of pieces "
              "(initialize_parallel_model with GenericPipelineOptions)");
  return generic_->run_train(batch);
}

pipeline::PipelineResult NxDModel::run_eval(const pipeline::Batch& batch) {
  NXD_CHECK_T(ConfigError, generic_ != nullptr,
              "[NxDModel] run_eval(batch) needs a model built as a pipeline of pieces "
              "(initialize_parallel_model with GenericPipelineOptions)");
  return generic_->run_eval(batch);
}

Tensor NxDModel::run_train(const Tensor& ids, const Tensor& targets) {
  NXD_CHECK_T(ConfigError, !generic_, kGenericCalls);
  if (pipeline_) return pipeline_->run_train(ids, targets);
  return run_train([&](Module& m) { return as_lm(m).loss(ids, targets); });
}

Tensor NxDModel::forward(const Tensor& ids) {
  NXD_CHECK_T(ConfigError, !generic_, kGenericCalls);
  NXD_CHECK_T(ConfigError, !pipeline_,
              "[NxDModel] forward() with pipeline parallelism: a pipelined model runs "
              "run_train / run_eval");
  return as_lm(*module_).forward(ids);
}

Tensor NxDModel::run_eval(const Tensor& ids, const Tensor& targets) {
  NXD_CHECK_T(ConfigError, !generic_, kGenericCalls);
  if (pipeline_) {
    NoGradGuard ng;
    pipeline_->eval();
    Tensor l = pipeline_->run_eval(ids, targets);
    pipeline_->train();
    return l;
  }
  NoGradGuard ng;
  const bool was = module_->is_training();
  module_->eval();
  Tensor l = as_lm(*module_).loss(ids, targets);
  module_->train(was);
  return l;
}

std::shared_ptr<NxDModel> initialize_parallel_model(const NxDConfig& cfg, const ModelFn& model_fn) {
  NXD_CHECK_T(ConfigError, cfg.pipeline_parallel_size == 1,
              "[initialize_parallel_model] pipeline_parallel_size ", cfg.pipeline_parallel_size,
              " needs a model a pipeline can cut: a decoder model given by its ModelConfig, or a "
              "model of pieces (pipeline::PipelineSequential) with GenericPipelineOptions");
  NXD_CHECK_T(ConfigError, cfg.activation_checkpoint_config.empty(),
              "[initialize_parallel_model] activation_checkpoint_config '",
              cfg.activation_checkpoint_config,
              "' applies to decoder models; a module of your own names the classes to recompute "
              "in activation_checkpoint_classes (layers/activation_checkpoint.h)");
  NXD_CHECK_T(ConfigError, model_fn != nullptr, "[initialize_parallel_model] no model_fn");
  NXD_CHECK_T(ConfigError, !cfg.pad_model,
              "[initialize_parallel_model] pad_model pads decoder models given by their "
              "ModelConfig; a module of your own pads its state with nxd::pad_model "
              "(layers/parallel/pad.h) and builds its attention with pad_attention_options");
  const DType dt = resolve_precision(cfg).param_dtype;
  ParamOptions po{dt, cfg.model_init_config.meta_device_init ? Device::meta : Device::host};
  std::shared_ptr<Module> m = model_fn(po);
  NXD_CHECK_T(ConfigError, m != nullptr, "[initialize_parallel_model] model_fn returned no model");
  if (cfg.lora_config) apply_lora_to_parts(*cfg.lora_config, {m.get()}, cfg.model_init_config.seed);
  finish_module(cfg, *m, dt);
  return std::make_shared<NxDModel>(cfg, std::move(m));
}

std::shared_ptr<NxDModel> initialize_parallel_model(const NxDConfig& cfg,
                                                    const SequentialFn& model_fn,
                                                    pipeline::GenericPipelineOptions opts) {
  NXD_CHECK_T(ConfigError, model_fn != nullptr, "[initialize_parallel_model] no model_fn");
  NXD_CHECK_T(ConfigError, cfg.activation_checkpoint_config.empty() && !cfg.pad_model,
              "[initialize_parallel_model] activation_checkpoint_config '",
              cfg.activation_checkpoint_config, "' and pad_model ", cfg.pad_model,
              " apply to decoder models; a model of pieces recomputes (autograd::recompute) and "
              "pads in its own pieces");
  NXD_CHECK_T(ConfigError, !cfg.lora_config,
              "[initialize_parallel_model] lora_config on a pipeline of pieces: apply LoRA to "
              "decoder models (the ModelConfig overload) or to the pieces in model_fn");
  const PipelineConfig& pc = cfg.pipeline_config;
  opts.num_microbatches = pc.num_microbatches;
  opts.schedule = pc.schedule;
  opts.virtual_pipeline_size = pc.virtual_pipeline_size;
  if (opts.pipeline_cuts.empty()) opts.pipeline_cuts = pc.pipeline_cuts;
  opts.dp_bucket_bytes = static_cast<int64_t>(cfg.grad_bucket_mb * (1 << 20));
  opts.dp_grad_sync = false;  // the optimizer wrapper's gradient buckets reduce over DP
  const DType dt = resolve_precision(cfg).param_dtype;
  const ModelInitConfig& mi = cfg.model_init_config;
  std::shared_ptr<pipeline::PipelineSequential> m =
      model_fn(ParamOptions{dt, mi.meta_device_init ? Device::meta : Device::host});
  NXD_CHECK_T(ConfigError, m != nullptr, "[initialize_parallel_model] model_fn returned no model");
  auto pm = std::make_shared<pipeline::GenericPipelineModel>(std::move(m), std::move(opts));
  // the other stages' pieces are gone with `m`; this rank's are materialized under their
  // whole-model names
  for (const pipeline::Piece* p : pm->local_pieces()) {
    if (mi.meta_device_init) p->module->materialize(mi.seed, mi.param_init_fn, p->name + ".");
    if (dt == DType::bf16) p->module->to_dtype(DType::bf16);
  }
  // a tied parameter materialized under another piece's name takes its first stage's values
  if (mi.meta_device_init) pm->sync_tied_parameters();
  return std::make_shared<NxDModel>(cfg, std::move(pm));
}

std::shared_ptr<NxDModel> initialize_parallel_model(const NxDConfig& cfg, const ModelConfig& mc,
                                                    uint64_t seed, const PartBuilder& build) {
  NXD_CHECK_T(ConfigError, !(cfg.lora_config && cfg.pad_model),
              "[initialize_parallel_model] lora_config with pad_model: the padded heads' adapters "
              "would train (pad the model without LoRA)");
  ModelConfig c = model_config_for(cfg, mc);
  c.moe.validate_parallel(cfg.expert_parallel_size);
  HeadPadding plan;  // pad_model: heads padded to a multiple of the TP size, padded ones zero
  if (cfg.pad_model) c = pad_model_config(c, cfg.tensor_parallel_size, &plan);
  ModelInitConfig init = cfg.model_init_config;
  init.seed = seed;  // the parts' registered rules are seeded like a host build
  NxDConfig fc = cfg;
  fc.model_init_config = init;
  if (cfg.pipeline_parallel_size > 1) {
    pipeline::PipelineOptions po = pipeline_options_for(cfg);
    po.pieces.build = build;
    auto pm = std::make_shared<pipeline::PipelineModel>(c, seed, po);
    if (cfg.lora_config) {
      std::vector<Module*> parts;
      for (const auto& chunk : pm->chunks()) parts.push_back(chunk.get());
      apply_lora_to_parts(*cfg.lora_config, parts, seed);
    }
    for (const auto& chunk : pm->chunks()) {
      finish_module(fc, *chunk, c.dtype);
      zero_padded_heads(*chunk, plan);
    }
    return std::make_shared<NxDModel>(cfg, std::move(pm));
  }
  std::shared_ptr<Module> m = pipeline::build_part(build, c, seed, ModelPart{});
  if (cfg.lora_config) apply_lora_to_parts(*cfg.lora_config, {m.get()}, seed);
  finish_module(fc, *m, c.dtype);
  zero_padded_heads(*m, plan);
  return std::make_shared<NxDModel>(cfg, std::move(m));
}

}  // namespace nxd::api
