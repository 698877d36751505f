#pragma once
// The engine tests' helpers: tiny Llama models, requests, and the Outputs collected per request.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nxd/inference/engine.h"
#include "nxd/layers/models/causal_lm.h"
#include "support/tiny_models.h"

namespace nxd::inference::testing {

inline std::shared_ptr<CausalLM> tiny_llama(uint64_t seed = 7) {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.max_position_embeddings = 64;
  return make_causal_lm(c, seed);
}

// A Llama whose every linear layer and head has at least 2^16 weights, so that a decode step's
// products of up to 32 rows take the few-rows kernels (runtime/gemv_f32.h).
inline ModelConfig few_rows_llama() {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.num_kv_heads = 4;
  c.ffn_hidden_size = 512;
  c.vocab_size = 256;
  c.max_position_embeddings = 128;
  c.init_std = 0.02;
  return c;
}

inline std::vector<int64_t> ids(int64_t n, uint64_t seed) {
  return nxd::testing::id_sequence(n, 64, seed);
}

struct Got {
  std::vector<int64_t> ids;
  std::string text;
  std::vector<TokenLogprob> chosen;
  std::vector<std::vector<TokenLogprob>> top;
  Output last;
  int outputs = 0;
};
using Results = std::map<int64_t, Got>;

inline OutputCallback into(Results& r) {
  return [&r](const Output& o) {
    Got& g = r[o.request_id];
    EXPECT_EQ(g.last.finish, FinishReason::none) << "an Output after the final one";
    g.ids.insert(g.ids.end(), o.ids.begin(), o.ids.end());
    g.text += o.text;
    g.chosen.insert(g.chosen.end(), o.chosen.begin(), o.chosen.end());
    g.top.insert(g.top.end(), o.top.begin(), o.top.end());
    g.last = o;
    ++g.outputs;
  };
}

inline Request request(std::vector<int64_t> prompt, int64_t max_tokens, SamplingParams sp = {}) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling = sp;
  r.stop.max_tokens = max_tokens;
  return r;
}

inline SamplingParams greedy() {
  SamplingParams s;
  s.temperature = 0;
  return s;
}

inline SamplingParams sampled(bool only_generate_batch_knobs = false) {
  SamplingParams s;
  s.temperature = 0.9;
  s.top_k = 24;
  s.top_p = 0.95;
  s.seed = 1234;
  if (!only_generate_batch_knobs) {
    s.min_p = 0.02;
    s.repetition_penalty = 1.1;
    s.presence_penalty = 0.3;
    s.frequency_penalty = 0.2;
  }
  return s;
}

// The generated ids of r run alone in a fresh engine.
inline std::vector<int64_t> alone(const std::shared_ptr<CausalLM>& m, const Request& r,
                                  EngineOptions o = {}) {
  Engine e(m, nullptr, o);
  Results res;
  const int64_t id = e.submit(r, into(res));
  e.run_until_idle();
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  return res[id].ids;
}

