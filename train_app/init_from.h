#pragma once
// model.init_from (fine-tuning): a run whose weights start from a transformers folder, an nxd
// checkpoint of any TP/PP/DP/EP degree (or a run folder, its checkpoints/) or a file of
// `nxd-ckpt export`, resharded to the run's layout, with a fresh optimizer at step 0.
//
// Resolution (resolve_init_from, called by resolve() before the model section): every model.*
// key the source describes (arch, vocab_size, num_layers, hidden_size, num_attention_heads,
// num_kv_heads, ffn_hidden_size, max_position_embeddings, rope_theta, norm_eps,
// tie_word_embeddings, gpt_neox's rotary_pct, and a mixture-of-experts source's moe.num_experts,
// moe.top_k and moe.frequency; a dense source's moe.num_experts is 0) takes the source's value
// when the run does not give the key; a value given (also one equal to the key's default) that
// differs is a ConfigError naming the key, both values and the
// source (max_position_embeddings excepted: no weight depends on it, so a run may set another
// context length). Fields without a key (head_dim, gelu_new, use_parallel_residual) come from the
// source (model_config(cfg) copies them). exp_manager.resume_from_checkpoint on a checkpoint
// without optimizer and trainer state (what nxd-ckpt import / import-hf write) or on a transformers
// folder is a ConfigError saying to use model.init_from.
#include <string>
#include <vector>

#include "nxd/layers/module.h"
#include "nxd/train_app/config.h"

namespace nxd::train_app {

// Reads model.init_from's source (if set) and rewrites c's model keys as above; returns what
// TrainConfig::init records. Also checks exp_manager.resume_from_checkpoint.
InitFromSection resolve_init_from(Config& c);

// Copies the source's weights into this rank's modules (the whole model, or a pipeline stage's
// chunks); `whole`: every tensor of the source must be used. Not collective. Returns notes
// (buffers ignored, shards read) for the run's summary.
std::vector<std::string> load_init_weights(const TrainConfig& cfg,
                                           const std::vector<Module*>& modules, bool whole);

}  // namespace nxd::train_app
