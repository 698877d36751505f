#pragma once
// NxD's neuronx_distributed_config in C++: the parallel layout and every training optimization as
// one struct, with NxD's key names and defaults (read from JSON or YAML parsed to JSON), checked
// and applied to the current rank by neuronx_distributed_config() (parallel_state, matmul
// precision). initialize_parallel_model (nxd_model.h) and initialize_parallel_optimizer
// (nxd_optimizer.h) read it.
//
// Where nxd departs from NxD (docs/design/api.md, "NxD's training API"):
//   - `precision` (NxD Training's precision.type) is part of the config: fp32 | autocast |
//     mixed_precision | bf16SR. It picks the parameter dtype (bf16 for the last two), the matmul
//     precision, and the defaults of mixed_precision_config. NxD leaves the dtype to the user
//     (model.to(bf16) or XLA_USE_BF16) and its master weights and f32 gradient accumulation to
//     ZeRO-1 only; nxd supports both with or without ZeRO-1.
//   - model_init_config.param_init_fn takes (name, tensor) per parameter instead of a module; it
//     may be null with meta_device_init: each parameter is then filled by the rule its layer
//     registered, from model_init_config.seed (the values a host build has).
//   - activation_checkpoint_config applies to decoder models (ModelConfig): "full" or
//     "selective" (NxD Training's granularities). NxD's "a module class" form is
//     activation_checkpoint_classes (C++ only: a type or a predicate, layers/module_class.h).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nxd/layers/module.h"
#include "nxd/layers/module_class.h"
#include "nxd/layers/parallel/lora.h"
#include "nxd/optim/zero_stage.h"
#include "nxd/pipeline/partition.h"
#include "nxd/pipeline/schedule.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/dtype.h"

namespace nxd::api {

struct OptimizerConfig {
  bool zero_one_enabled = false;  // ZeRO-1 (NxD's key): zero_stage one
  // What is sharded over DP (optim/zero_stage.h, docs/design/fsdp.md); none with
  // zero_one_enabled means one, any other stage with it is a ConfigError naming both.
  optim::ZeroStage zero_stage = optim::ZeroStage::none;
  // The sharded optimizer's state and masters in host memory (needs a stage >= 1).
  bool optimizer_offload = false;
  // ZeRO-3: a unit's parameters released after its forward, gathered again for its backward.
  bool reshard_after_forward = true;
  // ZeRO-3: the next unit's all-gather started under this one's compute (JSON: true | false).
  optim::UnitPrefetch zero3_prefetch = optim::UnitPrefetch::next_unit;
  // ZeRO-3 under a pipeline: the last stage's final norm and head sharded too (JSON
  // zero3_shard_pipeline_head: true | false; optim/zero_stage.h says why whole is the default).
  optim::PipelineHeadUnit zero3_pipeline_head = optim::PipelineHeadUnit::whole;
  optim::ZeroStage stage() const { return zero_one_enabled ? optim::ZeroStage::one : zero_stage; }
  bool grad_clipping = true;
  double max_grad_norm = 1.0;
};

// NxD's pipeline_config (the keys nxd implements).
struct PipelineConfig {
  int num_microbatches = 1;
  pipeline::ScheduleKind schedule =
      pipeline::ScheduleKind::one_f_one_b;  // JSON: gpipe | 1f1b | interleaved
  int virtual_pipeline_size = 1;            // model chunks per pipeline rank (interleaved)
  // "model.layers.3": a stage starts after this layer; empty: auto_partition, balanced by
  // `partition`: parameters (per stage) or modeled_cost (the sim device's forward + backward time)
  std::vector<std::string> pipeline_cuts;
  pipeline::PartitionBalance partition =
      pipeline::PartitionBalance::parameters;  // JSON: parameters | modeled_cost
};

struct ModelInitConfig {
  bool meta_device_init = false;       // build on the meta device, then materialize shard by shard
  Module::TensorInitFn param_init_fn;  // null: each parameter's registered rule, from `seed`
  uint64_t seed = 0;
};

// NxD's mixed_precision_config; unset fields follow `precision` (resolve_precision()).
struct MixedPrecisionConfig {
  std::optional<bool> use_master_weights;
  std::optional<bool> use_fp32_grad_acc;
};

struct NxDConfig {
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  int context_parallel_size =
      1;  // ranks splitting each sequence (layers/parallel/context_parallel.h)
  // Expert parallelism (NxD's expert_parallel_size): the experts of mixture-of-experts layers are
  // split over this many data-parallel (data x context) ranks (it divides DP x CP;
  // collectives/parallel_state.h, layers/moe/moe.h).
  int expert_parallel_size = 1;
  PipelineConfig pipeline_config;
  OptimizerConfig optimizer_config;
  // "" (none), "full" or "selective": the decoder models' activations_checkpoint_granularity
  std::string activation_checkpoint_config;
  // NxD's activation_checkpoint_config=<module class(es)>, for any model: every instance of each
  // class recomputes its activations in backward (layers/activation_checkpoint.h), e.g.
  // {ModuleClass::of<MyBlock>()}. Not a JSON key (a class is code).
  std::vector<ModuleClass> activation_checkpoint_classes;
  // Decoder models (the ModelConfig overload of initialize_parallel_model): attention heads that
  // do not split over tensor_parallel_size are padded with zero heads that stay zero
  // (layers/parallel/pad.h), so the model computes and trains as the unpadded one.
  bool pad_model = false;
  bool sequence_parallel = false;
  ModelInitConfig model_init_config;
  MixedPrecisionConfig mixed_precision_config;
  std::string precision = "fp32";  // fp32 | autocast | mixed_precision | bf16SR
  double grad_bucket_mb = 25.0;    // the DP gradient buckets (DDP's bucket_cap_mb)
  // NxD's lora_config (api/lora.h): LoRA adapters on the selected linear layers, everything else
  // frozen; applied by initialize_parallel_model and the Trainer after the model is built, its
  // adapters initialized from model_init_config.seed. Empty: full fine-tuning.
  std::optional<LoraConfig> lora_config;

