#pragma once
// nxd-train's configuration: one registry of known keys (type, default, doc) under NxD Training's
// YAML names (trainer.max_steps, data.global_batch_size, model.optim.lr, ...), a Config holding a
// value for every key, YAML/JSON files and `--set dotted.key=value` overrides merged onto the
// defaults, and TrainConfig, the typed and validated view the trainer uses.
//
// Every mistake is a ConfigError naming the key, the value and where it came from: unknown keys
// (with the nearest known key), wrong types, values outside their choices, impossible sizes.
// docs/CONFIG.md is generated from the registry (config_reference_markdown()).
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nxd/layers/models/config.h"
#include "nxd/layers/parallel/lora.h"
#include "nxd/optim/zero_stage.h"
#include "nxd/pipeline/partition.h"
#include "nxd/pipeline/schedule.h"
#include "nxd/trainer/callbacks.h"
#include "nxd/trainer/checkpointing.h"

namespace nxd::train_app {

enum class KeyType { integer, number, boolean, string, number_list, string_list };
const char* key_type_name(KeyType t);

struct KeySpec {
  std::string key;  // dotted: "model.optim.lr"
  KeyType type;
  nlohmann::json default_value;  // null when `nullable` and derived from other keys
  std::string doc;
  std::vector<std::string> choices;  // strings only; empty = any
  bool nullable = false;             // null means "derive" (the doc says from what)
  int64_t list_size = 0;             // number_list: required length (0 = any)
};

// All known keys, in documentation order.
const std::vector<KeySpec>& config_keys();
const KeySpec* find_key(const std::string& key);
// The known key nearest to `key` by edit distance (over the full key and its last component).
std::string nearest_key(const std::string& key);
// The reference table of every key with its type, default and doc (docs/CONFIG.md).
std::string config_reference_markdown();

// A value for every known key (the defaults until overridden).
class Config {
 public:
  Config();  // the defaults

  // Merges a file: .json as JSON, anything else as YAML. Nested mappings name dotted keys
  // (model: {optim: {lr: 1e-3}}); dotted keys at any level are also accepted. Throws IoError if
  // the file cannot be read, ConfigError on parse errors (with the line) and bad keys/values.
  void merge_file(const std::string& path);
  // Merges a parsed tree; `source` names it in messages.
  void merge_json(const nlohmann::json& tree, const std::string& source);
  // "dotted.key=value": the value is parsed as a YAML scalar or flow sequence ("[0.9, 0.95]").
  void apply_override(const std::string& assignment);
  // Sets one key after checking and converting its type.
  void set(const std::string& key, const nlohmann::json& value, const std::string& source);

  const nlohmann::json& get(const std::string& key) const;  // throws InternalError if unknown
  // Whether the key was given (a file, --set or set()), also when to its default value.
  bool is_given(const std::string& key) const { return given_.count(key) > 0; }
  bool is_null(const std::string& key) const { return get(key).is_null(); }
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<double> get_doubles(const std::string& key) const;

  // The nested tree (sections as objects) and its YAML text (reloadable with merge_file).
  nlohmann::json tree() const;
  std::string to_yaml() const;
  const std::map<std::string, nlohmann::json>& values() const { return values_; }
  // The keys of merged files that only mean something on Neuron hardware or XLA (nxdt_tree),
  // in file order, each once: the run lists them as "not applicable in nxd".
  const std::vector<std::string>& not_applicable() const { return not_applicable_; }

