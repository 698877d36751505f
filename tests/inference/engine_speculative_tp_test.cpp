// Speculative decoding in the engine at TP 2 and 4 on sim ranks: rank 0 schedules, proposes with a
// draft at TP 1 (it alone runs it) or at the model's TP (its calls broadcast like the model's),
// verifies over every rank and decides each acceptance alone. Greedy tokens equal the TP 1 engine's
// with and without a draft, seeded sampled tokens the TP 1 speculative engine's, the sampled
// third token keeps the model's distribution at TP 2, a rank that throws ends the run with an
// error on every rank instead of a hang, and a draft at another TP is refused.
#include <cmath>
#include <stdexcept>

#include "engine_util.h"
#include "nxd/collectives/parallel_state.h"
#include "support/ranks.h"

using namespace nxd;
using namespace nxd::inference;
using namespace nxd::inference::testing;

namespace {

// tiny_llama's config and weights, its 2 KV heads over tp ranks
std::shared_ptr<CausalLM> model_at(int tp, uint64_t seed = 21) {
  ModelConfig c = nxd::testing::tiny_model("llama");
  c.max_position_embeddings = 64;
  c.kv_size_multiplier = std::max(1, tp / 2);
  return make_causal_lm(c, seed);
}

// Greedy and seeded sampled requests in turn, logprobs on; chunked prefill (12 tokens a step) and
// preemptions (12 blocks of 4; the longest request needs 10).
std::vector<Request> tp_requests() {
  std::vector<Request> reqs;
  for (int k = 0; k < 4; ++k) {
    SamplingParams sp = k % 2 ? sampled(/*only_generate_batch_knobs=*/true) : greedy();
    sp.seed = 7 + k;
    sp.logprobs = 0;
    reqs.push_back(request(nxd::testing::id_sequence(5 + 7 * k, 64, 30 + k), 12, sp));
  }
  return reqs;
}

EngineOptions tp_options(std::shared_ptr<CausalLM> draft) {
  EngineOptions o = spec(std::move(draft), 3);
  o.max_num_batched_tokens = 12;
  o.kv_blocks = 12;
  return o;
}

struct EngineRun {
  std::vector<Got> got;
  EngineStats stats;
};

EngineRun run(const std::shared_ptr<CausalLM>& m, const std::vector<Request>& reqs,
              const EngineOptions& o) {
  Engine e(m, nullptr, o);
  Results res;
  std::vector<int64_t> rid;
  for (const auto& r : reqs) rid.push_back(e.submit(r, into(res)));
  e.run_until_idle();
  EngineRun out{{}, e.stats()};
  for (int64_t id : rid) out.got.push_back(res[id]);
  EXPECT_EQ(out.stats.kv_blocks_used, 0);
  return out;
}

// The ranks of a TP group other than 0 follow rank 0's run_until_idle.
void follow(const std::shared_ptr<CausalLM>& m, const EngineOptions& o) {
  Engine e(m, nullptr, o);
  e.run_until_idle();
}

TEST(EngineTP, SpeculativeTokensEqualTheSingleRankEngines) {
  const std::vector<Request> reqs = tp_requests();
  auto m1 = model_at(1);
  const EngineRun plain = run(m1, reqs, tp_options(nullptr));
  // the draft at TP 1 (built here, outside the ranks; every rank's options hold it, rank 0 runs
  // it) or the model itself at the ranks' TP (built on each rank: sharded)
  auto unrelated = unrelated_draft();
  const EngineRun ref[2] = {run(m1, reqs, tp_options(unrelated)),
                            run(m1, reqs, tp_options(model_at(1)))};
  for (int kind = 0; kind < 2; ++kind)
    for (size_t b = 0; b < reqs.size(); b += 2)  // greedy: the engine's tokens without a draft
      EXPECT_EQ(ref[kind].got[b].ids, plain.got[b].ids) << "request " << b << " draft " << kind;
  for (int tp : {2, 4})
    for (int kind = 0; kind < 2; ++kind) {
      SCOPED_TRACE(str("tp ", tp, kind ? " the model as its own draft at TP N" : " TP 1 draft"));
      nxd::testing::run_ranks(tp, [&] {
        parallel_state::initialize_model_parallel(tp);
        auto m = model_at(tp);
        const EngineOptions o = tp_options(kind ? model_at(tp) : unrelated);
        if (parallel_state::get_tensor_model_parallel_rank() != 0) return follow(m, o);
        const EngineRun got = run(m, reqs, o);
        double diff = 0;
        for (size_t b = 0; b < reqs.size(); ++b) {
          const Got &g = got.got[b], &want = ref[kind].got[b];
          EXPECT_EQ(g.ids, want.ids) << "request " << b;
          EXPECT_EQ(g.last.finish, FinishReason::length) << "request " << b;
          ASSERT_EQ(g.chosen.size(), want.chosen.size());
          for (size_t t = 0; t < want.chosen.size(); ++t)
            diff = std::max(diff, std::abs(g.chosen[t].logprob - want.chosen[t].logprob));
        }
        EXPECT_EQ(got.stats.spec_proposed, ref[kind].stats.spec_proposed);
        EXPECT_EQ(got.stats.spec_accepted, ref[kind].stats.spec_accepted);
        EXPECT_GT(got.stats.preemptions, 0);
        // TP sums each row-parallel product in tp partial sums: the logits move by a few units
        // in the last place of f32 (~1e-6 for these O(1) values), far below the 1e-4 allowed
        std::printf(
            "    tp %d %s: acceptance %.3f (TP 1: %.3f), %lld preemptions, largest chosen-logprob "
            "difference to TP 1 %.3g\n",
            tp, kind ? "sharded self draft" : "TP 1 draft", got.stats.acceptance_rate(),
            ref[kind].stats.acceptance_rate(), (long long)got.stats.preemptions, diff);
        EXPECT_LT(diff, 1e-4);
        if (kind == 1) EXPECT_GT(got.stats.acceptance_rate(), 0.9);
      });
    }
}

// The TP 2 logits differ from TP 1's in the last bits, so a seeded request's tokens match TP 1's
// only while no draw falls between the two cumulative weights; over 800 seeds the sampled third
// token keeps the model's distribution as at TP 1 (EngineSpeculative's distribution test).
TEST(EngineTP, SpeculativeSampledTokensFollowTheModelsDistribution) {
  const int64_t N = 800, V = 64;
  auto m1 = model_at(1, 11);
  auto draft = unrelated_draft();
  auto tokens = [&](const std::shared_ptr<CausalLM>& m, const EngineOptions& o, uint64_t seed0) {
    Engine e(m, nullptr, for_many(o, N));
    return run_requests(e, seeded_requests(N, seed0));
  };
  const auto alone = frequencies(tokens(m1, {}, 100000), 2, V);
  const auto tp1 = tokens(m1, spec(draft, 2), 1);
  nxd::testing::run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(2);
    auto m = model_at(2, 11);
    const EngineOptions o = for_many(spec(draft, 2), N);
    if (parallel_state::get_tensor_model_parallel_rank() != 0) return follow(m, o);
    const auto tp2 = tokens(m, spec(draft, 2), 1);
    int64_t differ = 0;
    for (int64_t i = 0; i < N; ++i) differ += tp2[i] != tp1[i];
    const double tv1 = total_variation(frequencies(tp1, 2, V), alone),
                 tv2 = total_variation(frequencies(tp2, 2, V), alone);
    std::printf(
        "    TV of the third token to the model's frequencies: TP 1 speculative %.3f, TP 2 "
        "speculative %.3f; %lld of %lld seeded requests differ from TP 1\n",
        tv1, tv2, (long long)differ, (long long)N);
    EXPECT_LT(tv2, tv1 + 0.02);
    EXPECT_LE(differ, N / 100);
  });
}

