// ZeRO-3 (distributed_strategy.zero_stage=3) through nxd-train with context parallelism and with
// mixture-of-experts models (docs/design/fsdp.md, "Composition"): 20 clipped steps at CP 2 x DP 2,
// CP 2 x TP 2 (SP) and of a Mixtral at EP 1 x DP 4, EP 2 x DP 4 (also with full recomputation and
// without reshard_after_forward) and EP 2 x TP 2 (SP) x DP 2 give stage 1's and stage 2's losses
// bitwise (one parameter per bucket: the same bucket layout) and plain DP's and one rank's within
// 1e-6; the allocator's HBM peak per rank of every stage is printed, and on an 8-layer Mixtral
// stage 3's is below stage 1's; stage-3 checkpoints of a Mixtral at EP 2 x DP 4 and
// EP 1 x DP 4 and of CP 2 x DP 2 (per-rank blocks) resume at stages 1 and 3 as the uninterrupted
// run, bitwise.
#include <gtest/gtest.h>

#include <string>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/train_app/train.h"
#include "support/compare.h"
#include "train_util.h"

using namespace nxd;
using namespace nxd::train_app;
namespace fs = std::filesystem;
using nxd::testing::kBucketPerParam;
using nxd::testing::mib;
using nxd::testing::worst_rel;

namespace {

using Out = nxd::testing::TrainRun;

// A Mixtral with 4 experts, top 2, MoE in every layer, aux and z-loss.
const std::vector<std::string> kMixtral = {
    "model.arch=mixtral", "model.moe.num_experts=4", "model.moe.top_k=2",
    "model.moe.router_aux_loss_coef=0.05", "model.moe.router_z_loss_coef=0.01"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string stage(int s) {
  return "distributed_strategy.zero_stage=" + std::to_string(s);
}

// `layout` at stages 0, 1 and 3 against `single` (the same model on one rank): stage 3 is stage
// 1 bitwise and within 1e-6 of plain DP and of one rank; prints the HBM peaks per rank.
void expect_stage3_matches(const fs::path& d, const std::string& name,
                           const std::vector<std::string>& layout, const Out& single, int layers) {
  auto at = [&](int s) {
    return nxd::testing::train_rows(d, name + "_" + std::to_string(s),
                                    with(layout, {kBucketPerParam, stage(s)}), layers);
  };
  const Out plain = at(0), one = at(1), two = at(2), three = at(3);
  ASSERT_EQ(three.rows.loss.size(), 20u) << name;
  const double w1 = worst_rel(three.rows.loss, one.rows.loss);
  const double wn1 = worst_rel(three.rows.grad_norm, one.rows.grad_norm);
  const double w0 = worst_rel(three.rows.loss, plain.rows.loss);
  const double wn0 = worst_rel(three.rows.grad_norm, plain.rows.grad_norm);
  const double ws = worst_rel(three.rows.loss, single.rows.loss);
  const double wns = worst_rel(three.rows.grad_norm, single.rows.grad_norm);
  std::printf(
      "    [%s] ZeRO-3 vs ZeRO-1: losses %.3g, norms %.3g; vs plain DP %.3g, %.3g; vs one rank "
      "%.3g, %.3g; HBM peak per rank plain %.3f, ZeRO-1 %.3f, ZeRO-2 %.3f, ZeRO-3 %.3f MiB\n",
      name.c_str(), w1, wn1, w0, wn0, ws, wns, mib(plain.result.hbm_peak_bytes),
      mib(one.result.hbm_peak_bytes), mib(two.result.hbm_peak_bytes),
      mib(three.result.hbm_peak_bytes));
  EXPECT_EQ(worst_rel(two.rows.loss, one.rows.loss), 0.0) << name;
  EXPECT_EQ(w1, 0.0) << name << ": ZeRO-3 is bitwise ZeRO-1 with its buckets";
  EXPECT_EQ(wn1, 0.0) << name;
  EXPECT_LE(w0, 1e-6) << name;
  EXPECT_LE(wn0, 1e-6) << name;
  EXPECT_LE(ws, 1e-6) << name;
  EXPECT_LE(wns, 1e-6) << name;
}

}  // namespace

// Context parallelism: the layers sharded over the DP x CP group (4 ranks at CP 2 x DP 2; 2 at
// CP 2 x TP 2 with SP, whose sums make the reduction wait for the step).
TEST(Zero3Compose, ContextParallelMatchesStage1BitwiseAndOneRank) {
  auto d = nxd::testing::test_temp_dir("nxd_zero3_cp_");
  const Out single = nxd::testing::train_rows(d, "one", {"backend.world_size=1"}, 3);
  expect_stage3_matches(d, "cp2 x dp2",
                        {"backend.world_size=4", "distributed_strategy.context_parallel_size=2"},
                        single, 3);
  expect_stage3_matches(d, "cp2 x tp2 sp",
                        {"backend.world_size=4", "distributed_strategy.context_parallel_size=2",
                         "distributed_strategy.tensor_model_parallel_size=2",
                         "distributed_strategy.sequence_parallel=true"},
                        single, 3);
}

// A Mixtral without expert parallelism (its experts dense parameters of the layers' units) and at
// EP 2 (each layer's experts a unit of their own over expert-DP, nested in the layer's), also
// with full activation checkpointing (the nested unit gathered inside the recomputation), without
// reshard_after_forward, and at EP 2 x TP 2 (SP: every expert split over TP, then sharded).
TEST(Zero3Compose, MixtralAtExpertParallelOneAndTwoMatchesStage1BitwiseAndOneRank) {
  auto d = nxd::testing::test_temp_dir("nxd_zero3_moe_");
  const Out single = nxd::testing::train_rows(d, "one", with(kMixtral, {"backend.world_size=1"}));
  const std::string ep2 = "distributed_strategy.expert_model_parallel_size=2";
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"mixtral ep1 x dp4", {"distributed_strategy.expert_model_parallel_size=1"}},
      {"mixtral ep2 x dp4", {ep2}},
      {"mixtral ep2 x dp4 full recompute", {ep2, "model.activations_checkpoint_granularity=full"}},
      {"mixtral ep2 x dp4 no reshard", {ep2, "distributed_strategy.reshard_after_forward=false"}},
      {"mixtral ep2 x tp2 sp x dp2",
       {ep2, "distributed_strategy.tensor_model_parallel_size=2",
        "distributed_strategy.sequence_parallel=true"}},
      {"mixtral pp2 x dp2", {"distributed_strategy.pipeline_model_parallel_size=2"}}};
  for (const auto& [name, keys] : layouts)
    expect_stage3_matches(d, name, with(with(kMixtral, {"backend.world_size=4"}), keys), single, 2);
  // PP 2 x DP 4 x EP 2: each stage's experts a unit over expert-DP 2, chained with its chunk
  expect_stage3_matches(d, "mixtral pp2 x dp4 x ep2",
                        with(kMixtral, {"backend.world_size=8", ep2,
                                        "distributed_strategy.pipeline_model_parallel_size=2"}),
                        single, 2);
}

