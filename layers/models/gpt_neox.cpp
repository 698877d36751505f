#include "nxd/layers/models/gpt_neox.h"

#include "nxd/layers/parallel/context_parallel.h"

namespace nxd {

GPTNeoXLayer::GPTNeoXLayer(const ModelConfig& c)
    : DecoderLayer("GPTNeoXLayer"), parallel_residual_(c.use_parallel_residual) {
  ParamOptions p{c.dtype, c.device};
  const int tp = model_tensor_parallel_size();
  const bool sp = c.sequence_parallel && tp > 1;
  sequence_parallel_ = sp;
  const LayerNormOptions no{.eps = c.norm_eps, .sequence_parallel_enabled = sp, .param = p};
  input_layernorm_ =
      register_module("input_layernorm", std::make_shared<LayerNorm>(c.hidden_size, no));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", std::make_shared<LayerNorm>(c.hidden_size, no));
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
  a.sequence_parallel = sp;
  a.recompute_core = c.activations_checkpoint_granularity == CheckpointGranularity::selective;
  a.context_parallel_group = model_context_parallel_group();
  attention_ = register_module("attention", std::make_shared<CausalSelfAttention>(a));
  MlpOptions mo;
  mo.bias = true;
  mo.gelu = c.gelu_tanh ? GeluApprox::tanh : GeluApprox::none;
  mo.init = c.init_scheme();
  mo.param = p;
  mo.sequence_parallel = sp;
  mlp_ = register_module("mlp", std::make_shared<Mlp>(c.hidden_size, c.ffn_size(), mo));
}

Tensor GPTNeoXLayer::forward(const Tensor& h, int64_t position_offset) const {
  Tensor attn = hidden_dropout(*post_attention_dropout_,
                               attention_->forward(input_layernorm_->forward(h), position_offset),
                               sequence_parallel_);
  if (parallel_residual_) {
    Tensor m =
        hidden_dropout(*post_mlp_dropout_, mlp_->forward(post_attention_layernorm_->forward(h)),
                       sequence_parallel_);
    return add(add(h, attn), m);
  }
  Tensor a = add(h, attn);
  return add(
      a, hidden_dropout(*post_mlp_dropout_, mlp_->forward(post_attention_layernorm_->forward(a)),
                        sequence_parallel_));
}

Tensor GPTNeoXLayer::forward_cached(const Tensor& h, const CacheStep& step, const Tensor& k_cache,
                                    const Tensor& v_cache) const {
  Tensor attn = attention_->forward_cached(input_layernorm_->forward(h), step, k_cache, v_cache);
  if (parallel_residual_)
    return add(add(h, attn), mlp_->forward(post_attention_layernorm_->forward(h)));
  Tensor a = add(h, attn);
  return add(a, mlp_->forward(post_attention_layernorm_->forward(a)));
}

GPTNeoXForCausalLM::GPTNeoXForCausalLM(const ModelConfig& cfg, const ModelPart& part)
    : CausalLM(cfg, "GPTNeoXForCausalLM", part) {
  const ModelConfig& c = cfg_;
  const bool sp = sequence_parallel();
  register_decoder_stack(
      "gpt_neox", std::make_shared<DecoderStack>(
                      "GPTNeoXModel", c, part_,
                      DecoderStackOptions{
                          .embedding = "embed_in",
                          .embedding_dropout = "emb_dropout",
                          .final_norm = "final_layer_norm",
                          .make_layer = [&c](int64_t) { return std::make_shared<GPTNeoXLayer>(c); },
                          .make_final_norm =
                              [&c, sp] {
                                return std::make_shared<LayerNorm>(
                                    c.hidden_size, LayerNormOptions{.eps = c.norm_eps,
                                                                    .sequence_parallel_enabled = sp,
                                                                    .param = {c.dtype, c.device}});
                              },
                      }));
  register_output_head("embed_out");
}

}  // namespace nxd
