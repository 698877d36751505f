// The engine (inference/engine.h) on tiny models: a request's tokens do not depend on its batch
// companions (joining and leaving at random steps, chunked prefill and prefix caching on and
// off), equal CausalLM::generate_batch's, survive preemption under a tiny block pool; prefix cache
// hits, cancel, random requests, batched prefill chunks, other families and dtypes.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine_util.h"
#include "nxd/inference/engine.h"
#include "nxd/layers/models/causal_lm.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::inference;
using namespace nxd::inference::testing;

TEST(Engine, GreedyAndSampledEqualGenerateBatch) {
  auto m = tiny_llama();
  const std::vector<std::vector<int64_t>> prompts = {ids(5, 1), ids(17, 2), ids(9, 3)};
  for (bool sample : {false, true}) {
    SCOPED_TRACE(sample ? "sampled" : "greedy");
    const SamplingParams sp = sample ? sampled(true) : greedy();
    GenerateOptions g;
    g.temperature = sp.temperature, g.top_k = sp.top_k, g.top_p = sp.top_p, g.seed = sp.seed;
    g.max_new_tokens = 20;
    GenerateResult want = m->generate_batch(prompts, g);
    EngineOptions o;
    o.block_size = 4;
    o.max_num_batched_tokens = 8;  // the 17-token prompt is prefilled in three chunks
    Engine e(m, nullptr, o);
    Results res;
    std::vector<int64_t> rid;
    for (const auto& p : prompts) rid.push_back(e.submit(request(p, 20, sp), into(res)));
    e.run_until_idle();
    for (size_t b = 0; b < prompts.size(); ++b) {
      std::vector<int64_t> seq = prompts[b];
      seq.insert(seq.end(), res[rid[b]].ids.begin(), res[rid[b]].ids.end());
      EXPECT_EQ(seq, want.sequences[b]) << "prompt " << b;
      EXPECT_EQ(res[rid[b]].last.finish, FinishReason::length);
      EXPECT_EQ(res[rid[b]].last.completion_tokens, 20);
      EXPECT_EQ(res[rid[b]].last.prompt_tokens, static_cast<int64_t>(prompts[b].size()));
    }
  }
}

// Prompts longer than the attention kernel's block of 64 queries (runtime/kernels/kv_cache.cpp):
// whole in one step and in chunks of 48 that start and end inside a block, the greedy tokens equal
// generate_batch's (one [3, 150] prefill on the contiguous cache).
TEST(Engine, PromptsOverSeveralQueryBlocksEqualGenerateBatch) {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.max_position_embeddings = 192;
  auto m = make_causal_lm(c, 31);
  const std::vector<std::vector<int64_t>> prompts = {ids(150, 11), ids(70, 12), ids(129, 13)};
  GenerateOptions g;
  g.temperature = 0;
  g.max_new_tokens = 12;
  const GenerateResult want = m->generate_batch(prompts, g);
  for (int64_t budget : {512, 48}) {
    SCOPED_TRACE(str("budget ", budget));
    EngineOptions o;
    o.max_num_batched_tokens = budget;
    Engine e(m, nullptr, o);
    Results res;
    std::vector<int64_t> rid;
    for (const auto& p : prompts) rid.push_back(e.submit(request(p, 12, greedy()), into(res)));
    e.run_until_idle();
    for (size_t b = 0; b < prompts.size(); ++b) {
      std::vector<int64_t> seq = prompts[b];
      seq.insert(seq.end(), res[rid[b]].ids.begin(), res[rid[b]].ids.end());
      EXPECT_EQ(seq, want.sequences[b]) << "prompt " << b;
    }
  }
}

