#pragma once
// CausalLM: a decoder-only language model (ids -> next-token logits), its loss, and generation.
// The families are in llama.h and gpt_neox.h; make_causal_lm builds one from a ModelConfig.
#include <cstdint>
#include <memory>
#include <vector>

#include "nxd/autograd/ops.h"
#include "nxd/layers/models/config.h"
#include "nxd/layers/module.h"

namespace nxd {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;   // 0 = greedy (argmax, first on ties)
  int64_t top_k = 0;          // > 0: sample among the k most likely tokens only
  uint64_t seed = 0;          // sampling draws from RngStream{seed, stream_id("nxd.generate")}
  int64_t eos_token_id = -1;  // >= 0: stop after generating it
};

class CausalLM : public Module {
 public:
  explicit CausalLM(const ModelConfig& cfg, std::string type_name);
  const ModelConfig& config() const { return cfg_; }

  // ids [B,S] i32/i64 -> final hidden states [B,S,hidden] (after the final norm). Positions are
  // position_offset + [0, S); S + position_offset must not exceed max_position_embeddings.
  virtual Tensor hidden_states(const Tensor& ids, int64_t position_offset = 0) = 0;
  // [..., hidden] -> logits [..., vocab] (the output head).
  virtual Tensor lm_head(const Tensor& hidden) = 0;
  // ids [B,S] -> logits [B,S,V].
  virtual Tensor forward(const Tensor& ids) { return lm_head(hidden_states(ids)); }

  // Cross entropy of forward(ids) against targets [B,S] (already shifted by the caller): the mean
  // over targets != opts.ignore_index by default.
  Tensor loss(const Tensor& ids, const Tensor& targets, const CrossEntropyOptions& opts = {});

  // prompt followed by up to max_new_tokens generated ids. Runs without a graph and in eval mode
  // (the mode is restored). No KV cache: each token reruns the model on the last
  // max_position_embeddings ids, computing the head only for the last position.
  std::vector<int64_t> generate(const std::vector<int64_t>& prompt, const GenerateOptions& opts);

 protected:
  void check_ids(const Tensor& ids, int64_t position_offset) const;
  ModelConfig cfg_;
};

// Picks the next token from one row of logits (exposed for tests): greedy when temperature == 0,
// else softmax(logits / temperature) restricted to the top_k largest (ties by lower id), sampled
// with the uniform number u in [0, 1).
int64_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k,
                     double u);

// Validates cfg (ConfigError) and builds the model of cfg.arch, parameters initialized by name
// from `seed`.
std::shared_ptr<CausalLM> make_causal_lm(const ModelConfig& cfg, uint64_t seed);

}  // namespace nxd