// A rank that throws mid-run (a follower after a few plan messages, or rank 0 after a few steps)
// aborts the group: the other rank's collective fails instead of waiting, rank 0's requests end
// with `error`, and run_ranks rethrows the failure.
TEST(EngineSpeculativeTP, ARankThatThrowsEndsTheRunWithoutAHang) {
  for (int failing : {1, 0})
    for (int kind = 0; kind < 2; ++kind) {
      SCOPED_TRACE(str("rank ", failing, " fails, ", kind ? "sharded draft" : "TP 1 draft"));
      auto unrelated = unrelated_draft();
      std::vector<Output> finals;
      bool other_rank_failed = false;
      auto ranks = [&] {
        parallel_state::initialize_model_parallel(2);
        Engine e(model_at(2), nullptr, tp_options(kind ? model_at(2) : unrelated));
        const int rank = parallel_state::get_tensor_model_parallel_rank();
        if (rank == 0)
          for (const auto& r : tp_requests())
            e.submit(r, [&](const Output& o) {
              if (o.finish != FinishReason::none) finals.push_back(o);
            });
        if (rank == failing) {
          for (int i = 0; i < 6; ++i) e.step();  // a follower's step follows one message
          throw std::runtime_error("rank fails on purpose");
        }
        try {
          e.run_until_idle();
        } catch (const CommError&) {
          other_rank_failed = true;
          throw;
        }
      };
      EXPECT_THROW(nxd::testing::run_ranks(2, ranks), std::exception);
      EXPECT_TRUE(other_rank_failed);
      if (failing == 1) {  // rank 0's requests end, each with the failure's message
        ASSERT_EQ(finals.size(), 4u);
        for (const Output& o : finals) {
          EXPECT_EQ(o.finish, FinishReason::error);
          EXPECT_NE(o.error.find("rank 1"), std::string::npos) << o.error;
        }
      }
    }
}

// A draft sharded at a TP other than 1 and the model's is refused, naming both.
TEST(EngineSpeculativeTP, ADraftAtAnotherTPIsRefused) {
  auto m1 = model_at(1);
  nxd::testing::run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(2);
    auto draft = model_at(2);
    if (parallel_state::get_tensor_model_parallel_rank() != 0) return;
    try {
      Engine e(m1, nullptr, tp_options(draft));
      ADD_FAILURE() << "no InvalidArgument";
    } catch (const InvalidArgument& x) {
      EXPECT_NE(std::string(x.what()).find("at TP 1 or at the model's TP 1; it is built at TP 2"),
                std::string::npos)
          << x.what();
    }
  });
}

}  // namespace
