// Activation checkpointing in the models (ModelConfig::activations_checkpoint_granularity):
// full and selective give bitwise the gradients of none (dropout on: the recomputation replays
// the RNG) and a lower peak of the rank's allocator counter over forward + backward.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/context.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;

namespace {

ModelConfig config(const std::string& arch) {
  ModelConfig c = nxd::testing::tiny_model(arch);
  c.num_layers = 4;
  c.num_kv_heads = 0;
  c.ffn_hidden_size = 64;
  c.max_position_embeddings = 128;
  c.init_std = ModelConfig{}.init_std;
  c.dropout = 0.1;
  return c;
}

Tensor ids_of(int64_t B, int64_t S, uint64_t seed) {
  RngStream s{seed, 5};
  std::vector<int64_t> v(B * S);
  for (int64_t i = 0; i < B * S; ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * 64);
  return from_vector<int64_t>(v, {B, S});
}

struct CkptRun {
  Tensor loss;
  std::map<std::string, Tensor> grads;
  int64_t peak = 0;  // allocator peak over forward + backward, above the bytes live before
};

CkptRun run(ModelConfig cfg, CheckpointGranularity g) {
  cfg.activations_checkpoint_granularity = g;
  CkptRun r;
  nxd::testing::run_ranks(1, [&] {
    auto m = make_causal_lm(cfg, 3);
    Tensor ids = ids_of(2, 96, 1), tg = ids_of(2, 96, 2);
    MemoryCounter& mem = current_context().memory();
    mem.reset_peak();
    const int64_t before = mem.live();
    Tensor l = m->loss(ids, tg);
    backward(l);
    r.peak = mem.peak() - before;
    r.loss = l.detach().clone();
    for (auto& [n, t] : m->named_parameters()) r.grads[n] = t.grad().clone();
  });
  return r;
}

}  // namespace

TEST(ActivationCheckpointing, BitwiseGradientsAndLowerPeak) {
  for (const std::string arch : {"llama", "gpt_neox"}) {
    const CkptRun none = run(config(arch), CheckpointGranularity::none);
    for (CheckpointGranularity g :
         {CheckpointGranularity::selective, CheckpointGranularity::full}) {
      SCOPED_TRACE(arch + " " + checkpoint_granularity_name(g));
      const CkptRun r = run(config(arch), g);
      EXPECT_TRUE(nxd::testing::bitwise_equal(r.loss, none.loss, "loss"));
      for (const auto& [n, t] : none.grads)
        EXPECT_TRUE(nxd::testing::bitwise_equal(r.grads.at(n), t, n));
      EXPECT_LT(r.peak, none.peak);
      std::printf("    %s %s: peak %.1f KiB (none %.1f KiB)\n", arch.c_str(),
                  checkpoint_granularity_name(g), r.peak / 1024.0, none.peak / 1024.0);
    }
  }
}

TEST(ActivationCheckpointing, ParsesNxDTNames) {
  EXPECT_EQ(parse_checkpoint_granularity("null"), CheckpointGranularity::none);
  EXPECT_EQ(parse_checkpoint_granularity("full"), CheckpointGranularity::full);
  EXPECT_EQ(parse_checkpoint_granularity("selective"), CheckpointGranularity::selective);
  try {
    parse_checkpoint_granularity("partial");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'partial' is not one of null, full, selective"),
              std::string::npos);
  }
}
