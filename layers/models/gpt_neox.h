#pragma once
// GPT-NeoX (Hugging Face GPTNeoXForCausalLM: same math, same parameter names and layouts).
//
//   h_0 = E[ids]                                              E = gpt_neox.embed_in.weight [V,d]
//   for each layer l (gpt_neox.layers.l.*), use_parallel_residual (the default, Pythia):
//     h = h + dense(Attn(input_layernorm(h))) + mlp(post_attention_layernorm(h))
//   otherwise (sequential):
//     a = h + dense(Attn(input_layernorm(h)));  h = a + mlp(post_attention_layernorm(a))
//   logits = embed_out(final_layer_norm(h_L))       embed_out.weight [V,d] (or E when tied)
//
//   LayerNorm(x) = (x - mean) / sqrt(var + eps) * w + b (all norms have biases).
//   Attn: query_key_value.{weight [3HD, d], bias}; its output viewed [B,S,H,3D] gives head h's
//   q, k, v as features [0,D), [D,2D), [2D,3D) of the head's block. Rotary on the first
//   r = int(D * rotary_pct) features of q and k (pairs (i, i + r/2), angle pos * theta^(-2i/r));
//   softmax(q k^T / sqrt(D) + causal mask) v, heads merged [B,S,HD], then dense.{weight,bias}.
//   mlp = dense_4h_to_h(gelu(dense_h_to_4h(x))) with biases; gelu is erf-based ("gelu") unless
//   gelu_tanh. No grouped-query attention.
//
// Tensor parallelism (causal_lm.h): query_key_value column-parallel with contiguous rows (HF's
// per-head [q|k|v] layout: rank r owns heads [r*H/tp, (r+1)*H/tp) whole), dense row-parallel,
// dense_h_to_4h column-parallel, dense_4h_to_h row-parallel, embed_in ParallelEmbedding (vocab),
// embed_out column-parallel (vocab), LayerNorms sequence_parallel_enabled under SP. At TP 1 these
// are the plain layers.
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/transformer.h"

namespace nxd {

class GPTNeoXLayer : public DecoderLayer {
 public:
  explicit GPTNeoXLayer(const ModelConfig& cfg);
  Tensor forward(const Tensor& h, int64_t position_offset = 0) const override;
  Tensor forward_cached(const Tensor& h, const CacheStep& step, const Tensor& k_cache,
                        const Tensor& v_cache) const override;

 private:
  bool parallel_residual_;
  std::shared_ptr<LayerNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<Dropout> post_attention_dropout_, post_mlp_dropout_;
  std::shared_ptr<CausalSelfAttention> attention_;
  std::shared_ptr<Mlp> mlp_;
  bool sequence_parallel_ = false;
};

// The whole model: gpt_neox.{embed_in, emb_dropout, layers, final_layer_norm} (a DecoderStack,
// type GPTNeoXModel) and embed_out.
class GPTNeoXForCausalLM : public CausalLM {
 public:
  explicit GPTNeoXForCausalLM(const ModelConfig& cfg, const ModelPart& part = {});
};

}  // namespace nxd