  // NxD's keys from JSON (or YAML parsed to JSON): tensor_parallel_size, pipeline_parallel_size,
  // context_parallel_size, expert_parallel_size,
  // pipeline_config {num_microbatches, schedule, virtual_pipeline_size, pipeline_cuts,
  // partition},
  // optimizer_config {zero_one_enabled, zero_stage, grad_clipping, max_grad_norm},
  // activation_checkpoint_config, pad_model, sequence_parallel, model_init_config
  // {meta_device_init, seed}, mixed_precision_config {use_master_weights, use_fp32_grad_acc},
  // precision, grad_bucket_mb, lora_config {enable_lora, lora_rank, lora_alpha, lora_dropout,
  // target_modules, ...: api/lora.h}. Unknown keys and wrong types are a ConfigError naming them.
  static NxDConfig from_json(const nlohmann::json& j);
};

// What `precision` and mixed_precision_config make of a run.
struct ResolvedPrecision {
  DType param_dtype = DType::f32;                              // bf16: mixed_precision, bf16SR
  blas::MatmulPrecision matmul = blas::MatmulPrecision::fp32;  // bf16 products of f32 tensors
  bool master_weights = false;       // f32 copies of bf16 parameters in the optimizer
  bool fp32_grad_acc = false;        // bf16 parameters' gradients accumulated in f32
  bool stochastic_rounding = false;  // bf16 parameter updates rounded stochastically
};
// fp32: f32 everything. autocast: f32 parameters, bf16 matmul inputs. mixed_precision: bf16
// parameters and activations, f32 master weights and gradient accumulation (each overridable by
// mixed_precision_config). bf16SR: bf16 everything, updates rounded stochastically, no masters.
// ConfigError naming the values for an unknown precision, or master weights / f32 accumulation
// asked for f32 parameters.
ResolvedPrecision resolve_precision(const NxDConfig& cfg);

// Checks `cfg` (ConfigError naming the values: sizes, a world not divisible by tp x pp, a bad
// pipeline config, checkpoint kind or precision, max_grad_norm <= 0 with clipping) and applies it
// to the current rank: initializes parallel_state unless it is already initialized with these
// sizes, and sets the matmul precision (process-wide: every rank of a sim world sets the same).
// Collective.
NxDConfig neuronx_distributed_config(NxDConfig cfg = {});

}  // namespace nxd::api
