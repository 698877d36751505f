#include "nxd/layers/models/llama.h"

#include "nxd/layers/parallel/context_parallel.h"

namespace nxd {

namespace {
AttentionOptions llama_attention(const ModelConfig& c, int tp) {
  AttentionOptions a;
  a.tensor_parallel = tp > 1;
  a.sequence_parallel = c.sequence_parallel && tp > 1;
  a.kv_size_multiplier = c.kv_size_multiplier;
  a.hidden_size = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.kv_heads();
  a.head_dim = c.head_dim();
  a.rotary_dim = c.head_dim();
  a.rope_theta = c.rope_theta;
  a.rope_scaling = c.rope_scaling;
  a.bias = c.attention_bias;
  a.layout = QkvLayout::separate;
  a.init = c.init_scheme();
  a.param = {c.dtype, c.device};
  a.recompute_core = c.activations_checkpoint_granularity == CheckpointGranularity::selective;
  a.context_parallel_group = model_context_parallel_group();
  return a;
}
}  // namespace

LlamaDecoderLayer::LlamaDecoderLayer(const ModelConfig& c, int64_t layer)
    : Module("LlamaDecoderLayer") {
  ParamOptions p{c.dtype, c.device};
  const int tp = model_tensor_parallel_size();
  const bool sp = c.sequence_parallel && tp > 1;
  sp_ = sp;
  self_attn_ =
      register_module("self_attn", std::make_shared<CausalSelfAttention>(llama_attention(c, tp)));
  GatedMlpOptions mo;
  mo.bias = c.mlp_bias;
  mo.act = c.hidden_act == "gelu"       ? GatedMlpOptions::Act::gelu
           : c.hidden_act == "gelu_new" ? GatedMlpOptions::Act::gelu_tanh
                                        : GatedMlpOptions::Act::silu;
  mo.init = c.init_scheme();
  mo.param = p;
  mo.tensor_parallel = tp > 1;
  mo.sequence_parallel = sp;
  if (c.moe.is_moe_layer(layer)) {
    MoeMlpOptions eo;
    eo.hidden_size = c.hidden_size;
    eo.ffn_hidden_size = c.ffn_size();
    eo.moe = c.moe;
    eo.init = c.init_scheme();
    eo.param = p;
    eo.ep_group = moe_expert_parallel_group();
    eo.tp_group = moe_tensor_parallel_group();
    eo.sequence_parallel = sp;
    eo.cp_group = model_context_parallel_group();
    moe_ = register_module("block_sparse_moe", std::make_shared<MoeMlp>(eo));
  } else {
    mlp_ = register_module("mlp", std::make_shared<GatedMlp>(c.hidden_size, c.ffn_size(), mo));
  }
  input_layernorm_ = register_module(
      "input_layernorm", std::make_shared<ParallelRMSNorm>(c.hidden_size, c.norm_eps, sp, p));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm",
                      std::make_shared<ParallelRMSNorm>(c.hidden_size, c.norm_eps, sp, p));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor LlamaDecoderLayer::forward(const Tensor& h, int64_t position_offset) const {
  Tensor a = add(
      h, hidden_dropout(*dropout_,
                        self_attn_->forward(input_layernorm_->forward(h), position_offset), sp_));
  return add(a, hidden_dropout(*dropout_, mlp(post_attention_layernorm_->forward(a)), sp_));
}

Tensor LlamaDecoderLayer::mlp(const Tensor& x) const {
  return moe_ ? moe_->forward(x) : mlp_->forward(x);
}

Tensor LlamaDecoderLayer::forward_cached(const Tensor& h, const CacheStep& step,
                                         const Tensor& k_cache, const Tensor& v_cache) const {
  Tensor a =
      add(h, self_attn_->forward_cached(input_layernorm_->forward(h), step, k_cache, v_cache));
  return add(a, mlp(post_attention_layernorm_->forward(a)));
}

LlamaModel::LlamaModel(const ModelConfig& c, const ModelPart& part)
    : Module("LlamaModel"),
      full_checkpoint_(c.activations_checkpoint_granularity == CheckpointGranularity::full) {
  const int tp = model_tensor_parallel_size();
  const bool sp = c.sequence_parallel && tp > 1;
  // a tied head's weight is the embedding: the last stage holds it too
  const bool embedding = part.embedding || (part.head && c.tie_word_embeddings);
  if (embedding && tp == 1) {
    EmbeddingOptions eo;
    eo.weight_init = c.init_scheme().embedding();
    eo.param = {c.dtype, c.device};
    embed_tokens_ = register_module("embed_tokens",
                                    std::make_shared<Embedding>(c.vocab_size, c.hidden_size, eo));
    embed_weight_ = embed_tokens_->weight();
  } else if (embedding) {
    ParallelEmbeddingOptions eo;
    eo.sequence_parallel_enabled = sp;
    eo.weight_init = c.init_scheme().embedding();
    eo.param = {c.dtype, c.device};
    pembed_tokens_ = register_module(
        "embed_tokens", std::make_shared<ParallelEmbedding>(c.vocab_size, c.hidden_size, eo));
    embed_weight_ = pembed_tokens_->weight();
  }
  layers_ = register_module("layers", std::make_shared<ModuleList>(part.layer_begin));
  for (int64_t l = part.layer_begin; l < part.end(c); ++l)
    layers_->push_back(std::make_shared<LlamaDecoderLayer>(c, l));
  if (part.head)
    norm_ =
        register_module("norm", std::make_shared<ParallelRMSNorm>(c.hidden_size, c.norm_eps, sp,
                                                                  ParamOptions{c.dtype, c.device}));
}

Tensor LlamaModel::embed(const Tensor& ids) const {
  NXD_CHECK(embed_tokens_ || pembed_tokens_, "[LlamaModel::embed] this part has no embedding");
  return embed_tokens_ ? embed_tokens_->forward(ids) : pembed_tokens_->forward(ids);
}

Tensor LlamaModel::run_layers(const Tensor& h, int64_t position_offset) const {
  Tensor x = h;
  for (const auto& layer : *layers_) {
    const auto& l = static_cast<const LlamaDecoderLayer&>(*layer);
    x = full_checkpoint_
            ? checkpoint_layer(
                  [&l, position_offset](const Tensor& y) { return l.forward(y, position_offset); },
                  x)
            : l.forward(x, position_offset);
  }
  return x;
}

Tensor LlamaModel::run_layers_cached(const Tensor& h, const CacheStep& step, KVCache& cache) const {
  Tensor x = h;
  size_t i = 0;
  for (const auto& layer : *layers_) {
    x = static_cast<const LlamaDecoderLayer&>(*layer).forward_cached(x, step, cache.k.at(i),
                                                                     cache.v.at(i));
    ++i;
  }
  return x;
}

Tensor LlamaModel::final_norm(const Tensor& h) const {
  NXD_CHECK(norm_, "[LlamaModel::final_norm] this part has no final norm");
  return norm_->forward(h);
}

Tensor LlamaModel::forward(const Tensor& ids, int64_t position_offset) const {
  return final_norm(run_layers(embed(ids), position_offset));
}

LlamaForCausalLM::LlamaForCausalLM(const ModelConfig& cfg, const ModelPart& part)
    : CausalLM(cfg, cfg.arch == "mixtral" ? "MixtralForCausalLM" : "LlamaForCausalLM", part) {
  model_ = register_module("model", std::make_shared<LlamaModel>(cfg_, part_));
  register_output_head("lm_head");
}

}  // namespace nxd
