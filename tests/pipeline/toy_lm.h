#pragma once
// A user's own CausalLM for the pipeline tests: not a built-in family (arch "toy"), names of its
// own ("tok", "blocks.<l>", "ln_f", "lm_head"), decoder layers of different sizes (block l's MLP
// is (l + 1) x ffn_hidden_size wide), built from a ModelPart as pipeline/pieces.h asks. TP = 1.
#include <memory>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/transformer.h"
#include "support/tiny_models.h"

namespace nxd::testing {

class ToyBlock : public Module {
 public:
  ToyBlock(const ModelConfig& c, int64_t width) : Module("ToyBlock") {
    const ParamOptions p{c.dtype, c.device};
    MlpOptions m;
    m.init = c.init_scheme();
    m.param = p;
    ln_ =
        register_module("ln", std::make_shared<LayerNorm>(
                                  c.hidden_size, LayerNormOptions{.eps = c.norm_eps, .param = p}));
    mlp_ = register_module("mlp", std::make_shared<Mlp>(c.hidden_size, width, m));
  }
  Tensor forward(const Tensor& x) const { return add(x, mlp_->forward(ln_->forward(x))); }

 private:
  std::shared_ptr<LayerNorm> ln_;
  std::shared_ptr<Mlp> mlp_;
};

class ToyLM : public CausalLM {
 public:
  // whole_model_names = false numbers a part's blocks from 0: the mistake pieces.h rejects.
  explicit ToyLM(const ModelConfig& c, const ModelPart& part = {}, bool whole_model_names = true)
      : CausalLM(c, "ToyLM", part) {
    const ParamOptions p{cfg_.dtype, cfg_.device};
    if (part_.embedding || (part_.head && cfg_.tie_word_embeddings))
      tok_ = register_module(
          "tok", std::make_shared<Embedding>(cfg_.vocab_size, cfg_.hidden_size,
                                             EmbeddingOptions{cfg_.init_scheme().embedding(), p}));
    blocks_ = register_module(
        "blocks", std::make_shared<ModuleList>(whole_model_names ? part_.layer_begin : 0));
    for (int64_t l = part_.layer_begin; l < part_.layer_end; ++l)
      blocks_->push_back(std::make_shared<ToyBlock>(cfg_, (l + 1) * cfg_.ffn_size()));
    if (part_.head)
      ln_f_ = register_module(
          "ln_f", std::make_shared<LayerNorm>(cfg_.hidden_size,
                                              LayerNormOptions{.eps = cfg_.norm_eps, .param = p}));
    register_output_head("lm_head");
  }

 protected:
  Tensor embed_tokens(const Tensor& ids) override { return tok_->forward(ids); }
  Tensor run_layers(const Tensor& h, int64_t) override {
    Tensor x = h;
    for (const auto& b : *blocks_) x = static_cast<const ToyBlock&>(*b).forward(x);
    return x;
  }
  Tensor final_norm(const Tensor& h) override { return ln_f_->forward(h); }
  const Tensor& embedding_weight() const override { return tok_->weight(); }

 private:
  std::shared_ptr<Embedding> tok_;
  std::shared_ptr<ModuleList> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
};

inline std::shared_ptr<CausalLM> build_toy(const ModelConfig& c, uint64_t seed,
                                           const ModelPart& part) {
  auto m = std::make_shared<ToyLM>(c, part);
  m->init_parameters(seed);
  return m;
}

// A toy config: 16 wide, 4 heads (unused), MLPs 8, 16, 24, ... wide.
inline ModelConfig toy_config(int64_t layers = 4, int64_t vocab = 32) {
  ModelConfig c = micro_model("toy");
  c.vocab_size = vocab;
  c.num_layers = layers;
  c.ffn_hidden_size = 8;
  return c;
}

}  // namespace nxd::testing
