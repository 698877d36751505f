#pragma once
// LoRA through NxD's API: NxD's lora_config (and NxD Training's model_alignment_strategy.peft)
// keys read into a LoraConfig (layers/parallel/lora.h), and the adapters applied to the parts of
// the model a rank holds. initialize_parallel_model and the Trainer apply NxDConfig::lora_config
// this way, after the model is built (and its weights loaded) and before the optimizer exists.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nxd/layers/parallel/lora.h"

namespace nxd::api {

// Keys (NxD's LoraConfig names): enable_lora, lora_rank, lora_alpha, lora_dropout,
// target_modules (a list: suffixes; a string: a regular expression, PEFT's forms),
// init_lora_weights (default | gaussian), use_rslora, merge_lora; bias must be "none"; NxD's
// lora_verbose, save_lora_base, load_lora_from_ckpt, lora_save_dir, lora_load_tag,
// merge_sharded_lora and save_lora_config_adapter are read and have no effect here (nxd saves
// adapters with nxd-ckpt export-lora). `where` prefixes key names in the ConfigErrors
// ("lora_config."). Returns false when enable_lora is present and false.
bool read_lora_config(const nlohmann::json& j, const std::string& where, LoraConfig& out);

// What applying LoRA did on this rank, summed over its parts.
struct LoraSummary {
  int64_t adapted = 0;               // layers with an adapter
  int64_t trainable = 0, total = 0;  // parameter elements on this rank
};
// apply_lora on every part (a whole model, or a pipeline stage's chunks with the whole model's
// names), adapters initialized from `seed`; then every target_modules entry must have matched in
// the whole model (summed over the pipeline group when parallel_state has one: collective there).
LoraSummary apply_lora_to_parts(const LoraConfig& cfg, const std::vector<Module*>& parts,
                                uint64_t seed);

}  // namespace nxd::api
