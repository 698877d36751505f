#pragma once
// A third architecture on nxd's trainer, outside the library: GPT-2 (learned positions, pre-norm
// blocks, tanh GELU, no rotary; GPT-2's names), tensor-parallel through nxd's attention and MLP,
// and pipeline-parallel: built from a ModelPart, a stage holds only its own pieces.
#include <memory>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/transformer.h"
#include "nxd/train_app/lm_module.h"

namespace gpt2 {
using namespace nxd;

class Block : public Module {
 public:
  explicit Block(const ModelConfig& c) : Module("GPT2Block") {
    const ParamOptions p{c.dtype, c.device};
    AttentionOptions a;
    a.hidden_size = c.hidden_size;
    a.num_heads = c.num_attention_heads;
    a.rotary_dim = 0;  // positions come from wpe
    a.bias = true;
    a.init = c.init_scheme();
    a.param = p;
    MlpOptions m;
    m.gelu = GeluApprox::tanh;
    m.init = c.init_scheme();
    m.param = p;
    const LayerNormOptions no{.eps = c.norm_eps, .param = p};
    ln_1_ = register_module("ln_1", std::make_shared<LayerNorm>(c.hidden_size, no));
    attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(a));
    ln_2_ = register_module("ln_2", std::make_shared<LayerNorm>(c.hidden_size, no));
    mlp_ = register_module("mlp", std::make_shared<Mlp>(c.hidden_size, c.ffn_size(), m));
  }
  Tensor forward(const Tensor& x, int64_t pos) const {
    Tensor h = add(x, attn_->forward(ln_1_->forward(x), pos));
    return add(h, mlp_->forward(ln_2_->forward(h)));
  }

 private:
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Mlp> mlp_;
};

class Body : public Module {  // a pipeline stage's part holds only its pieces (ModelPart)
 public:
  Body(const ModelConfig& c, const ModelPart& part) : Module("GPT2Model") {
    const ParamOptions p{c.dtype, c.device};
    if (part.embedding || (part.head && c.tie_word_embeddings))  // a tied head reads wte
      wte_ = register_module(  // vocabulary-parallel under TP (the tied head uses the shard)
          "wte",
          std::make_shared<ParallelEmbedding>(
              c.vocab_size, c.hidden_size,
              ParallelEmbeddingOptions{.weight_init = c.init_scheme().embedding(), .param = p}));
    if (part.embedding)
      wpe_ = register_module(
          "wpe", std::make_shared<Embedding>(
                     c.max_position_embeddings, c.hidden_size,
                     EmbeddingOptions{.weight_init = ParamInit::normal(0.01), .param = p}));
    h_ = register_module("h", std::make_shared<ModuleList>(part.layer_begin));  // whole-model names
    for (int64_t l = part.layer_begin; l < part.end(c); ++l)
      h_->push_back(std::make_shared<Block>(c));
    if (part.head)
      ln_f_ = register_module(
          "ln_f", std::make_shared<LayerNorm>(c.hidden_size,
                                              LayerNormOptions{.eps = c.norm_eps, .param = p}));
  }
  Tensor embed(const Tensor& ids) const { return wte_->forward(ids); }
  Tensor layers(const Tensor& x, int64_t pos) const {  // + wpe[pos, pos + S) on the first stage
    Tensor h = wpe_ ? add(x, narrow(wpe_->weight(), 0, pos, x.size(1))) : x;
    for (const auto& b : *h_) h = static_cast<const Block&>(*b).forward(h, pos);
    return h;
  }
  Tensor norm(const Tensor& h) const { return ln_f_->forward(h); }
  const Tensor& wte_weight() const {  // undefined on a stage without wte
    static const Tensor none;
    return wte_ ? wte_->weight() : none;
  }

 private:
  std::shared_ptr<ParallelEmbedding> wte_;
  std::shared_ptr<Embedding> wpe_;
  std::shared_ptr<ModuleList> h_;
  std::shared_ptr<LayerNorm> ln_f_;
};

class GPT2LMHeadModel : public CausalLM {
 public:
  explicit GPT2LMHeadModel(const ModelConfig& c, const ModelPart& part = {})
      : CausalLM(c, "GPT2LMHeadModel", part) {
    if (sequence_parallel())  // wpe would need the shard's positions and an SP gradient sum
      throw ConfigError("[gpt2] needs distributed_strategy.sequence_parallel=false");
    body_ = register_module("transformer", std::make_shared<Body>(cfg_, part_));
    register_output_head("lm_head");  // none when tied (GPT-2 ties: model.tie_word_embeddings)
  }

 protected:
  Tensor embed_tokens(const Tensor& ids) override { return body_->embed(ids); }
  Tensor run_layers(const Tensor& h, int64_t pos) override { return body_->layers(h, pos); }
  Tensor final_norm(const Tensor& h) override { return body_->norm(h); }
  const Tensor& embedding_weight() const override { return body_->wte_weight(); }

 private:
  std::shared_ptr<Body> body_;
};

// nxd-train's language-model module with this model: data, optimizer, schedule, logging,
// checkpoints and pipeline stages come from the same configuration keys.
class LMModule : public train_app::CausalLMModule {
 public:
  using CausalLMModule::CausalLMModule;
  std::string transformer_layer_type() const override { return "GPT2Block"; }

 protected:
  std::shared_ptr<CausalLM> build_causal_lm(const ModelConfig& c, uint64_t seed,
                                            const ModelPart& part) override {
    auto m = std::make_shared<GPT2LMHeadModel>(c, part);
    m->init_parameters(seed);
    return m;
  }
};

}  // namespace gpt2
