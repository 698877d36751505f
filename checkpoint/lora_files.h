#pragma once
// LoRA adapters outside a training job: the "lora" record of a checkpoint's metadata.json, PEFT's
// adapter folder (adapter_config.json + adapter_model.safetensors, tensor names
// "base_model.model.<nxd name>", e.g.
// base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight, which are transformers' module
// names for nxd's Llama and GPT-NeoX), and merging adapters into full weights (nxd-ckpt export-hf
// --merge-lora, nxd-generate --lora).
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "nxd/layers/parallel/lora.h"

namespace nxd::ckpt {

// metadata.json's "lora": r, lora_alpha, lora_dropout, use_rslora, target_modules (a list, or
// target_regex), merge_lora. lora_from_json: CheckpointError naming `where` and the key.
nlohmann::json lora_json(const LoraConfig& c);
LoraConfig lora_from_json(const nlohmann::json& j, const std::string& where);

// A PEFT LoRA adapter: its config and full tensors under nxd's names (lora_A / lora_B weights).
struct PeftAdapter {
  LoraConfig config;
  std::map<std::string, Tensor> tensors;
};
// Writes dir/adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha,
// lora_dropout, use_rslora, target_modules: the adapted layers' names, bias none,
// fan_in_fan_out false) and dir/adapter_model.safetensors (PEFT's names) from full tensors.
void write_peft_adapter(const std::filesystem::path& dir, const PeftAdapter& a);
// Reads such a folder (as PEFT saves it): CheckpointError naming the file and key or tensor for
// what nxd cannot apply (another peft_type, DoRA, fan_in_fan_out, modules_to_save, trained
// biases, a tensor that is not a lora_A/lora_B weight). Tensors are cast to f32.
PeftAdapter read_peft_adapter(const std::filesystem::path& dir);

// Merges `a` into the full weights `full` (names as the model's): W += scale * B A. Every
// adapted weight must be in `full` with B A's shape (CheckpointError naming it otherwise).
void merge_adapter(std::map<std::string, Tensor>& full, const PeftAdapter& a,
                   const std::string& source);

// The model of a complete checkpoint as full tensors with its adapters (if it has any, i.e. its
// metadata records "lora") taken out into `adapter` (null: left in).
std::map<std::string, Tensor> read_model_and_adapter(const std::filesystem::path& tag_dir,
                                                     PeftAdapter* adapter);

// nxd-ckpt export-lora: a checkpoint's adapters alone as a PEFT folder. CheckpointError when it
// has none.
void export_lora(const std::filesystem::path& tag_dir, const std::filesystem::path& out_dir);

}  // namespace nxd::ckpt
