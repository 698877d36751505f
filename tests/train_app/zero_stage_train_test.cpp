// distributed_strategy.zero_stage through nxd-train (docs/design/fsdp.md): ZeRO-2 at DP 4, TP2(SP)
// x DP2, PP2 x DP2 and DP 4 with full activation checkpointing gives plain DP's losses and grad
// norms over 20 steps with clipping (the same buckets and collectives as ZeRO-1: bitwise its
// losses) with a lower HBM peak than ZeRO-1 (TP x SP: than plain DP); a ZeRO-2 checkpoint resumes
// at stages 0, 1 and 2 as the uninterrupted run; contradictory keys are a ConfigError naming both.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/runtime/error.h"
#include "nxd/train_app/train.h"
#include "support/compare.h"
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

using Out = nxd::testing::TrainRun;

Out run(const fs::path& d, const std::string& name, std::vector<std::string> extra) {
  return nxd::testing::train_rows(d, name, std::move(extra));
}

std::string config_error(const fs::path& d, std::vector<std::string> extra) {
  return nxd::testing::parallel_config_error(d, std::move(extra));
}

}  // namespace

TEST(ZeroStageTrain, Zero2MatchesPlainDpWithALowerPeakThanZero1) {
  auto d = nxd::testing::test_temp_dir("nxd_zero2_train_");
  const std::vector<std::vector<std::string>> layouts = {
      {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=1"},
      {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=2",
       "distributed_strategy.sequence_parallel=true"},
      {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=1",
       "distributed_strategy.pipeline_model_parallel_size=2"},
      {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=1",
       "model.activations_checkpoint_granularity=full"}};
  for (size_t i = 0; i < layouts.size(); ++i) {
    auto stage = [&](int s) {
      auto with = layouts[i];
      with.push_back("distributed_strategy.zero_stage=" + std::to_string(s));
      return run(d, "stage" + std::to_string(s) + "_" + std::to_string(i), with);
    };
    const Out plain = stage(0), one = stage(1), two = stage(2);
    const double wl = worst_rel(two.rows.loss, plain.rows.loss);
    const double wg = worst_rel(two.rows.grad_norm, plain.rows.grad_norm);
    const double w1 = worst_rel(two.rows.loss, one.rows.loss);
    std::printf(
        "    layout %zu: ZeRO-2 vs plain DP losses %.3g, grad norms %.3g, vs ZeRO-1 losses %.3g; "
        "HBM peak plain %.2f, ZeRO-1 %.2f, ZeRO-2 %.2f MiB\n",
        i, wl, wg, w1, plain.result.hbm_peak_bytes / 1048576.0,
        one.result.hbm_peak_bytes / 1048576.0, two.result.hbm_peak_bytes / 1048576.0);
    ASSERT_EQ(two.rows.loss.size(), 20u);
    EXPECT_LE(wl, 1e-6) << "layout " << i;
    EXPECT_LE(wg, 1e-6) << "layout " << i;
    EXPECT_EQ(w1, 0.0) << "layout " << i << ": ZeRO-2 is bitwise ZeRO-1";
    // TP x SP reduces at the step (the SP sums reach .grad before the reduction): the full
    // gradients exist at the end of backward as with ZeRO-1, and the peak (measured 0.82 against
    // ZeRO-1's 0.75 MiB) is only below plain DP's
    const auto& than = i == 1 ? plain : one;
    EXPECT_LT(two.result.hbm_peak_bytes, than.result.hbm_peak_bytes) << "layout " << i;
  }
}

TEST(ZeroStageTrain, Zero2CheckpointResumesAtStages0And1And2) {
  auto d = nxd::testing::test_temp_dir("nxd_zero2_ckpt_");
  const auto c = nxd::testing::cut_run(d, "distributed_strategy.zero_stage=2");
  const Out& whole = c.whole;
  const std::string& ckpt = c.ckpt;
  auto with = [&](std::vector<std::string> extra) { return c.args(std::move(extra)); };
  EXPECT_EQ(ckpt::read_metadata(ckpt)["parallel"]["zero1"], true);  // the sharded layout
  const std::vector<double> tail(whole.rows.loss.begin() + 4, whole.rows.loss.end());
  for (const char* s : {"0", "1", "2"}) {
    const Out resumed = run(d, std::string("resumed_") + s,
                            with({std::string("distributed_strategy.zero_stage=") + s,
                                  "exp_manager.resume_from_checkpoint=" + ckpt}));
    ASSERT_EQ(resumed.rows.loss.size(), 4u) << s;
    const double w = worst_rel(resumed.rows.loss, tail);
    std::printf("    ZeRO-2 DP4 checkpoint resumed at stage %s: losses within %.3g\n", s, w);
    EXPECT_EQ(w, 0.0) << "resumed at zero_stage=" << s;
  }
}

TEST(ZeroStageTrain, ContradictoryOrUnknownStagesAreConfigErrors) {
  auto d = nxd::testing::test_temp_dir("nxd_zero_stage_keys_");
  const std::string both =
      config_error(d, {"distributed_strategy.zero1=true", "distributed_strategy.zero_stage=2"});
  EXPECT_NE(both.find("distributed_strategy.zero1=true"), std::string::npos) << both;
  EXPECT_NE(both.find("distributed_strategy.zero_stage=2"), std::string::npos) << both;
  const std::string zero =
      config_error(d, {"distributed_strategy.zero1=true", "distributed_strategy.zero_stage=0"});
  EXPECT_NE(zero.find("distributed_strategy.zero_stage=0"), std::string::npos) << zero;
  EXPECT_NE(config_error(d, {"distributed_strategy.zero_stage=5"}).find("zero_stage=5"),
            std::string::npos);
  EXPECT_EQ(
      config_error(d, {"distributed_strategy.zero1=true", "distributed_strategy.zero_stage=1"}),
      "");
  const TrainConfig c = tiny(d / "ok", nxd::testing::tiny_corpus(d),
                             parallel_run({"distributed_strategy.zero1=true"}));
  EXPECT_EQ(c.dist.zero_stage, optim::ZeroStage::one);
  EXPECT_EQ(nxd_config_of(c).optimizer_config.stage(), optim::ZeroStage::one);
}

// Optimizer offload (distributed_strategy.optimizer_offload) at ZeRO-2 DP 4: the same losses
// bitwise, and the optimizer state's bytes move from the HBM peak to the host counter.
TEST(ZeroStageTrain, OptimizerOffloadMovesTheStateToHostWithTheSameLosses) {
  auto d = nxd::testing::test_temp_dir("nxd_offload_train_");
  const std::vector<std::string> base = {"backend.world_size=4",
                                         "distributed_strategy.tensor_model_parallel_size=1",
                                         "distributed_strategy.zero_stage=2"};
  auto with = base;
  with.push_back("distributed_strategy.optimizer_offload=true");
  const Out dev = run(d, "device", base), off = run(d, "offload", with);
  const double state = static_cast<double>(off.result.optimizer_state_bytes);
  const double moved = static_cast<double>(dev.result.hbm_peak_bytes - off.result.hbm_peak_bytes);
  std::printf(
      "    HBM peak %.3f -> %.3f MiB with offload (%.3f MiB moved; optimizer state %.3f MiB), "
      "host peak %.3f -> %.3f MiB\n",
      dev.result.hbm_peak_bytes / 1048576.0, off.result.hbm_peak_bytes / 1048576.0,
      moved / 1048576.0, state / 1048576.0, dev.result.host_peak_bytes / 1048576.0,
      off.result.host_peak_bytes / 1048576.0);
  EXPECT_EQ(worst_rel(off.rows.loss, dev.rows.loss), 0.0);
  EXPECT_EQ(dev.result.host_peak_bytes, 0);
  EXPECT_GE(static_cast<double>(off.result.host_peak_bytes), state);
  EXPECT_NEAR(moved, state, 0.02 * state);
  const std::string e = config_error(d, {"distributed_strategy.optimizer_offload=true"});
  EXPECT_NE(e.find("distributed_strategy.optimizer_offload=true"), std::string::npos) << e;
  EXPECT_NE(e.find("distributed_strategy.zero_stage"), std::string::npos) << e;
}

// LoRA (model_alignment_strategy.peft) at stage 2: only the adapters are in the buckets; the
// losses are stage 1's bitwise and plain DP's within 1e-6, at DP 4 and TP 2 x DP 2.
TEST(ZeroStageTrain, LoraAtStage2IsStage1) {
  auto d = nxd::testing::test_temp_dir("nxd_zero2_lora_");
  const std::vector<std::vector<std::string>> layouts = {
      {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=1"},
      {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=2"}};
  for (size_t i = 0; i < layouts.size(); ++i) {
    auto stage = [&](int s) {
      auto with = layouts[i];
      with.insert(with.end(), {"model_alignment_strategy.peft.lora_rank=8",
                               "model_alignment_strategy.peft.target_modules=[qkv_proj, o_proj, "
                               "up_proj, down_proj]",
                               "distributed_strategy.zero_stage=" + std::to_string(s)});
      return run(d, "lora" + std::to_string(s) + "_" + std::to_string(i), with);
    };
    const Out plain = stage(0), one = stage(1), two = stage(2);
    const double w0 = worst_rel(two.rows.loss, plain.rows.loss);
    std::printf("    LoRA layout %zu: ZeRO-2 vs plain DP losses %.3g, vs ZeRO-1 %.3g\n", i, w0,
                worst_rel(two.rows.loss, one.rows.loss));
    ASSERT_EQ(two.rows.loss.size(), 20u);
    EXPECT_EQ(worst_rel(two.rows.loss, one.rows.loss), 0.0) << i;
    EXPECT_LE(w0, 1e-6) << i;
    EXPECT_LT(two.rows.loss.back(), two.rows.loss.front()) << "the adapters train";
  }
}
