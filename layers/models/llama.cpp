#include "nxd/layers/models/llama.h"

namespace nxd {

namespace {
AttentionOptions llama_attention(const ModelConfig& c) {
  AttentionOptions a;
  a.hidden_size = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.kv_heads();
  a.rotary_dim = c.head_dim();
  a.rope_theta = c.rope_theta;
  a.bias = false;
  a.layout = QkvLayout::separate;
  a.init_std = c.init_std;
  a.param = {c.dtype, c.device};
  return a;
}
}  // namespace

LlamaDecoderLayer::LlamaDecoderLayer(const ModelConfig& c) : Module("LlamaDecoderLayer") {
  ParamOptions p{c.dtype, c.device};
  self_attn_ =
      register_module("self_attn", std::make_shared<CausalSelfAttention>(llama_attention(c)));
  GatedMlpOptions mo;
  mo.init_std = c.init_std;
  mo.param = p;
  mlp_ = register_module("mlp", std::make_shared<GatedMlp>(c.hidden_size, c.ffn_size(), mo));
  input_layernorm_ =
      register_module("input_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.norm_eps, p));
  post_attention_layernorm_ = register_module(
      "post_attention_layernorm", std::make_shared<RMSNorm>(c.hidden_size, c.norm_eps, p));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor LlamaDecoderLayer::forward(const Tensor& h, int64_t position_offset) const {
  Tensor a =
      add(h, dropout_->forward(self_attn_->forward(input_layernorm_->forward(h), position_offset)));
  return add(a, dropout_->forward(mlp_->forward(post_attention_layernorm_->forward(a))));
}

LlamaModel::LlamaModel(const ModelConfig& c) : Module("LlamaModel") {
  EmbeddingOptions eo;
  eo.weight_init = ParamInit::normal(c.init_std);
  eo.param = {c.dtype, c.device};
  embed_tokens_ =
      register_module("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, eo));
  layers_ = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t l = 0; l < c.num_layers; ++l)
    layers_->push_back(std::make_shared<LlamaDecoderLayer>(c));
  norm_ = register_module("norm", std::make_shared<RMSNorm>(c.hidden_size, c.norm_eps,
                                                            ParamOptions{c.dtype, c.device}));
}

Tensor LlamaModel::forward(const Tensor& ids, int64_t position_offset) const {
  Tensor h = embed_tokens_->forward(ids);
  for (const auto& layer : *layers_)
    h = static_cast<const LlamaDecoderLayer&>(*layer).forward(h, position_offset);
  return norm_->forward(h);
}

LlamaForCausalLM::LlamaForCausalLM(const ModelConfig& cfg) : CausalLM(cfg, "LlamaForCausalLM") {
  model_ = register_module("model", std::make_shared<LlamaModel>(cfg_));
  if (!cfg_.tie_word_embeddings) {
    LinearOptions lo;
    lo.bias = false;
    lo.weight_init = ParamInit::normal(cfg_.init_std);
    lo.param = {cfg_.dtype, cfg_.device};
    lm_head_ =
        register_module("lm_head", std::make_shared<Linear>(cfg_.hidden_size, cfg_.vocab_size, lo));
  }
}

Tensor LlamaForCausalLM::hidden_states(const Tensor& ids, int64_t position_offset) {
  check_ids(ids, position_offset);
  return model_->forward(ids, position_offset);
}

Tensor LlamaForCausalLM::lm_head(const Tensor& hidden) {
  return linear(hidden, lm_head_ ? lm_head_->weight() : model_->embed_tokens()->weight());
}

}  // namespace nxd
