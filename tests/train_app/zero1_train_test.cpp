// ZeRO-1 through the trainer and nxd-train's keys (distributed_strategy.zero1): 20 steps at
// TP2(SP) x DP2 and at PP2 x DP2 give the losses and grad norms of the all-reduce path within
// 1e-5 with a lower modeled device-memory peak; a ZeRO-1 checkpoint (each DP rank's part of the
// optimizer state in its own file) resumes with ZeRO-1 off and on as the uninterrupted run, and
// with ZeRO-1 at DP 2 within rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nxd/checkpoint/checkpoint.h"
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

}  // namespace

TEST(Zero1Train, MatchesTheAllReducePathAndLowersTheMemoryPeak) {
  auto d = nxd::testing::test_temp_dir("nxd_zero1_train_");
  const std::vector<std::vector<std::string>> layouts = {
      {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=2",
       "distributed_strategy.sequence_parallel=true"},
      {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=1",
       "distributed_strategy.pipeline_model_parallel_size=2"}};
  for (size_t i = 0; i < layouts.size(); ++i) {
    auto with = layouts[i];
    with.push_back("distributed_strategy.zero1=true");
    const Out plain = run(d, "plain" + std::to_string(i), layouts[i]);
    const Out zero = run(d, "zero1_" + std::to_string(i), with);
    const double wl = worst_rel(zero.rows.loss, plain.rows.loss);
    const double wg = worst_rel(zero.rows.grad_norm, plain.rows.grad_norm);
    EXPECT_LE(wl, 1e-5) << "layout " << i << ": largest relative loss difference " << wl;
    EXPECT_LE(wg, 1e-5) << "layout " << i << ": largest relative grad norm difference " << wg;
    EXPECT_LT(zero.result.hbm_peak_bytes, plain.result.hbm_peak_bytes) << "layout " << i;
  }
}

TEST(Zero1Train, CheckpointResumesWithZero1OffAndOn) {
  auto d = nxd::testing::test_temp_dir("nxd_zero1_train_");
  const auto c = nxd::testing::cut_run(d, "distributed_strategy.zero1=true");
  const Out& whole = c.whole;
  const std::string& ckpt = c.ckpt;
  auto with = [&](std::vector<std::string> extra) { return c.args(std::move(extra)); };
  const auto meta = ckpt::read_metadata(ckpt);
  EXPECT_EQ(meta["parallel"]["zero1"], true);
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(
        fs::exists(fs::path(ckpt) / "optim" /
                   ("dp_rank_0" + std::to_string(r) + "_tp_rank_00_pp_rank_00.safetensors")))
        << r;
  for (const char* z : {"false", "true"}) {
    const Out resumed = run(d, std::string("resumed_") + z,
                            with({std::string("distributed_strategy.zero1=") + z,
                                  "exp_manager.resume_from_checkpoint=" + ckpt}));
    ASSERT_EQ(resumed.rows.loss.size(), 4u) << z;
    const std::vector<double> tail(whole.rows.loss.begin() + 4, whole.rows.loss.end());
    EXPECT_LE(worst_rel(resumed.rows.loss, tail), 1e-6) << "resumed with zero1=" << z;
  }
  // at DP 2 (two micro batches per rank for the same global batch): the DP 4 state reassembled
  auto dp2 =
      with({"distributed_strategy.zero1=true", "exp_manager.resume_from_checkpoint=" + ckpt});
  dp2.push_back("backend.world_size=2");
  const Out resumed = run(d, "resumed_dp2", dp2);
  ASSERT_EQ(resumed.rows.loss.size(), 4u);
  const std::vector<double> tail(whole.rows.loss.begin() + 4, whole.rows.loss.end());
  const double w = worst_rel(resumed.rows.loss, tail);
  std::printf("    ZeRO-1 DP4 checkpoint resumed at ZeRO-1 DP2: losses within %.3g\n", w);
  EXPECT_LE(w, 1e-5);
}

