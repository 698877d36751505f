// Context parallelism through the trainer and nxd-train's key
// (distributed_strategy.context_parallel_size): 20 steps at CP 2, CP 2 x TP2(SP) x ZeRO-1 and
// CP 2 x PP2 give the single rank's losses and gradient norms within 1e-5 (the data path gives
// every CP rank its chunks of the same sequences); a CP 2 x DP 2 x ZeRO-1 checkpoint (its state
// in DP x CP = 4 shards) resumes as the uninterrupted run at CP 2 and at CP 1; impossible
// combinations are configuration errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nxd/api/nxd_config.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/train_app/train.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "train_util.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;
using nxd::testing::parallel_run;
using nxd::testing::read_rows;
using nxd::testing::tiny;
using nxd::testing::worst_rel;

namespace {

nxd::testing::Rows run(const fs::path& d, const std::string& name, std::vector<std::string> extra) {
  extra.insert(extra.begin(), "model.num_layers=2");
  train(tiny(d / name, nxd::testing::tiny_corpus(d), parallel_run(extra)), {.quiet = true});
  return read_rows(d / name / "metrics.csv");
}

}  // namespace

TEST(ContextParallelTrain, MatchesOneRank) {
  auto d = nxd::testing::test_temp_dir("nxd_cp_train_");
  const auto one = run(d, "one", {"backend.world_size=1"});
  const std::vector<std::vector<std::string>> layouts = {
      {"backend.world_size=2", "distributed_strategy.context_parallel_size=2"},
      {"backend.world_size=4", "distributed_strategy.context_parallel_size=2",
       "distributed_strategy.tensor_model_parallel_size=2",
       "distributed_strategy.sequence_parallel=true", "distributed_strategy.zero1=true"},
      {"backend.world_size=4", "distributed_strategy.context_parallel_size=2",
       "distributed_strategy.pipeline_model_parallel_size=2"},
      {"backend.world_size=4", "distributed_strategy.context_parallel_size=2",
       "distributed_strategy.zero_stage=2"}};
  const char* names[] = {"cp2", "cp2 x tp2 sp x zero1", "cp2 x pp2", "cp2 x dp2 zero2"};
  for (size_t i = 0; i < layouts.size(); ++i) {
    const auto cp = run(d, "cp" + std::to_string(i), layouts[i]);
    const double wl = worst_rel(cp.loss, one.loss), wn = worst_rel(cp.grad_norm, one.grad_norm);
    std::printf("    [%s] losses within %.3g, grad norms within %.3g of one rank\n", names[i], wl,
                wn);
    EXPECT_LE(wl, 1e-5) << i;
    EXPECT_LE(wn, 1e-5) << i;
  }
}

TEST(ContextParallelTrain, ImpossibleCombinationsAreConfigErrors) {
  auto d = nxd::testing::test_temp_dir("nxd_cp_config_");
  const fs::path corpus = nxd::testing::tiny_corpus(d);
  auto expect_error = [&](std::vector<std::string> extra, const std::string& says) {
    try {
      tiny(d / "x", corpus, extra);
      ADD_FAILURE() << "no error for " << extra.back();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  // 30 tokens do not cut into 2 x 2 chunks
  expect_error({"backend.world_size=2", "data.seq_length=30",
                "distributed_strategy.context_parallel_size=2"},
               "not divisible by 2 x distributed_strategy.context_parallel_size=4");
  // 3 ranks are not 2 x a data-parallel size
  expect_error({"backend.world_size=3", "distributed_strategy.context_parallel_size=2"},
               "x context_parallel_size 2");
  // 20 / CP 2 = 10 tokens per rank do not split over TP 4 under sequence parallelism
  expect_error({"backend.world_size=8", "data.seq_length=20", "model.num_attention_heads=4",
                "distributed_strategy.tensor_model_parallel_size=4",
                "distributed_strategy.sequence_parallel=true",
                "distributed_strategy.context_parallel_size=2"},
               "tokens per rank are not divisible by tensor_model_parallel_size=4");
  // capacity drops follow the whole sequence's token order (MoE x CP: moe_tp_train_test.cpp)
  expect_error({"backend.world_size=2", "model.moe.num_experts=4", "model.moe.dropless=false",
                "distributed_strategy.context_parallel_size=2"},
               "with model.moe.dropless=false");
}

TEST(ContextParallelTrain, Zero1CheckpointResumesAtCp2AndCp1) {
  auto d = nxd::testing::test_temp_dir("nxd_cp_ckpt_");
  const std::vector<std::string> base = {"distributed_strategy.zero1=true", "trainer.max_steps=8",
                                         "model.optim.sched.max_steps=8"};
  auto with = [&](int world, int cp, std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    extra.push_back("backend.world_size=" + std::to_string(world));
    extra.push_back("distributed_strategy.context_parallel_size=" + std::to_string(cp));
    return extra;
  };
  const auto whole = run(d, "whole", with(4, 2, {}));
  run(d, "cut",
      with(
          4, 2,
          {"trainer.max_steps=5", "exp_manager.checkpoint_callback_params.every_n_train_steps=4"}));
  const std::string ckpt = (d / "cut" / "checkpoints" / "step_4").string();
  for (int r = 0; r < 4; ++r)  // ZeRO-1 shards over DP x CP
    EXPECT_TRUE(
        fs::exists(fs::path(ckpt) / "optim" /
                   ("dp_rank_0" + std::to_string(r) + "_tp_rank_00_pp_rank_00.safetensors")))
        << r;
  const std::vector<double> tail(whole.loss.begin() + 4, whole.loss.end());
  const auto cp2 =
      run(d, "resumed_cp2", with(4, 2, {"exp_manager.resume_from_checkpoint=" + ckpt}));
  ASSERT_EQ(cp2.loss.size(), 4u);
  EXPECT_LE(worst_rel(cp2.loss, tail), 1e-6);
  // CP 1 x DP 2: the same DP replicas' batches, the state reassembled from 4 shards into 2
  const auto cp1 =
      run(d, "resumed_cp1", with(2, 1, {"exp_manager.resume_from_checkpoint=" + ckpt}));
  ASSERT_EQ(cp1.loss.size(), 4u);
  const double w = worst_rel(cp1.loss, tail);
  std::printf(
      "    CP 2 x DP 2 ZeRO-1 checkpoint resumed at CP 2 within %.3g, at CP 1 x DP 2 within "
      "%.3g\n",
      worst_rel(cp2.loss, tail), w);
  EXPECT_LE(w, 1e-5);
}

// NxD's neuronx_distributed_config key: context_parallel_size builds the CP groups.
TEST(ContextParallelTrain, NxDConfigKeyInitializesTheGroups) {
  const NxDConfig c = NxDConfig::from_json(
      nlohmann::json{{"tensor_parallel_size", 1}, {"context_parallel_size", 2}});
  EXPECT_EQ(c.context_parallel_size, 2);
  nxd::testing::run_ranks(4, [&] {
    neuronx_distributed_config(c);
    EXPECT_EQ(parallel_state::get_context_parallel_size(), 2);
    EXPECT_EQ(parallel_state::get_data_parallel_size(), 2);
    EXPECT_EQ(parallel_state::get_data_context_parallel_size(), 4);
  });
  nxd::testing::run_ranks(3, [&] { EXPECT_THROW(neuronx_distributed_config(c), ConfigError); });
}
