#pragma once
// The files of a Hugging Face transformers folder (config.json plus model.safetensors, or shards
// listed by model.safetensors.index.json), read without knowing any model: config.json as JSON,
// every tensor cast to f32 (transformers builds the model in float32 unless told otherwise and
// copies every tensor into it; torch_dtype only says how it was saved), and transformers'
// rope_scaling. Mapping config.json onto nxd's ModelConfig is checkpoint/hf.h's.
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nxd/runtime/rope_scaling.h"
#include "nxd/runtime/tensor.h"

namespace nxd::io {

// A folder with config.json and model.safetensors or model.safetensors.index.json.
bool is_hf_folder(const std::filesystem::path& dir);
// config.json of a transformers folder, parsed (FileError naming the file).
nlohmann::json read_hf_config_json(const std::filesystem::path& hf_dir);
// Every tensor of a transformers folder (F32, F16 or BF16; shards through the index), cast to f32
// (`notes` gets a line when shards were read). FileError naming the file and tensor for an
// unknown dtype, a missing shard, a truncated file.
std::map<std::string, Tensor> read_hf_tensors(const std::filesystem::path& hf_dir,
                                              std::vector<std::string>* notes = nullptr);

// transformers' rope_scaling of a config.json (`j` the whole config) and back (null for none):
// linear or llama3; other types are a FileError naming the type.
RopeScaling read_rope_scaling(const nlohmann::json& j);
nlohmann::json rope_scaling_json(const RopeScaling& s);

}  // namespace nxd::io