// `n` requests (greedy and seeded-sampled in turn, logprobs on) join one per step, so each prefill
// runs as its own call, as it does alone; then all n decode together. Each request's tokens and
// chosen logprobs must be bitwise those of an engine of its own.
inline void expect_each_request_alone(const std::shared_ptr<CausalLM>& m, int n) {
  const int64_t vocab = m->config().vocab_size;
  std::vector<Request> reqs;
  for (int b = 0; b < n; ++b) {
    SamplingParams sp = b % 2 ? greedy() : sampled();
    sp.seed = 7 + b;
    sp.logprobs = 0;
    // n + 8 tokens: the first request still decodes when the last joins
    reqs.push_back(request(nxd::testing::id_sequence(2 + 3 * (b % 16), vocab, 300 + b), n + 8, sp));
  }
  EngineOptions o;
  o.max_num_seqs = n;
  Engine e(m, nullptr, o);
  Results res;
  std::vector<int64_t> rid;
  int64_t widest = 0;
  for (int64_t step = 0; step < 400; ++step) {
    if (step < n) rid.push_back(e.submit(reqs[step], into(res)));
    if (!e.step()) break;
    widest = std::max(widest, e.stats().running);
  }
  EXPECT_EQ(widest, n);  // all decoded together
  int differ = 0;
  for (int b = 0; b < n; ++b) {
    Engine one(m, nullptr, o);
    Results r1;
    const int64_t id = one.submit(reqs[b], into(r1));
    one.run_until_idle();
    const Got &got = res[rid[b]], &want = r1[id];
    bool same = got.ids == want.ids && got.chosen.size() == want.chosen.size();
    for (size_t t = 0; same && t < want.chosen.size(); ++t)
      if (std::memcmp(&got.chosen[t].logprob, &want.chosen[t].logprob, sizeof(double)) != 0) {
        same = false;
        ADD_FAILURE() << "request " << b << " token " << t << ": logprob " << got.chosen[t].logprob
                      << " batched, " << want.chosen[t].logprob << " alone";
      }
    if (!same) ++differ;
    EXPECT_EQ(got.ids, want.ids) << "request " << b;
  }
  std::printf("    %d requests decoding together: %d differ from alone\n", n, differ);
}

// Speculative decoding: a draft unrelated to tiny_llama (1 layer, hidden 16: it proposes tokens
// the model mostly rejects), and options with a draft proposing k tokens.
inline std::shared_ptr<CausalLM> unrelated_draft() {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.max_position_embeddings = 64;
  c.num_layers = 1;
  c.hidden_size = 16;
  c.ffn_hidden_size = 24;
  return make_causal_lm(c, 99);
}

inline EngineOptions spec(std::shared_ptr<CausalLM> draft, int64_t k) {
  EngineOptions o;
  o.block_size = 4;
  o.draft_model = std::move(draft);
  o.speculate_k = k;
  return o;
}

// The sampled-distribution check: n requests of one 5-token prompt, 3 tokens each at temperature
// 0.5 without filters, seeds seed0, seed0 + 1, ...; options taking them all at once.
inline std::vector<Request> seeded_requests(int64_t n, uint64_t seed0) {
  SamplingParams sp = sampled(/*only_generate_batch_knobs=*/true);
  sp.top_k = 0, sp.top_p = 1.0, sp.temperature = 0.5;
  std::vector<Request> reqs;
  for (int64_t i = 0; i < n; ++i) {
    sp.seed = seed0 + i;
    reqs.push_back(request(ids(5, 8), 3, sp));
  }
  return reqs;
}
inline EngineOptions for_many(EngineOptions o, int64_t n) {
  o.max_num_seqs = 64;
  o.max_num_batched_tokens = 4096;
  o.max_waiting = n;
  return o;
}

// Submits reqs to e (rank 0's at TP > 1) and runs it until idle: each request's ids, in order.
inline std::vector<std::vector<int64_t>> run_requests(Engine& e, const std::vector<Request>& reqs) {
  Results res;
  std::vector<int64_t> rid;
  for (const auto& r : reqs) rid.push_back(e.submit(r, into(res)));
  e.run_until_idle();
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  std::vector<std::vector<int64_t>> out;
  for (int64_t id : rid) out.push_back(res[id].ids);
  return out;
}

// How often each id is token t of the requests' ids, over a vocabulary of v.
inline std::vector<double> frequencies(const std::vector<std::vector<int64_t>>& got, size_t t,
                                       int64_t v) {
  std::vector<double> f(v, 0.0);
  for (const auto& g : got) f[g.at(t)] += 1.0 / double(got.size());
  return f;
}

inline double total_variation(const std::vector<double>& a, const std::vector<double>& b) {
  double t = 0;
  for (size_t i = 0; i < a.size(); ++i) t += std::abs(a[i] - b[i]) / 2;
  return t;
}

inline std::string expect_invalid(Engine& e, const Request& r) {
  try {
    e.submit(r, nullptr);
  } catch (const InvalidArgument& x) {
    return x.what();
  }
  ADD_FAILURE() << "no InvalidArgument";
  return "";
}

}  // namespace nxd::inference::testing
