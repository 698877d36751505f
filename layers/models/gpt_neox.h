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
// embed_out column-parallel (vocab), LayerNorms ParallelLayerNorm (sequence_parallel_enabled under
// SP).
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/transformer.h"

namespace nxd {

class GPTNeoXLayer : public Module {
 public:
  explicit GPTNeoXLayer(const ModelConfig& cfg);
  Tensor forward(const Tensor& h, int64_t position_offset = 0) const;
  // The KV-cache path (kv_cache.h): this layer's K/V cache tensors written in place.
  Tensor forward_cached(const Tensor& h, const CacheStep& step, const Tensor& k_cache,
                        const Tensor& v_cache) const;

 private:
  bool parallel_residual_;
  std::shared_ptr<ParallelLayerNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<Dropout> post_attention_dropout_, post_mlp_dropout_;
  std::shared_ptr<CausalSelfAttention> attention_;
  std::shared_ptr<Mlp> mlp_;
  bool sp_ = false;
};

// The body: gpt_neox.{embed_in, layers, final_layer_norm}. Built for
// model_tensor_parallel_size(); under sequence parallelism forward returns this rank's sequence
// shard.
class GPTNeoXModel : public Module {
 public:
  explicit GPTNeoXModel(const ModelConfig& cfg, const ModelPart& part = {});
  Tensor forward(const Tensor& ids, int64_t position_offset = 0) const;
  Tensor embed(const Tensor& ids) const;  // with the embedding dropout
  Tensor run_layers(const Tensor& h, int64_t position_offset = 0) const;
  Tensor run_layers_cached(const Tensor& h, const CacheStep& step, KVCache& cache) const;
  Tensor final_norm(const Tensor& h) const;
  // embed_in.weight (this rank's vocabulary rows at TP > 1).
  const Tensor& embed_in_weight() const { return embed_weight_; }
  const std::shared_ptr<ModuleList>& layers() const { return layers_; }

 private:
  std::shared_ptr<Embedding> embed_in_;           // TP == 1
  std::shared_ptr<ParallelEmbedding> pembed_in_;  // TP > 1
  Tensor embed_weight_;
  std::shared_ptr<Dropout> emb_dropout_;
  std::shared_ptr<ModuleList> layers_;
  std::shared_ptr<ParallelLayerNorm> final_layer_norm_;
  bool sp_ = false;
  bool full_checkpoint_ = false;
};

class GPTNeoXForCausalLM : public CausalLM {
 public:
  explicit GPTNeoXForCausalLM(const ModelConfig& cfg, const ModelPart& part = {});
  const std::shared_ptr<GPTNeoXModel>& gpt_neox() const { return gpt_neox_; }

 protected:
  Tensor embed_tokens(const Tensor& ids) override { return gpt_neox_->embed(ids); }
  Tensor run_layers(const Tensor& h, int64_t position_offset) override {
    return gpt_neox_->run_layers(h, position_offset);
  }
  Tensor final_norm(const Tensor& h) override { return gpt_neox_->final_norm(h); }
  bool supports_kv_cache() const override { return true; }
  Tensor run_layers_cached(const Tensor& h, const CacheStep& step, KVCache& cache) override {
    return gpt_neox_->run_layers_cached(h, step, cache);
  }
  const Tensor& embedding_weight() const override { return gpt_neox_->embed_in_weight(); }

 private:
  std::shared_ptr<GPTNeoXModel> gpt_neox_;
};

}  // namespace nxd
