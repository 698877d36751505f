#include "nxd/layers/models/llama.h"

#include "nxd/layers/parallel/context_parallel.h"

namespace nxd {

namespace {
AttentionOptions llama_attention(const ModelConfig& c, int tp) {
  AttentionOptions a;
  a.sequence_parallel = c.sequence_parallel && tp > 1;
  a.kv_size_multiplier = tp > 1 ? c.kv_size_multiplier : 1;  // no effect at TP 1 (config.h)
  a.hidden_size = c.hidden_size;
  a.num_heads = c.num_attention_heads;
  a.num_kv_heads = c.kv_heads();
  a.head_dim = c.head_dim();
  a.rotary_dim = c.head_dim();
  a.rope_theta = c.rope_theta;
  a.rope_scaling = c.rope_scaling;
  a.bias = c.attention_bias;
  a.qkv_bias = c.qkv_bias;
  a.qk_norm = c.qk_norm;
  a.qk_norm_eps = c.norm_eps;
  a.sliding_window = c.sliding_window;
  a.layout = QkvLayout::separate;
  a.init = c.init_scheme();
  a.param = {c.dtype, c.device};
  a.recompute_core = c.activations_checkpoint_granularity == CheckpointGranularity::selective;
  a.context_parallel_group = model_context_parallel_group();
  return a;
}
// transformers' class of each llama-family arch
const char* llama_family_type(const std::string& arch) {
  if (arch == "mixtral") return "MixtralForCausalLM";
  if (arch == "qwen2") return "Qwen2ForCausalLM";
  if (arch == "qwen3") return "Qwen3ForCausalLM";
  if (arch == "mistral") return "MistralForCausalLM";
  return "LlamaForCausalLM";
}
}  // namespace

LlamaDecoderLayer::LlamaDecoderLayer(const ModelConfig& c, int64_t layer)
    : DecoderLayer("LlamaDecoderLayer") {
  ParamOptions p{c.dtype, c.device};
  const int tp = model_tensor_parallel_size();
  const bool sp = c.sequence_parallel && tp > 1;
  sequence_parallel_ = sp;
  self_attn_ =
      register_module("self_attn", std::make_shared<CausalSelfAttention>(llama_attention(c, tp)));
  GatedMlpOptions mo;
  mo.bias = c.mlp_bias;
  mo.act = c.hidden_act == "gelu"       ? GatedMlpOptions::Act::gelu
           : c.hidden_act == "gelu_new" ? GatedMlpOptions::Act::gelu_tanh
                                        : GatedMlpOptions::Act::silu;
  mo.init = c.init_scheme();
  mo.param = p;
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
  const RMSNormOptions no{.eps = c.norm_eps, .sequence_parallel_enabled = sp, .param = p};
  input_layernorm_ =
      register_module("input_layernorm", std::make_shared<RMSNorm>(c.hidden_size, no));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", std::make_shared<RMSNorm>(c.hidden_size, no));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor LlamaDecoderLayer::forward(const Tensor& h, int64_t position_offset) const {
  Tensor a =
      add(h, hidden_dropout(*dropout_,
                            self_attn_->forward(input_layernorm_->forward(h), position_offset),
                            sequence_parallel_));
  return add(
      a, hidden_dropout(*dropout_, mlp(post_attention_layernorm_->forward(a)), sequence_parallel_));
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

LlamaForCausalLM::LlamaForCausalLM(const ModelConfig& cfg, const ModelPart& part)
    : CausalLM(cfg, llama_family_type(cfg.arch), part) {
  const ModelConfig& c = cfg_;
  const bool sp = sequence_parallel();
  register_decoder_stack(
      "model",
      std::make_shared<DecoderStack>(
          "LlamaModel", c, part_,
          DecoderStackOptions{
              .embedding = "embed_tokens",
              .final_norm = "norm",
              .make_layer = [&c](int64_t l) { return std::make_shared<LlamaDecoderLayer>(c, l); },
              .make_final_norm =
                  [&c, sp] {
                    return std::make_shared<RMSNorm>(c.hidden_size,
                                                     RMSNormOptions{.eps = c.norm_eps,
                                                                    .sequence_parallel_enabled = sp,
                                                                    .param = {c.dtype, c.device}});
                  },
          }));
  register_output_head("lm_head");
}

}  // namespace nxd
