#include "nxd/layers/models/gpt_neox.h"

#include "nxd/layers/parallel/context_parallel.h"

namespace nxd {

GPTNeoXLayer::GPTNeoXLayer(const ModelConfig& c)
    : Module("GPTNeoXLayer"), parallel_residual_(c.use_parallel_residual) {
  ParamOptions p{c.dtype, c.device};
  const int tp = model_tensor_parallel_size();
  const bool sp = c.sequence_parallel && tp > 1;
  sp_ = sp;
  input_layernorm_ =
      register_module("input_layernorm",
                      std::make_shared<ParallelLayerNorm>(c.hidden_size, c.norm_eps, true, sp, p));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm",
                      std::make_shared<ParallelLayerNorm>(c.hidden_size, c.norm_eps, true, sp, p));
  post_attention_dropout_ =
      register_module("post_attention_dropout", std::make_shared<Dropout>(c.dropout));
  post_mlp_dropout_ = register_module("post_mlp_dropout", std::make_shared<Dropout>(c.dropout));
  AttentionOptions a;
  a.hidden_size = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.num_attention_heads;
  a.head_dim = c.head_dim();
  a.rotary_dim = c.rotary_dim();
  a.rope_theta = c.rope_theta;
  a.rope_scaling = c.rope_scaling;
  a.bias = true;
  a.layout = QkvLayout::fused_neox;
  a.init = c.init_scheme();
  a.param = p;
  a.tensor_parallel = tp > 1;
  a.sequence_parallel = sp;
  a.recompute_core = c.activations_checkpoint_granularity == CheckpointGranularity::selective;
  a.context_parallel_group = model_context_parallel_group();
  attention_ = register_module("attention", std::make_shared<CausalSelfAttention>(a));
  MlpOptions mo;
  mo.bias = true;
  mo.gelu = c.gelu_tanh ? GeluApprox::tanh : GeluApprox::none;
  mo.init = c.init_scheme();
  mo.param = p;
  mo.tensor_parallel = tp > 1;
  mo.sequence_parallel = sp;
  mlp_ = register_module("mlp", std::make_shared<Mlp>(c.hidden_size, c.ffn_size(), mo));
}

Tensor GPTNeoXLayer::forward(const Tensor& h, int64_t position_offset) const {
  Tensor attn =
      hidden_dropout(*post_attention_dropout_,
                     attention_->forward(input_layernorm_->forward(h), position_offset), sp_);
  if (parallel_residual_) {
    Tensor m = hidden_dropout(*post_mlp_dropout_,
                              mlp_->forward(post_attention_layernorm_->forward(h)), sp_);
    return add(add(h, attn), m);
  }
  Tensor a = add(h, attn);
  return add(a, hidden_dropout(*post_mlp_dropout_,
                               mlp_->forward(post_attention_layernorm_->forward(a)), sp_));
}

Tensor GPTNeoXLayer::forward_cached(const Tensor& h, const CacheStep& step, const Tensor& k_cache,
                                    const Tensor& v_cache) const {
  Tensor attn = attention_->forward_cached(input_layernorm_->forward(h), step, k_cache, v_cache);
  if (parallel_residual_)
    return add(add(h, attn), mlp_->forward(post_attention_layernorm_->forward(h)));
  Tensor a = add(h, attn);
  return add(a, mlp_->forward(post_attention_layernorm_->forward(a)));
}

GPTNeoXModel::GPTNeoXModel(const ModelConfig& c, const ModelPart& part)
    : Module("GPTNeoXModel"),
      full_checkpoint_(c.activations_checkpoint_granularity == CheckpointGranularity::full) {
  const int tp = model_tensor_parallel_size();
  const bool sp = c.sequence_parallel && tp > 1;
  sp_ = sp;
  // a tied head's weight is the embedding: the last stage holds it too
  const bool embedding = part.embedding || (part.head && c.tie_word_embeddings);
  if (embedding && tp == 1) {
    EmbeddingOptions eo;
    eo.weight_init = c.init_scheme().embedding();
    eo.param = {c.dtype, c.device};
    embed_in_ =
        register_module("embed_in", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, eo));
    embed_weight_ = embed_in_->weight();
  } else if (embedding) {
    ParallelEmbeddingOptions eo;
    eo.sequence_parallel_enabled = sp;
    eo.weight_init = c.init_scheme().embedding();
    eo.param = {c.dtype, c.device};
    pembed_in_ = register_module(
        "embed_in", std::make_shared<ParallelEmbedding>(c.vocab_size, c.hidden_size, eo));
    embed_weight_ = pembed_in_->weight();
  }
  emb_dropout_ = register_module("emb_dropout", std::make_shared<Dropout>(c.dropout));
  layers_ = register_module("layers", std::make_shared<ModuleList>(part.layer_begin));
  for (int64_t l = part.layer_begin; l < part.end(c); ++l)
    layers_->push_back(std::make_shared<GPTNeoXLayer>(c));
  if (part.head)
    final_layer_norm_ = register_module(
        "final_layer_norm", std::make_shared<ParallelLayerNorm>(c.hidden_size, c.norm_eps, true, sp,
                                                                ParamOptions{c.dtype, c.device}));
}

Tensor GPTNeoXModel::embed(const Tensor& ids) const {
  NXD_CHECK(embed_in_ || pembed_in_, "[GPTNeoXModel::embed] this part has no embedding");
  return hidden_dropout(*emb_dropout_,
                        embed_in_ ? embed_in_->forward(ids) : pembed_in_->forward(ids), sp_);
}

Tensor GPTNeoXModel::run_layers(const Tensor& h, int64_t position_offset) const {
  Tensor x = h;
  for (const auto& layer : *layers_) {
    const auto& l = static_cast<const GPTNeoXLayer&>(*layer);
    x = full_checkpoint_
            ? checkpoint_layer(
                  [&l, position_offset](const Tensor& y) { return l.forward(y, position_offset); },
                  x)
            : l.forward(x, position_offset);
  }
  return x;
}

Tensor GPTNeoXModel::run_layers_cached(const Tensor& h, const CacheStep& step,
                                       KVCache& cache) const {
  Tensor x = h;
  size_t i = 0;
  for (const auto& layer : *layers_) {
    x = static_cast<const GPTNeoXLayer&>(*layer).forward_cached(x, step, cache.k.at(i),
                                                                cache.v.at(i));
    ++i;
  }
  return x;
}

Tensor GPTNeoXModel::final_norm(const Tensor& h) const {
  NXD_CHECK(final_layer_norm_, "[GPTNeoXModel::final_norm] this part has no final norm");
  return final_layer_norm_->forward(h);
}

Tensor GPTNeoXModel::forward(const Tensor& ids, int64_t position_offset) const {
  return final_norm(run_layers(embed(ids), position_offset));
}

GPTNeoXForCausalLM::GPTNeoXForCausalLM(const ModelConfig& cfg, const ModelPart& part)
    : CausalLM(cfg, "GPTNeoXForCausalLM", part) {
  gpt_neox_ = register_module("gpt_neox", std::make_shared<GPTNeoXModel>(cfg_, part_));
  register_output_head("embed_out");
}

}  // namespace nxd