// Issue 24's configuration: DP 4, hidden 512, 8 heads, 4 layers, sequence 32, global batch 4,
// fp32. ZeRO-1's HBM peak per NeuronCore is at most 0.8x plain DP's (measured 140.1 against
// 219.6 MiB: 0.64x), its optimizer state is 1/DP of AdamW's, and everything else at the peak
// (parameters, gradients, activations and the step's transients) is what plain DP holds: the
// step allocates no full-size temporary (parameters live in the buckets' flat buffers, the
// all-gather and the reduce-scatter run in place, the wrapped AdamW never allocates its state).
TEST(Zero1Train, LowersTheHbmPeakOnTheIssueConfiguration) {
  auto d = nxd::testing::test_temp_dir("nxd_zero1_peak_");
  auto run_one = [&](const std::string& name, bool zero1) {
    return train(
        tiny(d / name, nxd::testing::tiny_corpus(d),
             {"backend.world_size=4", "model.hidden_size=512", "model.num_attention_heads=8",
              "model.num_layers=4", "data.seq_length=32", "data.micro_batch_size=1",
              "data.global_batch_size=4", "precision.type=fp32", "trainer.max_steps=3",
              "trainer.val_check_interval=0", "generation.max_new_tokens=0",
              std::string("distributed_strategy.zero1=") + (zero1 ? "true" : "false")}),
        {.quiet = true});
  };
  const TrainResult plain = run_one("plain", false), zero = run_one("zero1", true);
  const double peak_ratio = static_cast<double>(zero.hbm_peak_bytes) / plain.hbm_peak_bytes;
  const double state_ratio =
      static_cast<double>(zero.optimizer_state_bytes) / plain.optimizer_state_bytes;
  // the peak without the optimizer state: parameters, gradients, activations, transients
  const double rest_plain = plain.hbm_peak_bytes - plain.optimizer_state_bytes;
  const double rest_zero = zero.hbm_peak_bytes - zero.optimizer_state_bytes;
  std::printf(
      "    HBM peak: plain DP %.1f MiB, ZeRO-1 %.1f MiB (%.3fx); optimizer state %.2f / "
      "%.2f MiB (%.4f, 1/DP 0.25); the rest %.2f / %.2f MiB\n",
      plain.hbm_peak_bytes / 1048576.0, zero.hbm_peak_bytes / 1048576.0, peak_ratio,
      plain.optimizer_state_bytes / 1048576.0, zero.optimizer_state_bytes / 1048576.0, state_ratio,
      rest_plain / 1048576.0, rest_zero / 1048576.0);
  EXPECT_NEAR(zero.last_loss, plain.last_loss, 1e-5 * std::abs(plain.last_loss));
  EXPECT_LE(peak_ratio, 0.8);
  EXPECT_NEAR(state_ratio, 0.25, 0.25 * 0.01);
  // ZeRO-1 adds nothing but its buckets' padding (under 0.1% here) to the rest of the peak
  EXPECT_LE(rest_zero, rest_plain * 1.001);
}

// Lion through nxd-train's keys (model.optim.name=lion): ZeRO-1 at DP 2 against the unsharded
// Lion, the same losses and grad norms (ZeRO-1 runs Lion's elementwise rule on each shard).
TEST(Zero1Train, LionMatchesUnshardedLion) {
  auto d = nxd::testing::test_temp_dir("nxd_zero1_train_");
  const std::vector<std::string> lion = {"backend.world_size=2", "model.optim.name=lion",
                                         "model.optim.lr=1e-3", "trainer.max_steps=10"};
  auto with = lion;
  with.push_back("distributed_strategy.zero1=true");
  const Out plain = run(d, "lion", lion);
  const Out zero = run(d, "lion_zero1", with);
  const double wl = worst_rel(zero.rows.loss, plain.rows.loss);
  const double wg = worst_rel(zero.rows.grad_norm, plain.rows.grad_norm);
  std::printf("    Lion ZeRO-1 DP 2: largest relative loss difference %.3g, grad norm %.3g\n", wl,
              wg);
  EXPECT_LE(wl, 1e-6);
  EXPECT_LE(wg, 1e-6);
  EXPECT_LT(plain.rows.loss.back(), plain.rows.loss.front()) << "Lion trains";
  EXPECT_LT(zero.result.optimizer_state_bytes, plain.result.optimizer_state_bytes);
}
