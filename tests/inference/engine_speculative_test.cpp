// Speculative decoding in the engine: greedy tokens equal the engine's without a draft (alone,
// batched with companions joining and leaving, prefix caching on and off, k = 1, 3, 5; the model
// as its own draft accepts every proposal, an unrelated draft few; under a sliding window too),
// seeded sampling gives the same tokens alone and batched, preemption under a small pool keeps
// the tokens, no block leaks.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine_util.h"

using namespace nxd;
using namespace nxd::inference;
using namespace nxd::inference::testing;

namespace {

// Runs reqs joining at steps 0, 1, 2, ... in one engine; the ids per request.
std::vector<std::vector<int64_t>> batched(const std::shared_ptr<CausalLM>& m,
                                          const std::vector<Request>& reqs, EngineOptions o,
                                          EngineStats* st = nullptr) {
  Engine e(m, nullptr, o);
  Results res;
  std::vector<int64_t> rid;
  for (int64_t step = 0; step < 1000; ++step) {
    if (step < static_cast<int64_t>(reqs.size())) rid.push_back(e.submit(reqs[step], into(res)));
    if (!e.step() && step >= static_cast<int64_t>(reqs.size())) break;
  }
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  EXPECT_EQ(e.stats().running, 0);
  if (st) *st = e.stats();
  std::vector<std::vector<int64_t>> out;
  for (int64_t id : rid) {
    EXPECT_EQ(res[id].last.finish, FinishReason::length) << "request " << id;
    out.push_back(res[id].ids);
  }
  return out;
}

std::vector<Request> mixed_requests(bool sample) {
  std::vector<Request> reqs;
  const std::vector<int64_t> shared = ids(9, 40);
  for (int k = 0; k < 6; ++k) {
    std::vector<int64_t> p = ids(3 + 4 * k, 300 + k);
    if (k < 3) p.insert(p.begin(), shared.begin(), shared.end());  // prefix hits
    SamplingParams sp = sample && k % 2 ? sampled() : greedy();
    sp.seed = 77 + k;
    reqs.push_back(request(p, 5 + 3 * k, sp));
  }
  return reqs;
}

TEST(EngineSpeculative, GreedyTokensEqualTheEngineWithoutADraft) {
  auto m = tiny_llama(11);
  const std::vector<Request> reqs = mixed_requests(false);
  EngineOptions plain;
  plain.block_size = 4;
  const auto ref = batched(m, reqs, plain);
  for (int64_t k : {1, 3, 5})
    for (bool prefix : {true, false})
      for (int draft_kind = 0; draft_kind < 2; ++draft_kind) {
        SCOPED_TRACE(str("k=", k, prefix ? " prefix cache" : " no prefix cache",
                         draft_kind ? " unrelated draft" : " the model as draft"));
        EngineOptions o = spec(draft_kind ? unrelated_draft() : tiny_llama(11), k);
        o.prefix_caching = prefix;
        EngineStats st;
        EXPECT_EQ(batched(m, reqs, o, &st), ref);
        for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(alone(m, reqs[i], o), ref[i]);
        EXPECT_GT(st.spec_proposed, 0);
        if (prefix) EXPECT_GT(st.prefix_hit_tokens, 0);
        std::printf("    k=%lld %s %s: %lld proposed, acceptance %.3f, %lld steps\n", (long long)k,
                    prefix ? "prefix" : "no-prefix", draft_kind ? "unrelated" : "self",
                    (long long)st.spec_proposed, st.acceptance_rate(), (long long)st.steps);
        if (draft_kind == 0)
          EXPECT_EQ(st.acceptance_rate(), 1.0);
        else
          EXPECT_LT(st.acceptance_rate(), 0.5);
      }
}

TEST(EngineSpeculative, SampledRequestsGiveTheSameTokensAloneAndBatched) {
  auto m = tiny_llama(11);
  const std::vector<Request> reqs = mixed_requests(true);
  for (int draft_kind = 0; draft_kind < 2; ++draft_kind) {
    SCOPED_TRACE(draft_kind ? "unrelated draft" : "the model as draft");
    const EngineOptions o = spec(draft_kind ? unrelated_draft() : tiny_llama(11), 3);
    const auto got = batched(m, reqs, o);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(alone(m, reqs[i], o), got[i]) << i;
    // the same seeds twice: the same tokens
    EXPECT_EQ(batched(m, reqs, o), got);
  }
}

// The acceptance rule keeps the model's distribution: over 800 seeds the third token's frequencies
// with an unrelated draft are as close to the model's alone as two samples of one distribution,
// and far from the draft's own.
TEST(EngineSpeculative, SampledTokensFollowTheModelsDistributionNotTheDraftsOne) {
  auto m = tiny_llama(11);
  auto draft = unrelated_draft();
  const int64_t N = 800, V = m->config().vocab_size;
  auto freq = [&](const std::shared_ptr<CausalLM>& model, const EngineOptions& o, uint64_t seed0) {
    Engine e(model, nullptr, for_many(o, N));
    return frequencies(run_requests(e, seeded_requests(N, seed0)), 2, V);
  };
  const auto alone_a = freq(m, {}, 1), alone_b = freq(m, {}, 100000);
  const auto with_draft = freq(m, spec(draft, 2), 1), of_draft = freq(draft, {}, 1);
  const double noise = total_variation(alone_a, alone_b),
               spec_tv = total_variation(with_draft, alone_b),
               draft_tv = total_variation(of_draft, alone_b);
  std::printf(
      "    TV to the model's frequencies: another sample %.3f, speculative %.3f, the "
      "draft's %.3f\n",
      noise, spec_tv, draft_tv);
  EXPECT_LT(spec_tv, 1.5 * noise + 0.02);
  EXPECT_GT(draft_tv, 2 * spec_tv);
}

TEST(EngineSpeculative, PreemptionUnderASmallPoolKeepsTheTokens) {
  auto m = tiny_llama(3);
  std::vector<Request> reqs;
  for (int k = 0; k < 6; ++k) reqs.push_back(request(ids(6 + 2 * k, 200 + k), 14, greedy()));
  EngineOptions plain;
  plain.block_size = 4;
  const auto ref = batched(m, reqs, plain);
  EngineOptions o = spec(unrelated_draft(), 3);
  o.kv_blocks = 9;  // the largest request needs 7 blocks; all six need 33
  Engine e(m, nullptr, o);
  Results res;
  std::vector<int64_t> rid;
  for (const auto& r : reqs) rid.push_back(e.submit(r, into(res)));
  e.run_until_idle();
  EXPECT_GT(e.stats().preemptions, 0);
  EXPECT_GT(e.stats().spec_proposed, 0);
  for (size_t k = 0; k < reqs.size(); ++k) EXPECT_EQ(res[rid[k]].ids, ref[k]) << "request " << k;
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

// A stop id met inside a run of accepted tokens ends the request there, as without a draft.
TEST(EngineSpeculative, StopRulesApplyToAcceptedTokensInOrder) {
  auto m = tiny_llama(11);
  const Request base = request(ids(7, 21), 12, greedy());
  const std::vector<int64_t> ref = alone(m, base);
  ASSERT_EQ(ref.size(), 12u);
  const int64_t at = 4;  // the first occurrence of ref[at] ends the request
  const auto first = std::find(ref.begin(), ref.end(), ref[at]) - ref.begin();
  Request r = base;
  r.stop.stop_token_ids = {ref[at]};
  Engine e(m, nullptr, spec(tiny_llama(11), 5));
  Results res;
  const int64_t id = e.submit(r, into(res));
  e.run_until_idle();
  EXPECT_EQ(res[id].ids, std::vector<int64_t>(ref.begin(), ref.begin() + first + 1));
  EXPECT_EQ(res[id].last.finish, FinishReason::stop_token);
  EXPECT_EQ(res[id].last.completion_tokens, first + 1);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
}

// A sliding window (6 positions, blocks of 4) over sequences of 41 and 55 positions: the
// verification call writes 1 + k positions past the accepted ones, the rejected ones are rolled
// back, and the blocks wholly before the next queries' windows go back to the pool. Greedy
// tokens equal the engine's without a draft; chosen logprobs differ from it only by the
// verification call's reduction order (a [1, 1 + k] chunk, not a one-token row).
TEST(EngineSpeculative, ASlidingWindowRollsTheCacheAndKeepsTheGreedyTokens) {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.max_position_embeddings = 64;
  c.sliding_window = 6;
  auto m = make_causal_lm(c, 21);
  auto windowed_draft = [&](int64_t window) {  // the model's weights, another window
    ModelConfig dc = c;
    dc.sliding_window = window;
    return make_causal_lm(dc, 21);
  };
  std::vector<Request> reqs;
  for (int b = 0; b < 2; ++b) {
    SamplingParams sp = greedy();
    sp.logprobs = 0;
    reqs.push_back(request(ids(b ? 19 : 5, 31 + b), 36, sp));
  }
  EngineOptions plain;
  plain.block_size = 4;
  plain.max_num_batched_tokens = 8;  // chunked prefill
  Results want;
  {
    Engine e(m, nullptr, plain);
    for (const auto& r : reqs) e.submit(r, into(want));
    e.run_until_idle();
  }
  double most_diff = 0;
  for (int64_t k : {1, 3, 5})
    for (bool prefix : {true, false})
      for (int kind = 0; kind < 3; ++kind) {
        // the model as its own draft (window 6: every proposal accepted, the draft's next query
        // one position behind the model's), and its weights with window 4 (the cache rolls at 6)
        // and without a window (it reads every position: nothing rolls), which accept some
        const char* name[] = {"self", "window 4", "no window"};
        SCOPED_TRACE(str("k=", k, prefix ? " prefix cache " : " ", name[kind]));
        EngineOptions o = plain;
        o.prefix_caching = prefix;
        o.draft_model = kind == 0 ? make_causal_lm(c, 21) : windowed_draft(kind == 1 ? 4 : 0);
        o.speculate_k = k;
        Engine e(m, nullptr, o);
        Results res;
        std::vector<int64_t> rid;
        for (const auto& r : reqs) rid.push_back(e.submit(r, into(res)));
        int64_t most = 0;
        while (e.step()) most = std::max(most, e.stats().kv_blocks_used);
        const EngineStats st = e.stats();
        std::printf("    k=%lld%s %s: acceptance %.3f, most blocks held %lld, rolled %lld\n",
                    (long long)k, prefix ? " prefix" : "", name[kind], st.acceptance_rate(),
                    (long long)most, (long long)st.kv_blocks_rolled);
        EXPECT_EQ(st.kv_blocks_used, 0);
        EXPECT_GT(st.spec_proposed, 0);
        if (kind == 0) EXPECT_EQ(st.acceptance_rate(), 1.0);
        if (kind < 2) {
          // per sequence the live positions run from the draft's next query's window start
          // (one behind the model's: 7 positions) through the 1 + k verified ones: at most
          // ceil((7 + 6) / 4) + 1 = 5 blocks for k = 5, plus the registered block kept for the
          // prefix hash chain; the 55 positions would need 14 unrolled
          EXPECT_LE(most, 2 * 6);
          EXPECT_GT(st.kv_blocks_rolled, 10);
        } else {
          EXPECT_EQ(st.kv_blocks_rolled, 0);
        }
        for (size_t b = 0; b < reqs.size(); ++b) {
          const Got &got = res[rid[b]], &ref = want[b + 1];
          EXPECT_EQ(got.last.finish, FinishReason::length);
          EXPECT_EQ(got.ids, ref.ids) << "request " << b;
          ASSERT_EQ(got.chosen.size(), ref.chosen.size());
          for (size_t t = 0; t < ref.chosen.size(); ++t)
            most_diff =
                std::max(most_diff, std::abs(got.chosen[t].logprob - ref.chosen[t].logprob));
        }
      }
  // f32 logits of a 2-layer model with O(1) values: a different summation order moves them by a
  // few units in the last place (~1e-6), far below the 1e-4 allowed
  std::printf("    largest chosen-logprob difference to the engine without a draft: %.3g\n",
              most_diff);
  EXPECT_LT(most_diff, 1e-4);
}

TEST(EngineSpeculative, ADraftOfAnotherVocabularyIsRefused) {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.vocab_size = 48;
  EngineOptions o = spec(make_causal_lm(c, 5), 2);
  try {
    Engine e(tiny_llama(11), nullptr, o);
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& x) {
    EXPECT_NE(std::string(x.what()).find("vocab_size is 48, the model's 64"), std::string::npos)
        << x.what();
  }
}

}  // namespace
