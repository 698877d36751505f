#pragma once
// Checkpoints without a training job (what tools/nxd-ckpt runs): find a checkpoint, verify every
// checksum, export the model as one merged safetensors file, and reshard to other degrees.
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "nxd/layers/models/config.h"
#include "nxd/layers/module.h"

namespace nxd::ckpt {

// `dir` itself if it is a checkpoint folder (has the `checkpoint` marker), else the newest
// complete checkpoint under it, or under dir/checkpoints/ when dir is a run folder (nxd-train's
// --out). CheckpointError if there is none.
std::filesystem::path resolve_checkpoint(const std::filesystem::path& dir);

struct VerifyReport {
  int64_t files = 0, tensors = 0, bytes = 0;  // tensor bytes read
  int64_t experts = 0;                        // MoE expert tensors checked (each TP rank's once)
};
// Reads every file of a complete checkpoint: JSON files parse, every shard listed in
// metadata.json exists and every tensor matches its checksum, and ZeRO-1 state's DP files tile
// every state tensor. With MoE experts (saved at any expert-parallel degree EP): every expert
// tensor is in exactly one model file per (tp, pp) rank, the one of the DP rank metadata.json
// names (EP rank e's file holds experts [e*E/EP, (e+1)*E/EP)), no other tensor is in a file of DP
// rank > 0, every expert 0..E-1 of every expert weight is present (E: model_config's
// moe.num_experts) with one shape, and the same holds for an unsharded optimizer's expert state.
// Throws CheckpointError at the first problem, naming the file and tensor.
VerifyReport verify_checkpoint(const std::filesystem::path& tag_dir);

// Writes the model of a complete checkpoint as one safetensors file of full (unsplit) tensors,
// names unchanged, with "nxd.source" (the folder) and "nxd.model_config" (JSON, if recorded) in
// its metadata. Holds the model's full tensors in memory.
void export_merged(const std::filesystem::path& tag_dir, const std::filesystem::path& out);

// The degrees to reshard to. dp counts every rank that holds a replica of the parameters (a
// saved DP x CP group: context-parallel ranks are data-parallel ranks to a checkpoint); ep (the
// expert-parallel degree of a MoE model) must divide dp and the model's num_experts.
struct ReshardDegrees {
  int tp = 1, pp = 1, dp = 1, ep = 1;
};

// Loads a complete checkpoint of a CausalLM (metadata.json records its model_config) at the
// given degrees on sim ranks (pp > 1: a PipelineModel's balanced stages) with load_checkpoint
// (the online path: the same resharding of TP splits, DP shards and experts as a run that loads
// it) and saves it under out_root/<same tag> (model, optimizer if saved, scheduler, user
// content). The optimizer keeps its layout: ZeRO-1 state is written per DP rank of the new DP
// degree (the experts' sharded over the new expert-DP group), AdamW's / SGD's whole. ConfigError
// for impossible degrees; CheckpointError if out_root/<tag> exists (nothing is overwritten).
void reshard_checkpoint(const std::filesystem::path& tag_dir, const std::filesystem::path& out_root,
                        const ReshardDegrees& to);

// The inverse of export_merged: a safetensors file of full tensors with "nxd.model_config" in
// its metadata (what export_merged writes) becomes the model of a checkpoint out_root/<tag> at
// the given degrees (no optimizer state). Every parameter of the model must be in the file with
// its full shape and dtype (CheckpointError naming it otherwise); extra tensors are refused too.
void import_merged(const std::filesystem::path& file, const std::filesystem::path& out_root,
                   const std::string& tag, int tp, int dp);
// Full tensors of a model of config cfg (from `source`, for messages) into a checkpoint
// out_root/tag at TP tp and DP dp: every tensor must be a parameter of the model and every
// parameter present (CheckpointError naming the tensor otherwise).
void import_full_tensors(const std::map<std::string, Tensor>& full, const std::string& source,
                         ModelConfig cfg, const std::filesystem::path& out_root,
                         const std::string& tag, int tp, int dp);

// Hugging Face transformers form: <out_dir>/model.safetensors (export_merged: nxd's Llama and
// GPT-NeoX parameter names and layouts are transformers' own, GPT-NeoX's fused query_key_value
// included) and <out_dir>/config.json (LlamaForCausalLM / GPTNeoXForCausalLM). import_hf reads
// such a folder (config.json + model.safetensors) into a checkpoint at the given degrees.
// A checkpoint with LoRA adapters (metadata "lora", checkpoint/lora_files.h) is exported with
// them merged into the base weights when merge_lora (or the run's peft.merge_lora) says so, and
// refused otherwise (the adapters alone: export_lora).
struct ExportHfOptions {
  bool merge_lora = false;
};
void export_hf(const std::filesystem::path& tag_dir, const std::filesystem::path& out_dir,
               const ExportHfOptions& opts = {});
void import_hf(const std::filesystem::path& hf_dir, const std::filesystem::path& out_root,
               const std::string& tag, int tp, int dp);
// The transformers config.json of a model config, and back (CheckpointError if unsupported).
nlohmann::json hf_config_json(const ModelConfig& c);
ModelConfig model_config_from_hf(const nlohmann::json& j);

nlohmann::json model_config_json(const ModelConfig& c);
ModelConfig model_config_from_json(const nlohmann::json& j);  // CheckpointError if malformed

}  // namespace nxd::ckpt
