#include "nxd/layers/models/llama.h"

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
  const int tp = model_tensor_parallel_size();
  const bool sp = c.sequence_parallel && tp > 1;
  sp_ = sp;
  self_attn_ =
      register_module("self_attn", std::make_shared<CausalSelfAttention>(llama_attention(c, tp)));
  GatedMlpOptions mo;
  mo.init_std = c.init_std;
  mo.param = p;
  mo.tensor_parallel = tp > 1;
  mo.sequence_parallel = sp;
  mlp_ = register_module("mlp", std::make_shared<GatedMlp>(c.hidden_size, c.ffn_size(), mo));
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
  return add(a,
             hidden_dropout(*dropout_, mlp_->forward(post_attention_layernorm_->forward(a)), sp_));
}

LlamaModel::LlamaModel(const ModelConfig& c) : Module("LlamaModel") {
  const int tp = model_tensor_parallel_size();
  const bool sp = c.sequence_parallel && tp > 1;
  if (tp == 1) {
    EmbeddingOptions eo;
    eo.weight_init = ParamInit::normal(c.init_std);
    eo.param = {c.dtype, c.device};
    embed_tokens_ = register_module("embed_tokens",
                                    std::make_shared<Embedding>(c.vocab_size, c.hidden_size, eo));
    embed_weight_ = embed_tokens_->weight();
  } else {
    ParallelEmbeddingOptions eo;
    eo.sequence_parallel_enabled = sp;
    eo.weight_init = ParamInit::normal(c.init_std);
    eo.param = {c.dtype, c.device};
    pembed_tokens_ = register_module(
        "embed_tokens", std::make_shared<ParallelEmbedding>(c.vocab_size, c.hidden_size, eo));
    embed_weight_ = pembed_tokens_->weight();
  }
  layers_ = register_module("layers", std::make_shared<ModuleList>());
  for (int64_t l = 0; l < c.num_layers; ++l)
    layers_->push_back(std::make_shared<LlamaDecoderLayer>(c));
  norm_ =
      register_module("norm", std::make_shared<ParallelRMSNorm>(c.hidden_size, c.norm_eps, sp,
                                                                ParamOptions{c.dtype, c.device}));
}

Tensor LlamaModel::forward(const Tensor& ids, int64_t position_offset) const {
  Tensor h = embed_tokens_ ? embed_tokens_->forward(ids) : pembed_tokens_->forward(ids);
  for (const auto& layer : *layers_)
    h = static_cast<const LlamaDecoderLayer&>(*layer).forward(h, position_offset);
  return norm_->forward(h);
}

LlamaForCausalLM::LlamaForCausalLM(const ModelConfig& cfg) : CausalLM(cfg, "LlamaForCausalLM") {
  model_ = register_module("model", std::make_shared<LlamaModel>(cfg_));
  register_output_head("lm_head");
}

}  // namespace nxd
