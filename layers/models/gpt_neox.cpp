#include "nxd/layers/models/gpt_neox.h"

namespace nxd {

GPTNeoXLayer::GPTNeoXLayer(const ModelConfig& c)
    : Module("GPTNeoXLayer"), parallel_residual_(c.use_parallel_residual) {
  ParamOptions p{c.dtype, c.device};
  input_layernorm_ = register_module(
      "input_layernorm", std::make_shared<LayerNorm>(c.hidden_size, c.norm_eps, true, p));
  post_attention_layernorm_ = register_module(
      "post_attention_layernorm", std::make_shared<LayerNorm>(c.hidden_size, c.norm_eps, true, p));
  post_attention_dropout_ =
      register_module("post_attention_dropout", std::make_shared<Dropout>(c.dropout));
  post_mlp_dropout_ = register_module("post_mlp_dropout", std::make_shared<Dropout>(c.dropout));
  AttentionOptions a;
  a.hidden_size = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.num_attention_heads;
  a.rotary_dim = c.rotary_dim();
  a.rope_theta = c.rope_theta;
  a.bias = true;
  a.layout = QkvLayout::fused_neox;
  a.init_std = c.init_std;
  a.param = p;
  attention_ = register_module("attention", std::make_shared<CausalSelfAttention>(a));
  MlpOptions mo;
  mo.bias = true;
  mo.gelu = c.gelu_tanh ? GeluApprox::tanh : GeluApprox::none;
  mo.init_std = c.init_std;
  mo.param = p;
  mlp_ = register_module("mlp", std::make_shared<Mlp>(c.hidden_size, c.ffn_size(), mo));
}

Tensor GPTNeoXLayer::forward(const Tensor& h, int64_t position_offset) const {
  Tensor attn = post_attention_dropout_->forward(
      attention_->forward(input_layernorm_->forward(h), position_offset));
  if (parallel_residual_) {
    Tensor m = post_mlp_dropout_->forward(mlp_->forward(post_attention_layernorm_->forward(h)));
    return add(add(h, attn), m);
  }
  Tensor a = add(h, attn);
  return add(a, post_mlp_dropout_->forward(mlp_->forward(post_attention_layernorm_->forward(a))));
}

GPTNeoXModel::GPTNeoXModel(const ModelConfig& c) : Module("GPTNeoXModel") {
  EmbeddingOptions eo;
  eo.weight_init = ParamInit::normal(c.init_std);
  eo.param = {c.dtype, c.device};
  embed_in_ =
      register_module("embed_in", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, eo));
  emb_dropout_ = register_module("emb_dropout", std::make_shared<Dropout>(c.dropout));
  layers_ = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t l = 0; l < c.num_layers; ++l) layers_->push_back(std::make_shared<GPTNeoXLayer>(c));
  final_layer_norm_ = register_module("final_layer_norm",
                                      std::make_shared<LayerNorm>(c.hidden_size, c.norm_eps, true,
                                                                  ParamOptions{c.dtype, c.device}));
}

Tensor GPTNeoXModel::forward(const Tensor& ids, int64_t position_offset) const {
  Tensor h = emb_dropout_->forward(embed_in_->forward(ids));
  for (const auto& layer : *layers_)
    h = static_cast<const GPTNeoXLayer&>(*layer).forward(h, position_offset);
  return final_layer_norm_->forward(h);
}

GPTNeoXForCausalLM::GPTNeoXForCausalLM(const ModelConfig& cfg)
    : CausalLM(cfg, "GPTNeoXForCausalLM") {
  gpt_neox_ = register_module("gpt_neox", std::make_shared<GPTNeoXModel>(cfg_));
  if (!cfg_.tie_word_embeddings) {
    LinearOptions lo;
    lo.bias = false;
    lo.weight_init = ParamInit::normal(cfg_.init_std);
    lo.param = {cfg_.dtype, cfg_.device};
    embed_out_ = register_module("embed_out",
                                 std::make_shared<Linear>(cfg_.hidden_size, cfg_.vocab_size, lo));
  }
}

Tensor GPTNeoXForCausalLM::hidden_states(const Tensor& ids, int64_t position_offset) {
  check_ids(ids, position_offset);
  return gpt_neox_->forward(ids, position_offset);
}

Tensor GPTNeoXForCausalLM::lm_head(const Tensor& hidden) {
  return linear(hidden, embed_out_ ? embed_out_->weight() : gpt_neox_->embed_in()->weight());
}

}  // namespace nxd
