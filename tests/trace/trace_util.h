#pragma once
// Shared by the trace tests: tiny Llama / GPT-NeoX configs, a model_fn building them, and the
// eager logits at TP n (rank 0's, from sim ranks or the processes of an mpirun).
#include <memory>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/trace/model.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

namespace nxd::testing {

// (mistral and qwen3: the tiny Llama with a sliding window of 4, or q_norm/k_norm)
inline ModelConfig trace_config(const std::string& arch, int tp) {
  ModelConfig c = tiny_model(arch == "gpt_neox" ? arch : "llama");
  c.arch = arch;
  c.sliding_window = arch == "mistral" ? 4 : 0;
  c.qk_norm = arch == "qwen3";
  c.max_position_embeddings = 64;
  if (arch != "gpt_neox" && tp > 2) c.kv_size_multiplier = tp / 2;
  return c;
}

// Builds the model on the current rank (parallel_state already set up), in eval mode.
inline trace::ModelFn causal_lm_fn(const ModelConfig& cfg, uint64_t seed = 7) {
  return [cfg, seed] {
    std::shared_ptr<CausalLM> m = make_causal_lm(cfg, seed);
    m->eval();
    trace::RankModel rm;
    rm.params = m->named_parameters();
    rm.forward = [m](const std::vector<Tensor>& a) {
      return std::vector<Tensor>{m->forward(a[0])};
    };
    rm.owner = m;
    return rm;
  };
}

// ids [B,S] in [0, vocab) from a fixed stream.
inline Tensor trace_ids(int64_t B, int64_t S, int64_t vocab, uint64_t stream = 1) {
  std::vector<int64_t> v(static_cast<size_t>(B * S));
  RngStream s{11, stream};
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * vocab);
  return from_vector<int64_t>(v, {B, S});
}

}  // namespace nxd::testing