TEST(Engine, SameTokensAloneAndBatchedWithCompanionsJoiningAndLeaving) {
  auto m = tiny_llama(11);
  const std::vector<int64_t> prompt = ids(13, 40);
  for (bool sample : {false, true}) {
    const Request target = request(prompt, 24, sample ? sampled() : greedy());
    const std::vector<int64_t> ref = alone(m, target);
    ASSERT_EQ(ref.size(), 24u);
    for (bool chunked : {true, false})
      for (bool prefix : {true, false}) {
        SCOPED_TRACE(str(sample ? "sampled" : "greedy", chunked ? " chunked" : " whole-prefill",
                         prefix ? " prefix-cache" : " no-prefix-cache"));
        EngineOptions o;
        o.block_size = 4;
        o.chunked_prefill = chunked;
        o.prefix_caching = prefix;
        o.max_num_batched_tokens = chunked ? 10 : 40;
        o.max_num_seqs = 8;
        Engine e(m, nullptr, o);
        Results res;
        // 7 companions: random lengths (two share the target's first 8 tokens), random
        // max_tokens, joining at random steps; one is cancelled midway
        RngStream r{uint64_t(chunked * 2 + prefix + 10 * sample), 5};
        struct Join {
          int64_t step;
          Request req;
        };
        std::vector<Join> joins;
        for (int k = 0; k < 7; ++k) {
          std::vector<int64_t> p = ids(3 + int64_t(r.uniform_f64(k) * 30), 100 + k);
          if (k < 2) p.insert(p.begin(), prompt.begin(), prompt.begin() + 8);
          SamplingParams sp = k % 2 ? greedy() : sampled();
          sp.seed = 99 + k;
          joins.push_back({int64_t(r.uniform_f64(50 + k) * 12),
                           request(p, 2 + int64_t(r.uniform_f64(80 + k) * 25), sp)});
        }
        const int64_t target_step = 3, cancel_step = 9;
        int64_t tid = -1, victim = -1;
        for (int64_t step = 0; step < 400; ++step) {
          for (auto& j : joins)
            if (j.step == step) {
              const int64_t id = e.submit(j.req, into(res));
              if (victim < 0) victim = id;
            }
          if (step == target_step) tid = e.submit(target, into(res));
          if (step == cancel_step) e.cancel(victim);
          if (!e.step() && step > 20) break;
        }
        ASSERT_GE(tid, 0);
        EXPECT_EQ(res[tid].ids, ref);
        EXPECT_EQ(res[tid].last.finish, FinishReason::length);
        EXPECT_EQ(e.stats().kv_blocks_used, 0);
        EXPECT_EQ(e.stats().running, 0);
        EXPECT_EQ(static_cast<int64_t>(res.size()), 8);
        if (prefix) {
          EXPECT_GT(e.stats().prefix_hit_tokens, 0);
        }
      }
  }
}

TEST(Engine, PreemptionUnderATinyBlockPoolFinishesEveryRequestWithTheSameTokens) {
  auto m = tiny_llama(3);
  std::vector<Request> reqs;
  for (int k = 0; k < 6; ++k)
    reqs.push_back(request(ids(6 + 2 * k, 200 + k), 14, k % 2 ? sampled() : greedy()));
  for (int mode = 0; mode < 3; ++mode) {
    const bool prefix = mode != 1, chunked = mode != 2;
    SCOPED_TRACE(str(prefix ? "prefix caching" : "no prefix caching",
                     chunked ? ", chunked prefill" : ", whole prefill"));
    EngineOptions o;
    o.block_size = 4;
    o.kv_blocks = 9;  // the largest request needs 7 blocks; all six need 33
    o.prefix_caching = prefix;
    // whole prefill: prompts up to 16 fit the budget, a recompute of up to 29 tokens does not
    // (it is chunked)
    o.chunked_prefill = chunked;
    o.max_num_batched_tokens = chunked ? 512 : 16;
    Engine e(m, nullptr, o);
    Results res;
    std::vector<int64_t> rid;
    for (const auto& r : reqs) rid.push_back(e.submit(r, into(res)));
    e.run_until_idle();
    EXPECT_GT(e.stats().preemptions, 0);
    std::printf("    [mode %d] 6 requests on 9 blocks: %lld preemptions, %lld steps\n", mode,
                (long long)e.stats().preemptions, (long long)e.stats().steps);
    for (size_t k = 0; k < reqs.size(); ++k) {
      EXPECT_EQ(res[rid[k]].last.finish, FinishReason::length) << "request " << k;
      EXPECT_EQ(res[rid[k]].ids, alone(m, reqs[k])) << "request " << k;
    }
    EXPECT_EQ(e.stats().kv_blocks_used, 0);
  }
}

