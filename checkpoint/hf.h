#pragma once
// Hugging Face transformers folders (config.json plus model.safetensors, or shards listed by
// model.safetensors.index.json) read as nxd's ModelConfig and full f32 tensors, and the weight
// sources a run can start from (model.init_from): a transformers folder, an nxd checkpoint of
// any TP/PP/DP degree, or a file written by `nxd-ckpt export`.
//
// What transformers accepts is accepted the way transformers reads it:
//   - tensors in F32, F16 or BF16 are cast to f32 (transformers builds the model in float32 unless
//     told otherwise and copies every tensor into it; torch_dtype only says how it was saved);
//   - rotary_emb.inv_freq buffers (saved by transformers < 4.31) and GPT-NeoX's attention.bias /
//     attention.masked_bias buffers (the causal mask, older versions) are not weights: dropped;
//   - a tied config (tie_word_embeddings) whose file also holds lm_head.weight / embed_out.weight:
//     transformers ties the head to the embedding and ignores the file's copy; so does nxd.
// Whatever nxd's models cannot express (rope_scaling, Llama's biases or an activation other than
// silu, GPT-NeoX without attention biases, ...) is a CheckpointError naming the key and value,
// never silently ignored. The folder's files themselves are read by io/hf_folder.h.
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "nxd/io/hf_folder.h"
#include "nxd/layers/models/config.h"
#include "nxd/layers/module.h"
#include "nxd/runtime/tensor.h"

namespace nxd::ckpt {

// config.json of a transformers folder as a ModelConfig (CheckpointError naming the file and key).
ModelConfig read_hf_config(const std::filesystem::path& hf_dir);
// Every weight of a transformers folder, cast to f32, with the buffers and tied head copy above
// dropped (`notes` gets one line per kind of thing dropped). CheckpointError naming the file and
// tensor for an unknown dtype, a missing shard, a truncated file.
std::map<std::string, Tensor> read_hf_weights(const std::filesystem::path& hf_dir,
                                              const ModelConfig& cfg,
                                              std::vector<std::string>* notes = nullptr);

// Where a run's weights come from (model.init_from).
struct WeightSource {
  enum class Kind { hf_folder, checkpoint, merged_file };
  Kind kind = Kind::checkpoint;
  std::filesystem::path path;  // the transformers folder, the checkpoint folder (a tag), the file
  ModelConfig config;          // the model it records
  int64_t step = 0;            // checkpoint: the step it was saved at
  std::string description;     // "the transformers folder X (LlamaForCausalLM)"
};
// Recognizes `path`: a transformers folder, an nxd checkpoint folder or a folder of checkpoints
// (its newest complete one), a run folder (its checkpoints/), or a safetensors file with
// nxd.model_config in its metadata. CheckpointError saying what it is not otherwise.
WeightSource inspect_weight_source(const std::filesystem::path& path);
// The full (unsplit) tensors of the source's model, cast to f32 (`notes` as read_hf_weights).
std::map<std::string, Tensor> read_source_weights(const WeightSource& src,
                                                  std::vector<std::string>* notes = nullptr);
// The model of a complete nxd checkpoint as full tensors (any TP/PP/DP degree it was saved at).
std::vector<std::pair<std::string, Tensor>> read_merged_model(const std::filesystem::path& tag_dir);

struct LoadFullOptions {
  bool same_dtype = false;  // refuse a tensor whose dtype differs (else cast to the parameter's)
  std::set<std::string>* used = nullptr;        // gets the names copied
  const std::set<std::string>* skip = nullptr;  // names left as they are (need not be in full)
};
// Copies every state_dict() tensor of `modules` (this rank's: whole models, or a pipeline
// stage's chunks, with the whole model's names) from its full tensor in `full`, taking this TP
// rank's shard (the parameter's parallel attributes say how it is split). Not collective.
// CheckpointError naming `source` and the tensor when one is missing or of another shape.
void load_full_tensors(const std::vector<Module*>& modules,
                       const std::map<std::string, Tensor>& full, const std::string& source,
                       const LoadFullOptions& opts = {});

}  // namespace nxd::ckpt