 private:
  void merge_node(const nlohmann::json& node, const std::string& prefix, const std::string& src);
  std::map<std::string, nlohmann::json> values_;
  std::set<std::string> given_;  // the keys set after the defaults
  std::vector<std::string> not_applicable_;
};

// NxD Training's example YAML files as they are (config_nxdt.cpp): the file's tree (from
// `source`) with OmegaConf interpolations resolved (${dotted.key} of the file, ${multiply:a, b}),
// NxD Training's names mapped onto nxd's keys (model.encoder_seq_length: data.seq_length unless
// the file sets it; data.tokenizer.type: data.tokenizer; trainer.max_epochs -1: null;
// exp_manager.exp_dir null: the default; exp_manager.resume_from_checkpoint with
// model.weight_init_only: model.init_from), keys accepted only at the value nxd runs anyway
// (ConfigError naming the key and value otherwise), and the keys that only mean something on
// Neuron hardware or XLA (compiler flags, trainer.devices, model.fusions.*, ...) taken out and
// appended to `not_applicable` (so are precision.master_weights / fp32_grad_acc unless
// precision.type is manual: NxD Training derives them from the type, as nxd does). Returns a
// mapping of dotted keys for Config::merge_json.
nlohmann::json nxdt_tree(const nlohmann::json& tree, const std::string& source,
                         std::vector<std::string>& not_applicable);
// The section of docs/CONFIG.md that says the above, with the lists of keys.
std::string nxdt_reference_markdown();

// YAML text -> JSON (quoted scalars stay strings; plain scalars become null/bool/int/float when
// they read as one). Throws ConfigError naming `source` and the line on a syntax error.
nlohmann::json parse_yaml(const std::string& text, const std::string& source);

// ---- the typed, validated configuration ----
struct TrainerSection {
  int64_t max_steps;
  int64_t max_epochs;  // -1 = no limit (trainer.max_epochs null)
  int64_t log_every_n_steps;
  int64_t val_check_interval;  // validate every N steps (and at the last); 0 = never
  int64_t limit_val_batches;   // micro batches per validation
  double gradient_clip_val;    // max global L2 grad norm; 0 = no clipping
  int64_t num_threads;         // BLAS threads (resolved: never 0)
  std::string on_nonfinite;    // stop | skip (TrainerOptions::on_nonfinite)
};

struct PrecisionSection {
  std::string type;  // fp32 | autocast | mixed_precision | bf16SR (resolved: never null)
  std::optional<bool> master_weights, fp32_grad_acc;  // null: by type
};

struct DataSection {
  std::string kind;         // text | tokens | random
  std::string path;         // text: file or folder; tokens: binary file
  std::string token_dtype;  // tokens: uint16 | uint32
  std::string tokenizer;    // text: a tokenizer.json ("" = byte level)
  int64_t seq_length;
  int64_t micro_batch_size;
  int64_t global_batch_size;
  double val_fraction;
  bool shuffle;
  int64_t random_num_samples;  // random: windows in the synthetic dataset
};

struct OptimSection {
  std::string name;  // adamw | sgd
  double lr, weight_decay, beta1, beta2, eps, momentum;
  bool nesterov;
  std::string sched_name;  // constant | linear | cosine
  int64_t warmup_steps, decay_steps;
  double min_lr;
  bool do_layer_norm_weight_decay;  // model.do_layer_norm_weight_decay: norm weights decay too
};

struct DistributedSection {
  int64_t tensor_model_parallel_size;
  int64_t pipeline_model_parallel_size;
  int64_t context_parallel_size;       // CP: ranks that split each sequence (ring attention)
  int64_t expert_model_parallel_size;  // EP: divides data-parallel x context-parallel size
  int64_t virtual_pipeline_model_parallel_size;
  pipeline::ScheduleKind pipeline_schedule = pipeline::ScheduleKind::one_f_one_b;
  pipeline::PartitionBalance pipeline_partition = pipeline::PartitionBalance::parameters;
  optim::ZeroStage zero_stage;         // distributed_strategy.zero_stage, or 1 with zero1: true
  bool optimizer_offload;              // the sharded optimizer state and masters in host memory
  bool reshard_after_forward;          // ZeRO-3: a layer's parameters released between forward and
                                       // backward (gathered twice)
  optim::UnitPrefetch zero3_prefetch;  // ZeRO-3: the next unit's gather under this one's compute
  bool zero1() const { return zero_stage != optim::ZeroStage::none; }  // the state is sharded
  bool sequence_parallel;
  int64_t kv_replicator;  // resolved: max(1, tp / kv heads) unless set
  double grad_bucket_mb;
  std::string backend;              // sim | mpi
  std::string instance;             // sim machine
  std::string timeline;             // sim: Chrome trace path ("" = none)
  int64_t world_size;               // resolved: tp unless set (mpi: replaced by the MPI world)
  bool world_size_from_launcher;    // mpi and backend.world_size unset: world_size, dp not known
  int64_t data_parallel_size;       // derived: world / (tp x pp x cp)
  double collective_timeout_s;      // sim: wall seconds per wait; 0 = NXD_SIM_TIMEOUT or 300
  int64_t fail_rank, fail_at_step;  // sim fault injection (fail_rank -1: none)
  std::string fail_mode;            // crash | hang
};

struct GenerationSection {
  std::string prompt;
  int64_t max_new_tokens;
  double temperature;
  int64_t top_k;
};

struct ExpManagerSection {
  bool create_tensorboard_logger;
  bool create_early_stopping_callback;
  trainer::EarlyStoppingOptions early_stopping;
  bool create_checkpoint_callback;
  trainer::ModelCheckpointOptions checkpoint;  // dirpath = <exp_dir>/checkpoints
  std::string resume_from_checkpoint;          // "" = none
  bool resume_if_exists;
};

// model.init_from (train_app/init_from.h): the source of the run's initial weights.
struct InitFromSection {
  std::string path;                  // "" = none
  std::optional<ModelConfig> model;  // the model the source records
  std::string description;           // "the transformers folder X (llama)"
};

// Fine-tuning from jsonl (train_app/alignment_config.cpp; NxD Training's data.train_dir, val_dir,
// dev_choose_samples, packing, data.alignment_strategy.dpo.* or model_alignment_strategy.dpo.*, and
// model_alignment_strategy.orpo.*).
struct AlignmentSection {
  enum class Kind { none, sft, dpo, orpo } kind = Kind::none;
  std::string train_dir, val_dir;   // val_dir "": data.val_fraction of train_dir
  int64_t dev_choose_samples = -1;  // -1: every row
  bool packing = false;             // SFT
  double kl_beta = 0.01;            // DPO
  std::string loss_type = "sigmoid";
  double orpo_beta = 0.01;        // ORPO
  int64_t max_prompt_length = 0;  // DPO and ORPO
  bool precompute_ref_log_probs = true;
  std::string truncation_mode = "keep_start";
};
// The keys of AlignmentSection (appended to config_keys()).
std::vector<KeySpec> alignment_keys();
struct TrainConfig;
// The section from c, checked against t's data and parallel layout (resolve() calls it).
AlignmentSection resolve_alignment(const Config& c, const TrainConfig& t);

struct TrainConfig {
  uint64_t seed;
  std::string out_dir;  // exp_manager.exp_dir
  ExpManagerSection exp;
  TrainerSection trainer;
  DataSection data;
  ModelConfig model;  // the model.* keys; the rest at ModelConfig's defaults (see model_config)
  OptimSection optim;
  DistributedSection dist;
  PrecisionSection precision;
  GenerationSection generation;
  // model_alignment_strategy.peft (NxD Training's keys): LoRA when lora_rank is set
  std::optional<LoraConfig> lora;
  AlignmentSection alignment;
  InitFromSection init;
  int64_t grad_accum_steps;  // global / (micro * dp)
  Config resolved;           // every key, derived values filled in (written as config.yaml)
};

// Checks cross-key constraints and fills derived values; throws ConfigError naming the keys.
// With backend.kind=mpi and no backend.world_size the world is not known yet (world_size_from_
// launcher): the checks that need the data-parallel size are left out (the batching ones pass at
// DP 1 whenever they pass at any DP), and nxd-train resolves again with the MPI world, which sets
// backend.world_size, before anything runs.
TrainConfig resolve(const Config& cfg);

// The model the config describes: cfg.model (every model.* value) plus the parallel layout's
// sequence_parallel and kv_replicator (kv_size_multiplier) and what model.init_from's source
// records beyond the keys (head_dim, biases, activation, ...). Used to build the model and, by
// resolve(), to check that it splits over tensor_model_parallel_size.
ModelConfig model_config(const TrainConfig& cfg);

// ConfigError unless world_size = tp x dp for an integer dp (pipeline size 1): names the three
// numbers.
void check_world(int64_t world_size, int64_t tp, int64_t pp = 1, int64_t cp = 1);

}  // namespace nxd::train_app