TEST(Engine, SharedPrefixHitsTheCacheAndRequestsThatCanNeverFitAreRefused) {
  auto m = tiny_llama(5);
  EngineOptions o;
  o.block_size = 4;
  o.kv_blocks = 12;
  Engine e(m, nullptr, o);
  Results res;
  std::vector<int64_t> a = ids(19, 7), b = a;
  b.resize(16);
  b.push_back(3), b.push_back(4);
  const int64_t ia = e.submit(request(a, 4, greedy()), into(res));
  e.run_until_idle();
  EXPECT_EQ(res[ia].last.cached_prompt_tokens, 0);
  const int64_t ib = e.submit(request(b, 4, greedy()), into(res));
  e.run_until_idle();
  EXPECT_EQ(res[ib].last.cached_prompt_tokens, 16);  // four full blocks of a's prompt
  const EngineStats s = e.stats();
  EXPECT_EQ(s.prefix_hit_tokens, 16);
  EXPECT_EQ(s.prefix_query_tokens, 19 + 18);
  EXPECT_EQ(res[ib].ids, alone(m, request(b, 4, greedy()), [] {
              EngineOptions x;
              x.prefix_caching = false;
              return x;
            }()));
  // 12 blocks of 4 hold 48 positions: prompt 40 + max_tokens 20 needs 59
  const std::string msg = expect_invalid(e, request(ids(40, 1), 20, greedy()));
  EXPECT_NE(msg.find("needs 15 KV blocks of 4 positions"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the cache has 12"), std::string::npos) << msg;
}

TEST(Engine, CancelFreesBlocksAndReportsCancelled) {
  auto m = tiny_llama(6);
  EngineOptions o;
  o.block_size = 4;
  Engine e(m, nullptr, o);
  Results res;
  const int64_t id = e.submit(request(ids(20, 3), 40, greedy()), into(res));
  const int64_t waiting = e.submit(request(ids(5, 3), 40, greedy()), into(res));
  for (int i = 0; i < 3; ++i) e.step();
  EXPECT_GT(e.stats().kv_blocks_used, 5);
  e.cancel(id);
  e.cancel(waiting);
  e.cancel(12345);  // unknown: ignored
  e.step();
  EXPECT_EQ(res[id].last.finish, FinishReason::cancelled);
  EXPECT_EQ(res[waiting].last.finish, FinishReason::cancelled);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  EXPECT_EQ(e.stats().running, 0);
  EXPECT_FALSE(e.step());
}

TEST(Engine, Bf16ModelAloneEqualsGenerate) {  // the paged bf16 cache against the contiguous one
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.max_position_embeddings = 64;
  c.dtype = DType::bf16;
  auto m = make_causal_lm(c, 12);
  for (uint64_t k = 0; k < 3; ++k) {
    const auto prompt = ids(4 + 9 * k, 60 + k);
    GenerateOptions g;
    g.temperature = 0;
    g.max_new_tokens = 15;
    std::vector<int64_t> want = m->generate(prompt, g);
    want.erase(want.begin(), want.begin() + prompt.size());
    EXPECT_EQ(alone(m, request(prompt, 15, greedy())), want) << "prompt " << k;
  }
}

// Random requests (lengths, sampling knobs, stop rules), random cancels and a throwing callback
// on a small pool: every request gets exactly one final Output, the counts add up, and every
// block is free at the end.
TEST(Engine, RandomRequestsAndCancelsOnASmallPoolAllFinishCleanly) {
  auto m = tiny_llama(13);
  EngineOptions o;
  o.block_size = 4;
  o.kv_blocks = 20;
  o.max_num_seqs = 6;
  o.max_num_batched_tokens = 9;
  o.eos_token_ids = {5};
  o.max_waiting = 1000;
  Engine e(m, nullptr, o);
  RngStream r{2024, 9};
  uint64_t draw = 0;
  auto u = [&] { return r.uniform_f64(draw++); };
  std::map<int64_t, int> finals;
  std::map<int64_t, int64_t> tokens;
  std::vector<int64_t> live;
  int64_t submitted = 0, thrower = -1;
  for (int step = 0; step < 3000 && (submitted < 120 || e.step()); ++step) {
    if (submitted < 120 && u() < 0.5) {
      Request q = request(ids(1 + int64_t(u() * 40), 500 + submitted), 1 + int64_t(u() * 30));
      q.sampling.temperature = u() < 0.3 ? 0.0 : 0.5 + u();
      q.sampling.top_k = int64_t(u() * 10);
      q.sampling.top_p = 0.5 + 0.5 * u();
      q.sampling.min_p = u() * 0.2;
      q.sampling.repetition_penalty = 0.8 + 0.4 * u();
      q.sampling.seed = submitted;
      q.stop.ignore_eos = u() < 0.2;
      if (u() < 0.2) q.stop.stop_token_ids = {int64_t(u() * 64)};
      const bool throws = submitted == 17;
      const int64_t id = e.submit(q, [&, throws](const Output& out) {
        tokens[out.request_id] += static_cast<int64_t>(out.ids.size());
        if (out.finish != FinishReason::none) {
          ++finals[out.request_id];
          EXPECT_EQ(out.completion_tokens, tokens[out.request_id]);
        }
        if (throws) throw std::runtime_error("client went away");
      });
      if (throws) thrower = id;
      live.push_back(id);
      ++submitted;
    }
    if (!live.empty() && u() < 0.05) e.cancel(live[size_t(u() * live.size())]);
    if (submitted < 120) e.step();
  }
  e.run_until_idle();
  EXPECT_EQ(submitted, 120);
  for (int64_t id : live) {
    if (id != thrower) {
      EXPECT_EQ(finals[id], 1) << "request " << id;
    }
  }
  EXPECT_LE(finals[thrower], 1);  // its callback threw at its first token: cancelled quietly
  const EngineStats s = e.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  std::printf(
      "    120 random requests on 20 blocks: %lld steps, %lld preemptions, %lld of %lld "
      "prompt tokens from the prefix cache\n",
      (long long)s.steps, (long long)s.preemptions, (long long)s.prefix_hit_tokens,
      (long long)s.prefix_query_tokens);
}

TEST(Engine, PrefillChunksOfSimilarLengthRunAsOneBatch) {
  auto m = tiny_llama(14);
  std::vector<Request> reqs;
  for (int k = 0; k < 4; ++k) reqs.push_back(request(ids(k == 3 ? 2 : 12, 70 + k), 5, greedy()));
  EngineOptions o;
  o.prefill_calls = PrefillCalls::batched;  // the default is a call per request
  Engine e(m, nullptr, o);
  Results res;
  std::vector<int64_t> rid;
  for (const auto& r : reqs) rid.push_back(e.submit(r, into(res)));
  e.step();
  // 12, 12, 12 in one [3, 12] call (no padding); 2 would pad 10 of 38 tokens (over a quarter):
  // alone
  EXPECT_EQ(e.stats().model_calls, 2);
  e.step();
  EXPECT_EQ(e.stats().model_calls, 3);  // four decode rows: one call
  e.run_until_idle();
  for (size_t k = 0; k < reqs.size(); ++k) EXPECT_EQ(res[rid[k]].ids, alone(m, reqs[k])) << k;
}

TEST(Engine, GptNeoXAndMoeLlamaEqualGenerate) {  // partial rotary; a mixture-of-experts MLP
  for (std::string arch : {"gpt_neox", "moe"}) {
    SCOPED_TRACE(arch);
    ModelConfig c = nxd::testing::tiny_model(arch == "moe" ? "llama" : arch);
    c.max_position_embeddings = 64;
    if (arch == "moe") {
      c.moe.num_experts = 4;
      c.moe.top_k = 2;
    }
    auto m = make_causal_lm(c, 15);
    const std::vector<std::vector<int64_t>> prompts = {ids(7, 80), ids(19, 81)};
    GenerateOptions g;
    g.temperature = 0;
    g.max_new_tokens = 10;
    EngineOptions o;
    o.block_size = 4;
    o.max_num_batched_tokens = 8;
    for (const auto& p : prompts) {
      std::vector<int64_t> want = m->generate(p, g);
      want.erase(want.begin(), want.begin() + p.size());
      EXPECT_EQ(alone(m, request(p, 10, greedy()), o), want);
    }
  }
}

// A sliding-window model (Mistral's attention): the engine returns each sequence's blocks that no
// later query reads while it runs, so a long generation holds about window / block_size blocks,
// and every token (greedy and sampled, with prefix caching and chunked prefill on and off) is
// generate_batch's, whose contiguous cache keeps every position.
TEST(Engine, ASlidingWindowRollsTheCacheAndKeepsTheTokens) {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.max_position_embeddings = 64;
  c.sliding_window = 6;
  auto m = make_causal_lm(c, 21);
  const std::vector<std::vector<int64_t>> prompts = {ids(5, 31), ids(19, 32)};
  for (bool sample : {false, true})
    for (bool prefix : {true, false}) {
      SCOPED_TRACE(str(sample ? "sampled" : "greedy", prefix ? " prefix-cache" : ""));
      const SamplingParams sp = sample ? sampled(true) : greedy();
      GenerateOptions g;
      g.temperature = sp.temperature, g.top_k = sp.top_k, g.top_p = sp.top_p, g.seed = sp.seed;
      g.max_new_tokens = 36;
      GenerateResult want = m->generate_batch(prompts, g);
      EngineOptions o;
      o.block_size = 4;
      o.prefix_caching = prefix;
      o.max_num_batched_tokens = 8;
      Engine e(m, nullptr, o);
      Results res;
      std::vector<int64_t> rid;
      for (const auto& p : prompts) rid.push_back(e.submit(request(p, 36, sp), into(res)));
      int64_t most = 0;
      while (e.stats().running + e.stats().waiting > 0 || e.stats().steps == 0) {
        e.step();
        most = std::max(most, e.stats().kv_blocks_used);
      }
      // per sequence: the window's 6 positions span at most 3 blocks, plus the block a chunk of
      // up to 8 writes into beyond them (2 more) and, with prefix caching, the last registered
      // block kept for the hash chain; the 19 + 36 positions would need 14 blocks unrolled
      std::printf("    [%s%s] most blocks held %lld, returned early %lld\n",
                  sample ? "sampled" : "greedy", prefix ? ", prefix caching" : "", (long long)most,
                  (long long)e.stats().kv_blocks_rolled);
      EXPECT_LE(most, 2 * 6);
      EXPECT_GT(e.stats().kv_blocks_rolled, 10);
      EXPECT_EQ(e.stats().kv_blocks_used, 0);
      for (size_t b = 0; b < prompts.size(); ++b) {
        std::vector<int64_t> seq = prompts[b];
        seq.insert(seq.end(), res[rid[b]].ids.begin(), res[rid[b]].ids.end());
        EXPECT_EQ(seq, want.sequences[b]) << "prompt " << b;
      }
    }
}

// long_prefill_token_threshold: a long prompt prefills at most that many tokens a step, so each
// step that carries its chunk is short, and the running request's tokens are unchanged.
TEST(Engine, LongPrefillTokenThresholdCapsEachStepsChunkAndKeepsTheTokens) {
  auto m = tiny_llama(23);
  const Request shortr = request(ids(4, 51), 20, greedy());
  const Request longr = request(ids(40, 52), 4, greedy());
  EngineOptions o;
  o.block_size = 4;
  o.max_num_batched_tokens = 64;
  o.long_prefill_token_threshold = 8;
  Engine e(m, nullptr, o);
  Results res;
  const int64_t a = e.submit(shortr, into(res));
  e.step();  // the short prompt's prefill
  const int64_t b = e.submit(longr, into(res));
  int64_t steps_with_long_prefill = 0;
  while (res[b].ids.empty()) {
    e.step();
    ++steps_with_long_prefill;
  }
  // 40 prompt tokens at most 8 a step: five steps before its first token (one without the cap)
  EXPECT_EQ(steps_with_long_prefill, 5);
  e.run_until_idle();
  EXPECT_EQ(res[a].ids, alone(m, shortr));
  EXPECT_EQ(res[b].ids, alone(m, longr));
  EngineOptions bad = o;
  bad.long_prefill_token_threshold = -1;
  EXPECT_THROW(Engine(m, nullptr, bad), InvalidArgument);
}

// A decode step of 16 running requests on a model whose linear layers and head take the few-rows
// kernel (runtime/gemv_f32.h: every weight has >= 2^16 elements): each request's logprobs are
// bitwise those it gets alone, so the 16-row products give each row the bits of a one-row product.
// Each request joins at its own step, so its prefill runs as its own [1, S] call as alone.
TEST(Engine, SixteenDecodeRowsGiveEachRequestTheBitsItGetsAlone) {
  expect_each_request_alone(make_causal_lm(few_rows_llama(), 5), 16);
}
