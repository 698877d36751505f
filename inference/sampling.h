#pragma once
// Per-request sampling of the next token from one row of logits (engine.h's SamplingParams):
// penalties, temperature, top-k, top-p, min-p, one uniform draw, logprobs.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "nxd/inference/engine.h"
#include "nxd/layers/models/causal_lm.h"

namespace nxd::inference {

// Validates p (InvalidArgument naming the field and its value) for a vocabulary of `vocab` ids.
void check_sampling(const SamplingParams& p, int64_t vocab);

// How often each id occurs in a request's prompt and in its generated ids (the penalties' input).
struct TokenCounts {
  std::unordered_map<int64_t, int64_t> prompt, generated;
  void add_prompt(int64_t id) { ++prompt[id]; }
  void add_generated(int64_t id) { ++generated[id]; }
};

struct Sample {
  int64_t id = 0;
  TokenLogprob chosen;            // when p.logprobs >= 0
  std::vector<TokenLogprob> top;  // the p.logprobs most likely, decreasing (ties: lower id)
};

// The next token from logits (the model's row, length V) with the uniform draw u in [0, 1):
//  1. repetition_penalty r over the ids of prompt + generated (logit > 0: / r, else * r);
//     frequency and presence penalties over the generated ids (logit -= f * count + p);
//  2. temperature 0: argmax (lowest id on ties); else softmax(logits / T);
//  3. top_k, then top_p (the most likely ids, decreasing, ties by lower id, up to and including
//     the first whose cumulative probability reaches top_p), then min_p (ids with probability
//     >= min_p * the largest); renormalized, and u picks in that order.
// Logprobs are the model's: log_softmax of the raw logits (before penalties and temperature), as
// vLLM returns by default.
Sample sample_next(const std::vector<double>& logits, const SamplingParams& p,
                   const TokenCounts& counts, double u);
// Steps 1-3's distribution: the kept ids in the order u walks them, their weights (greedy: the
// first argmax alone); sample_next(...).id == next_distribution(...).draw(u), bitwise. Speculative
// decoding's acceptance rule compares the target's and the draft's (speculative.cpp).
TokenDistribution next_distribution(const std::vector<double>& logits, const SamplingParams& p,
                                    const TokenCounts& counts);
// The logprobs of s.id and the n most likely (n < 0: none) from the raw logits, as sample_next.
void add_logprobs(Sample& s, const std::vector<double>& logits, int64_t n);

}  // namespace nxd::inference
