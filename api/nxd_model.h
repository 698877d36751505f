#pragma once
// NxD's initialize_parallel_model and NxDModel in C++: the model a rank trains, built the way the
// config says (meta-device initialization, bf16 parameters, activation checkpointing, pipeline
// stages), behind one interface whether or not it is pipelined.
//
//   auto cfg = neuronx_distributed_config(
//       {.tensor_parallel_size = 2, .precision = "mixed_precision"});
//   auto model = initialize_parallel_model(cfg, [](const ParamOptions& po) {
//     // MyNet: built from NxD's parallel layers, in po's dtype and device
//     return std::make_shared<MyNet>(po);
//   });
//   auto opt = initialize_parallel_optimizer(cfg, *model, groups, optim::AdamWOptions{});
//   Tensor loss = model->run_train([&](Module& m) { return as<MyNet>(m).loss(batch); });
//   opt->step(); opt->zero_grad();
//
// Decoder language models (ModelConfig: the built-in Llama and GPT-NeoX, or a user's CausalLM
// subclass through a PartBuilder) are pipelined when pipeline_parallel_size > 1: the model is
// then a pipeline::PipelineModel whose stages this rank holds, and run_train(ids, targets) runs
// the schedule (NxD's NxDPPModel.run_train). Any other model is pipelined as a
// pipeline::PipelineSequential (its ordered pieces) with a loss of the user's: the
// initialize_parallel_model overload taking GenericPipelineOptions builds a
// pipeline::GenericPipelineModel and run_train(batch) / run_eval(batch) run it
// (docs/design/pipeline_any.md).
//
// Construction, in NxD's order: the module is built on the meta device when
// model_init_config.meta_device_init (shapes only: a 7B-parameter shape builds in seconds and
// allocates nothing), in bf16 when the precision says so; then materialized one tensor at a time
// (each rank allocates only its own shards) through param_init_fn, or each parameter's registered
// rule from model_init_config.seed, which gives exactly the values of a host build; parameters
// built in f32 are converted to bf16 for mixed_precision / bf16SR.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nxd/api/nxd_config.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/pipeline/generic_pipeline.h"
#include "nxd/pipeline/pipeline_model.h"

namespace nxd::api {

// Builds a module in the given parameter dtype and device (meta with meta_device_init).
using ModelFn = std::function<std::shared_ptr<Module>(const ParamOptions&)>;
// Builds the part of a decoder model a pipeline stage holds (ModelPart: its layers, the embedding,
// the head), in cfg's dtype and device; empty: make_causal_lm (pipeline/pieces.h).
using PartBuilder = pipeline::PartBuilder;
// Builds the whole model as ordered pieces (pipeline/sequential.h), in the given dtype and device.
using SequentialFn =
    std::function<std::shared_ptr<pipeline::PipelineSequential>(const ParamOptions&)>;

class NxDModel {
 public:
  // Wraps what a rank built (the Trainer wraps its module's model this way), selecting every
  // instance of cfg.activation_checkpoint_classes for recomputation (ConfigError naming a class
  // that is not in the modules this rank holds).
  NxDModel(const NxDConfig& cfg, std::shared_ptr<Module> module);
  NxDModel(const NxDConfig& cfg, std::shared_ptr<pipeline::PipelineModel> pipeline);
  NxDModel(const NxDConfig& cfg, std::shared_ptr<pipeline::GenericPipelineModel> pipeline);

  // One training iteration. Without a pipeline: loss = loss_fn(local_module()), backward(loss),
  // returns loss. The first one checks that each activation_checkpoint_classes class ran its
  // forward through checkpointed_forward (ConfigError naming it otherwise). With a pipeline use the
  // (ids, targets) form.
  Tensor run_train(const std::function<Tensor(Module&)>& loss_fn);
  // A decoder model's iteration: the mean cross entropy of the batch (the pipeline's mean over
  // its microbatches, averaged over DP; without a pipeline this rank's batch), with gradients.
  Tensor run_train(const Tensor& ids, const Tensor& targets);
  // The same loss without gradients, in eval mode.
  Tensor run_eval(const Tensor& ids, const Tensor& targets);
  // A generic pipeline's iteration (NxD's run_train(**batch) / run_eval(**batch)): the loss, the
  // microbatch losses with return_mb_loss, and (run_eval, on the last stage) the model's outputs.
  // ConfigError for a model built otherwise.
  pipeline::PipelineResult run_train(const pipeline::Batch& batch);
  pipeline::PipelineResult run_eval(const pipeline::Batch& batch);
  // A decoder model's forward: ids [B,S] -> logits [B,S,V] (with gradients when grad mode is on).
  // ConfigError with a pipeline (a pipelined model has run_train and run_eval only, as NxD's).
  Tensor forward(const Tensor& ids);