// Gradient accumulation (2 micro batches a step at EP 2 x DP 4): the first micro batch's backward
// runs under no_sync(), the experts' buckets too (their GradSync follows the dense one's), so the
// units launch their buckets in the last one only.
TEST(Zero3Compose, MixtralWithAccumulationMatchesStage1BitwiseAndOneRank) {
  auto d = nxd::testing::test_temp_dir("nxd_zero3_moe_accum_");
  const std::vector<std::string> gb = {"data.global_batch_size=16"};
  const Out single =
      nxd::testing::train_rows(d, "one", with(with(kMixtral, {"backend.world_size=1"}), gb));
  expect_stage3_matches(d, "mixtral ep2 x dp4 x 2 micro batches",
                        with(with(kMixtral, {"backend.world_size=4",
                                             "distributed_strategy.expert_model_parallel_size=2"}),
                             gb),
                        single, 2);
}

// A stage-3 checkpoint cut at step 4 of `layout` (8 steps, one parameter a bucket) resumes at
// stages 1 and 3 as the uninterrupted stage-3 run, bitwise; its model is in per-rank blocks
// (metadata.json "zero3", format 3) or written whole from the gathered units.
namespace {
void expect_checkpoint_resumes(const fs::path& d, const std::string& name,
                               const std::vector<std::string>& layout, bool blocks,
                               const std::vector<std::string>& other = {}) {
  const std::vector<std::string> base =
      with(layout, {"trainer.max_steps=8", "model.optim.sched.max_steps=8", kBucketPerParam});
  const Out whole = nxd::testing::train_rows(d, name + "_whole", with(base, {stage(3)}));
  nxd::testing::train_rows(
      d, name + "_cut",
      with(base, {stage(3), "trainer.max_steps=5",
                  "exp_manager.checkpoint_callback_params.every_n_train_steps=4"}));
  const std::string ckpt = (d / (name + "_cut") / "checkpoints" / "step_4").string();
  const auto meta = ckpt::read_metadata(ckpt);
  EXPECT_EQ(meta["parallel"].value("zero3", false), blocks) << name;
  if (blocks) {  // format 3: every DP rank's block file (world 4, no TP or PP), no whole files
    EXPECT_EQ(meta.value("format_version", 0), 3) << name;
    for (int r = 0; r < 4; ++r)
      EXPECT_TRUE(fs::exists(fs::path(ckpt) / ("model/zero3_dp_rank_0" + std::to_string(r) +
                                               "_tp_rank_00_pp_rank_00.safetensors")))
          << name << ": DP rank " << r;
    for (const auto& [rel, info] : meta["files"].items())
      EXPECT_NE(rel.rfind("model/dp_rank_", 0), 0u) << name << ": " << rel;
  }
  // whatever the loader checks, nxd-ckpt verify checks too
  EXPECT_NO_THROW(ckpt::verify_checkpoint(ckpt)) << name;
  const std::vector<double> tail(whole.rows.loss.begin() + 4, whole.rows.loss.end());
  for (const int to : {1, 3}) {
    const Out resumed = nxd::testing::train_rows(
        d, name + "_resumed" + std::to_string(to),
        with(base, {stage(to), "exp_manager.resume_from_checkpoint=" + ckpt}));
    ASSERT_EQ(resumed.rows.loss.size(), 4u);
    const double w = worst_rel(resumed.rows.loss, tail);
    std::printf("    stage-3 %s checkpoint (%s) resumed at stage %d: losses within %.3g\n",
                name.c_str(), blocks ? "per-rank blocks" : "gathered", to, w);
    EXPECT_EQ(w, 0.0) << name << ": stage 3 -> " << to;
  }
  if (other.empty()) return;
  // resumed at stage 3 in `other` layout (another EP degree: the experts found by name), within
  // the layouts' rounding
  const Out resharded = nxd::testing::train_rows(
      d, name + "_resharded",
      with(with(base, other), {stage(3), "exp_manager.resume_from_checkpoint=" + ckpt}));
  ASSERT_EQ(resharded.rows.loss.size(), 4u);
  const double w = worst_rel(resharded.rows.loss, tail);
  std::printf(
      "    stage-3 %s checkpoint resumed at stage 3 in another layout: losses within %.3g\n",
      name.c_str(), w);
  EXPECT_LT(w, 1e-5) << name << ": resharded";
}
}  // namespace

