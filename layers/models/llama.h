#pragma once
// Llama (Hugging Face LlamaForCausalLM: same math, same parameter names and layouts).
//
//   h_0 = E[ids]                                              E = model.embed_tokens.weight [V,d]
//   for each layer l (model.layers.l.*):
//     a   = h + o_proj(Attn(input_layernorm(h)))               grouped-query, rotary on all of D
//     h   = a + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_attention_layernorm(a)
//   logits = lm_head(norm(h_L))             lm_head.weight [V,d], or E when tie_word_embeddings
//
//   RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w;  Attn as CausalSelfAttention
//   (layers/transformer.h): q/k/v/o_proj without biases, H = num_attention_heads, Hkv =
//   num_kv_heads, D = hidden / H, rotary pairs (i, i + D/2) with angle pos * rope_theta^(-2i/D).
// With tied embeddings there is no lm_head.weight parameter (HF drops it from checkpoints too).
//
// Tensor parallelism (causal_lm.h): q/k/v_proj GQAQKVColumnParallelLinear with K/V replicated
// cfg.kv_size_multiplier times, o_proj row-parallel, gate/up_proj column-parallel, down_proj
// row-parallel, embed_tokens ParallelEmbedding (vocab), lm_head column-parallel (vocab),
// the norms RMSNorm (sequence_parallel_enabled under SP). At TP 1 these are the plain layers.
//
// Mixture of experts (cfg.moe enabled; arch "mixtral" is this class with type name
// MixtralForCausalLM): layer l's MLP is a MoeMlp named block_sparse_moe (Mixtral's names: gate,
// experts.E.w1/w2/w3) when cfg.moe.is_moe_layer(l), over the expert-parallel group
// (moe_expert_parallel_group()). Under TP the experts are not split: every TP rank runs them on the
// full hidden states (no sequence parallelism).
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/moe/moe.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/transformer.h"

namespace nxd {

class LlamaDecoderLayer : public DecoderLayer {
 public:
  // layer: the layer's index in the whole model (decides whether its MLP is a MoE).
  explicit LlamaDecoderLayer(const ModelConfig& cfg, int64_t layer = 0);
  Tensor forward(const Tensor& h, int64_t position_offset = 0) const override;
  Tensor forward_cached(const Tensor& h, const CacheStep& step, const Tensor& k_cache,
                        const Tensor& v_cache) const override;
  const CausalSelfAttention& self_attn() const { return *self_attn_; }
  const MoeMlp* moe() const { return moe_.get(); }  // null on a dense layer

 private:
  Tensor mlp(const Tensor& x) const;  // the dense or MoE MLP
  std::shared_ptr<RMSNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<CausalSelfAttention> self_attn_;
  std::shared_ptr<GatedMlp> mlp_;
  std::shared_ptr<MoeMlp> moe_;  // instead of mlp_ on a MoE layer
  std::shared_ptr<Dropout> dropout_;
  bool sequence_parallel_ = false;
};

// The whole model: model.{embed_tokens, layers, norm} (a DecoderStack, type LlamaModel) and
// lm_head.
class LlamaForCausalLM : public CausalLM {
 public:
  explicit LlamaForCausalLM(const ModelConfig& cfg, const ModelPart& part = {});
};

}  // namespace nxd