  bool is_pipeline() const { return pipeline_ != nullptr || generic_ != nullptr; }
  pipeline::PipelineModel* pipeline() const { return pipeline_.get(); }
  pipeline::GenericPipelineModel* generic_pipeline() const { return generic_.get(); }
  // The unwrapped module (without a pipeline; with one: its first local chunk or piece).
  Module& local_module() const;
  // Every module this rank holds: the module, or the pipeline stage's chunks (pieces).
  std::vector<Module*> local_modules() const;
  // This rank's parameters with their whole-model names, in registration order.
  std::vector<optim::NamedParam> local_named_parameters() const;
  // For the gradient norm (a tied copy on the last stage is `shared`), and its groups.
  std::vector<optim::NormParam> norm_params() const;
  optim::NormGroups norm_groups() const;
  // Whether gradients of sequence-parallel parameters need their sum over TP (the optimizer does
  // it; a pipeline does it itself in run_train).
  bool needs_sequence_parallel_sums() const;
  int num_microbatches() const;
  void train(bool on = true);
  DType dtype() const;  // of the floating parameters
  // NxD's model.config shortcut: the decoder model's ModelConfig (of the module, or of the
  // pipeline stage's chunks). ConfigError for a module of the user's own (it keeps its own).
  const ModelConfig& model_config() const;
  // model.name_or_path: where the architecture was read from (model_config().name_or_path: a
  // transformers folder or config.json; empty for a config built in code).
  const std::string& name_or_path() const { return model_config().name_or_path; }
  const NxDConfig& config() const { return cfg_; }

 private:
  NxDConfig cfg_;
  bool checked_checkpointing_ = false;  // run_train checked activation_checkpoint_classes
  std::shared_ptr<Module> module_;
  std::shared_ptr<pipeline::PipelineModel> pipeline_;
  std::shared_ptr<pipeline::GenericPipelineModel> generic_;
};

// NxD's initialize_parallel_model for any module: model_fn builds it (in the config's dtype and,
// with meta_device_init, on the meta device), then it is materialized / converted as above.
// ConfigError with pipeline_parallel_size > 1 (a pipeline needs a decoder model or a model of
// pieces: the overloads below) or an activation_checkpoint_config ("full" and "selective" are the
// decoder models'; a module of your own names classes in activation_checkpoint_classes).
std::shared_ptr<NxDModel> initialize_parallel_model(const NxDConfig& cfg, const ModelFn& model_fn);
// NxD's NxDPPModel for any model: model_fn builds the whole model as pieces (on the meta device
// with meta_device_init: only this rank's pieces are then materialized, and tied parameters copied
// from their first stage), cut into stages by `opts` (transformer_layer_cls or pipeline_cuts, the
// LossSpec, return_mb_loss, input_names); the schedule, microbatches, chunks and (when opts has
// none) pipeline_cuts come from cfg.pipeline_config, and the optimizer reduces the gradients over
// DP. Any pipeline_parallel_size, 1 included. ConfigError as the overload above, and for a
// lora_config (not supported on a generic pipeline).
std::shared_ptr<NxDModel> initialize_parallel_model(const NxDConfig& cfg,
                                                    const SequentialFn& model_fn,
                                                    pipeline::GenericPipelineOptions opts);
// A decoder model of `mc` (mc.dtype, device, sequence_parallel and checkpoint granularity are set
// from cfg), initialized from `seed`; a PipelineModel over the config's pipeline_config when
// pipeline_parallel_size > 1.
std::shared_ptr<NxDModel> initialize_parallel_model(const NxDConfig& cfg, const ModelConfig& mc,
                                                    uint64_t seed, const PartBuilder& build = {});

// The ModelConfig a decoder model gets under `cfg` (dtype, device, sequence parallelism,
// activation checkpointing): what initialize_parallel_model builds.
ModelConfig model_config_for(const NxDConfig& cfg, ModelConfig mc);
// The pipeline options of `cfg` (schedule, microbatches, chunks, cuts, DP bucket size; the DP
// gradient reduction is the optimizer's).
pipeline::PipelineOptions pipeline_options_for(const NxDConfig& cfg);

}  // namespace nxd::api
