// The engine at TP 2 and 4 on sim ranks (rank 0 schedules and broadcasts each model call) gives
// the TP 1 engine's tokens.
#include <gtest/gtest.h>

#include <map>

#include "nxd/collectives/parallel_state.h"
#include "nxd/inference/engine.h"
#include "nxd/layers/models/causal_lm.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::inference;

TEST(EngineTP, RanksFollowRankZeroAndGiveTheSingleRankTokens) {
  ModelConfig base = nxd::testing::tiny_model("llama");
  base.max_position_embeddings = 64;
  std::vector<Request> reqs;
  for (int k = 0; k < 4; ++k) {
    Request r;
    r.prompt = nxd::testing::id_sequence(5 + 7 * k, 64, 30 + k);
    r.stop.max_tokens = 12;
    r.sampling.temperature = k % 2 ? 0.8 : 0.0;
    r.sampling.seed = 7 + k;
    reqs.push_back(r);
  }
  EngineOptions o;
  o.block_size = 4;
  o.max_num_batched_tokens = 12;  // chunked prefill
  o.kv_blocks = 24;               // preemptions too
  auto run = [&](const std::shared_ptr<CausalLM>& m) {
    Engine e(m, nullptr, o);
    std::map<int64_t, std::vector<int64_t>> got;
    std::vector<int64_t> ids;
    for (const auto& r : reqs)
      ids.push_back(e.submit(r, [&got](const Output& out) {
        got[out.request_id].insert(got[out.request_id].end(), out.ids.begin(), out.ids.end());
      }));
    e.run_until_idle();
    std::vector<std::vector<int64_t>> tokens;
    for (int64_t id : ids) tokens.push_back(got[id]);
    return std::make_pair(tokens, e.stats());
  };
  const auto [ref, ref_stats] = run(make_causal_lm(base, 21));
  for (int tp : {2, 4}) {
    SCOPED_TRACE(str("tp ", tp));
    ModelConfig c = base;
    c.kv_size_multiplier = std::max(1, tp / 2);  // 2 KV heads over tp ranks
    nxd::testing::run_ranks(tp, [&] {
      parallel_state::initialize_model_parallel(tp);
      auto m = make_causal_lm(c, 21);
      if (parallel_state::get_tensor_model_parallel_rank() == 0) {
        const auto [got, stats] = run(m);
        EXPECT_EQ(got, ref);
        EXPECT_EQ(stats.preemptions, ref_stats.preemptions);
        EXPECT_GT(stats.preemptions, 0);
      } else {
        Engine e(m, nullptr, o);
        EXPECT_THROW(e.submit(reqs[0], nullptr), InvalidArgument);
        e.run_until_idle();  // follows rank 0's run_until_idle
      }
    });
  }
}
