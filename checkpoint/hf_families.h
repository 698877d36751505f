#pragma once
// transformers' config.json of the llama-family variants (Qwen2, Qwen3, Mistral) <-> ModelConfig:
// internal to hf_config.cpp (hf.h says what is accepted and refused). The common keys (sizes,
// tie_word_embeddings, rope_scaling, ...) are read and written by hf_config.cpp; these read and
// write what the family adds, and refuse by name what nxd's model cannot express.
#include <nlohmann/json.hpp>

#include "nxd/layers/models/config.h"

namespace nxd::ckpt::detail {

// The llama keys every family shares (num_key_value_heads, rms_norm_eps, rope_theta, hidden_act,
// head_dim): hf_config.cpp's read_llama.
void read_llama(const nlohmann::json& j, ModelConfig& c);
// CheckpointError "[import-hf] config.json: <what> is not supported by nxd's model".
[[noreturn]] void refuse(const std::string& what);

void read_qwen2(const nlohmann::json& j, ModelConfig& c);
void read_qwen3(const nlohmann::json& j, ModelConfig& c);
void read_mistral(const nlohmann::json& j, ModelConfig& c);
// The sliding window of a config.json with transformers' sliding_window (null: none).
int64_t read_sliding_window(const nlohmann::json& j, const ModelConfig& c);
// `j` holds the llama keys of c; these turn it into the family's config.json (CheckpointError
// naming the fields the family cannot express).
void write_qwen2(const ModelConfig& c, nlohmann::json& j);
void write_qwen3(const ModelConfig& c, nlohmann::json& j);
void write_mistral(const ModelConfig& c, nlohmann::json& j);

}  // namespace nxd::ckpt::detail
