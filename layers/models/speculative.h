#pragma once
// Speculative decoding with a draft model (Leviathan et al. 2023, "Fast Inference from
// Transformers via Speculative Decoding"; Chen et al. 2023): a smaller model sharing the target's
// vocabulary proposes k tokens one at a time, the target scores all of them in one KV-cache step
// (forward_cached_all over k + 1 positions), and the longest acceptable prefix is kept.
//
// The rule, per proposed token d drawn from the draft's distribution q, against the target's p at
// the same position (both after temperature, top-k and top-p: token_distribution): accept with
// probability min(1, p(d) / q(d)); at the first rejection emit a token drawn from
// max(0, p - q) renormalized and end the round; when all k are accepted, emit one more from the
// target's next distribution. Each emitted token is distributed exactly as the target alone would
// sample it. Greedy (temperature 0) is the special case of one-hot p and q: tokens equal the
// target's own greedy decoding (tests/layers/speculative_test.cpp: Llama and GPT-NeoX, k = 1..8).
//
// Rolled-back tokens cost no copy: the caches are position-addressed (kv_cache.h), so a rejected
// position is simply overwritten by the next step that writes it; each model keeps only the
// length of its valid prefix.
//
// Random numbers: the i-th generated token's draft draw, acceptance test and target draw use
// draw i of three streams of opts.seed ("nxd.speculate.draft", "nxd.speculate.accept",
// "nxd.generate"), so a run is reproducible.
#include <cstdint>
#include <string>
#include <vector>

#include "nxd/layers/models/causal_lm.h"

namespace nxd {

struct SpeculativeOptions {
  int64_t k = 4;  // tokens the draft proposes per round, 1..64
};

struct SpeculativeResult {
  std::vector<int64_t> sequence;  // the prompt followed by the generated ids
  // "max_new_tokens", "eos" or "max_position_embeddings" (as GenerateResult::stop_reasons)
  std::string stop;
  int64_t rounds = 0;       // target verification steps after the prefill
  int64_t proposed = 0;     // draft tokens proposed
  int64_t accepted = 0;     // of those, accepted
  int64_t draft_steps = 0;  // draft forward_cached calls (its prefill included)
  double seconds = 0;       // wall time of the whole generation
  double acceptance_rate() const { return proposed ? double(accepted) / double(proposed) : 0.0; }
};

// One draw of the acceptance rule for a proposed token d ~ q (exposed for tests): d itself when
// u_accept < p(d) / q(d), else a token from max(0, p - q) renormalized (over ids in increasing
// order) with u_residual. p and q come from token_distribution over the same vocabulary.
int64_t speculative_accept(const TokenDistribution& p, const TokenDistribution& q, int64_t d,
                           double u_accept, double u_residual, bool* accepted);

// Generates from `prompt` with `target`, `draft` proposing (both whole models at the same TP, with
// a KV-cache path and the same vocab_size: InvalidArgument naming them otherwise). opts as
// CausalLM::generate_batch (eos_token_id, max_new_tokens, temperature, top_k, top_p, seed); the
// sequence stops at the smaller max_position_embeddings of the two. Runs without a graph in eval
// mode (both models' modes restored).
SpeculativeResult speculative_generate(CausalLM& target, CausalLM& draft,
                                       const std::vector<int64_t>& prompt,
                                       const GenerateOptions& opts,
                                       const SpeculativeOptions& spec = {});

}  // namespace nxd