// A Mixtral's stage-3 checkpoint at EP 2 x DP 4 (per-rank blocks: the dense units' over DP, the
// experts' units' over expert-DP, each rank's in its one file) and at EP 1 x DP 4 (the experts in
// the layers' units), and a CP 2 x DP 2 one (blocks of the DP x CP group) resume at stages 1 and 3
// bitwise.
TEST(Zero3Compose, MixtralAndContextParallelCheckpointsResumeAtStages1And3Bitwise) {
  auto d = nxd::testing::test_temp_dir("nxd_zero3_moe_ckpt_");
  expect_checkpoint_resumes(
      d, "Mixtral EP2 x DP4",
      with(kMixtral, {"backend.world_size=4", "distributed_strategy.expert_model_parallel_size=2"}),
      /*blocks=*/true, {"distributed_strategy.expert_model_parallel_size=1"});
  expect_checkpoint_resumes(
      d, "Mixtral EP1 x DP4",
      with(kMixtral, {"backend.world_size=4", "distributed_strategy.expert_model_parallel_size=1"}),
      /*blocks=*/true);
  expect_checkpoint_resumes(
      d, "CP2 x DP2", {"backend.world_size=4", "distributed_strategy.context_parallel_size=2"},
      /*blocks=*/true);
}

// The allocator's HBM peak per rank of an optimizer-heavy Mixtral (AdamW, f32, 8 layers of hidden
// 128, 4 experts of ffn 256, short sequences) at EP 2 x DP 4: ZeRO-3 holds each layer's dense
// weights 1/4 and its experts 1/2 between uses, so its peak is below ZeRO-1's even though MoE
// reduces at the step (the full-size .grads exist at the end of the backward).
TEST(Zero3Compose, MixtralHbmPeakAtStage3IsBelowStage1) {
  auto d = nxd::testing::test_temp_dir("nxd_zero3_moe_peak_");
  auto at = [&](int s) {
    return nxd::testing::train_rows(
        d, "peak" + std::to_string(s),
        with(kMixtral,
             {"backend.world_size=4", "distributed_strategy.expert_model_parallel_size=2",
              "model.hidden_size=128", "model.ffn_hidden_size=256", "model.num_attention_heads=4",
              "data.seq_length=8", "data.micro_batch_size=1", "data.global_batch_size=4",
              "trainer.max_steps=3", stage(s)}),
        8);
  };
  const Out plain = at(0), one = at(1), two = at(2), three = at(3);
  std::printf(
      "    Mixtral EP2 x DP4 (8 layers, hidden 128, 4 experts): HBM peak per rank plain %.3f, "
      "ZeRO-1 %.3f, ZeRO-2 %.3f, ZeRO-3 %.3f MiB (%.3fx ZeRO-1's)\n",
      mib(plain.result.hbm_peak_bytes), mib(one.result.hbm_peak_bytes),
      mib(two.result.hbm_peak_bytes), mib(three.result.hbm_peak_bytes),
      static_cast<double>(three.result.hbm_peak_bytes) /
          static_cast<double>(one.result.hbm_peak_bytes));
  EXPECT_LE(worst_rel(three.rows.loss, one.rows.loss), 1e-6);
  EXPECT_LT(three.result.hbm_peak_bytes, one.result.hbm_peak_bytes);
}
