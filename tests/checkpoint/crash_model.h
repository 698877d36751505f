#pragma once
// The model and optimizer crash_saver saves in a loop and crash_test loads back: defined once, so
// the two programs always agree on the sizes.
#include <cstdint>
#include <memory>
#include <vector>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/optim/optimizer.h"

namespace nxd::ckpt {

struct CrashModel {
  static ModelConfig config() {
    ModelConfig c;
    c.vocab_size = 512;
    c.num_layers = 2;
    c.hidden_size = 128;
    c.num_attention_heads = 4;
    c.max_position_embeddings = 32;
    return c;
  }
  static auto param_groups(const CausalLM& m) {
    std::vector<optim::NamedParam> ps;
    for (const auto& [n, t] : m.named_parameters()) ps.push_back({n, t});
    return optim::default_param_groups(ps, 1e-3, 0.0);
  }
  explicit CrashModel(uint64_t seed)
      : model(make_causal_lm(config(), seed)), opt(param_groups(*model)) {}
  std::shared_ptr<CausalLM> model;
  optim::AdamW opt;
};

}  // namespace nxd::ckpt
