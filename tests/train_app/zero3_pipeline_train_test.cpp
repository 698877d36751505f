// distributed_strategy.zero_stage=3 with pipeline_model_parallel_size=2 through nxd-train
// (docs/design/fsdp.md, "Composition"): PP 2 x DP 2 under GPipe, 1F1B and interleaved (two chunks
// a rank) and TP 2 x PP 2 x DP 2 give ZeRO-1's losses bitwise (one parameter per bucket: the same
// bucket layout) and plain DP's within 1e-6 over 20 clipped steps; the allocator's HBM peak per
// rank against ZeRO-1's and plain DP's on an optimizer-heavy model at 2 and 8 microbatches; a
// PP 2 x DP 2 stage-3 checkpoint resumes at stages 1 and 3 as the uninterrupted run, bitwise, and
// at PP 1 x DP 2 within 1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/layout.h"
#include "nxd/runtime/error.h"
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

const char* kPp2 = "distributed_strategy.pipeline_model_parallel_size=2";

Out run(const fs::path& d, const std::string& name, std::vector<std::string> extra,
        int layers = 4) {
  return nxd::testing::train_rows(d, name, std::move(extra), layers);
}

}  // namespace

TEST(Zero3PipelineTrain, MatchesZero1BitwiseAndPlainDpUnderEverySchedule) {
  auto d = nxd::testing::test_temp_dir("nxd_zero3_pp_train_");
  const std::string tp1 = "distributed_strategy.tensor_model_parallel_size=1";
  const std::vector<std::vector<std::string>> layouts = {
      {"backend.world_size=4", tp1, kPp2, "distributed_strategy.pipeline_schedule=gpipe"},
      {"backend.world_size=4", tp1, kPp2, "distributed_strategy.pipeline_schedule=1f1b"},
      {"backend.world_size=4", tp1, kPp2, "distributed_strategy.pipeline_schedule=interleaved",
       "distributed_strategy.virtual_pipeline_model_parallel_size=2"},
      {"backend.world_size=8", "distributed_strategy.tensor_model_parallel_size=2", kPp2,
       "distributed_strategy.sequence_parallel=true"}};
  for (size_t i = 0; i < layouts.size(); ++i) {
    auto stage = [&](int s) {
      return nxd::testing::train_at_stage(d, layouts[i], s, std::to_string(i), 4);
    };
    const Out plain = stage(0), one = stage(1), three = stage(3);
    const double wl = worst_rel(three.rows.loss, plain.rows.loss);
    const double wg = worst_rel(three.rows.grad_norm, plain.rows.grad_norm);
    const double w1 = worst_rel(three.rows.loss, one.rows.loss);
    const double g1 = worst_rel(three.rows.grad_norm, one.rows.grad_norm);
    std::printf(
        "    layout %zu (%s): ZeRO-3 vs plain DP losses %.3g, grad norms %.3g, vs ZeRO-1 losses "
        "%.3g, norms %.3g; HBM peak plain %.3f, ZeRO-1 %.3f, ZeRO-3 %.3f MiB\n",
        i, layouts[i][3].c_str(), wl, wg, w1, g1, mib(plain.result.hbm_peak_bytes),
        mib(one.result.hbm_peak_bytes), mib(three.result.hbm_peak_bytes));
    ASSERT_EQ(three.rows.loss.size(), 20u);
    EXPECT_LE(wl, 1e-6) << "layout " << i;
    EXPECT_LE(wg, 1e-6) << "layout " << i;
    EXPECT_EQ(w1, 0.0) << "layout " << i << ": ZeRO-3 is bitwise ZeRO-1 with its buckets";
    EXPECT_EQ(g1, 0.0) << "layout " << i;
  }
}

// AdamW in f32 on wide layers and short sequences (parameters, gradients and state dominate),
// PP 2 with 1F1B at DP 2 and DP 4, 2 and 8 microbatches. Under a pipeline the reduction waits for
// the step, so the full-size .grads of a rank's layers accumulate over the microbatches (as
// ZeRO-1's buckets do) and ZeRO-2's persistent gradient shard (1/DP of them) comes on top: ZeRO-3
// saves (1 - 1/DP) of the layers' parameters and pays 1/DP of their gradients, two gathered
// layers and two bucket buffers. At DP 2 that is no saving against ZeRO-1; at DP 4 it is.
TEST(Zero3PipelineTrain, HbmPeakAgainstZero1AndPlainDp) {
  auto d = nxd::testing::test_temp_dir("nxd_zero3_pp_peak_");
  for (const int dp : {2, 4})
    for (const int m : {2, 8}) {
      auto stage = [&](int s) {
        return run(d, "peak" + std::to_string(s) + "_" + std::to_string(dp) + std::to_string(m),
                   {"backend.world_size=" + std::to_string(2 * dp),
                    "distributed_strategy.tensor_model_parallel_size=1", kPp2,
                    "model.hidden_size=128", "model.num_attention_heads=4", "data.seq_length=8",
                    "data.micro_batch_size=1", "data.global_batch_size=" + std::to_string(dp * m),
                    "trainer.max_steps=3", "distributed_strategy.zero_stage=" + std::to_string(s)},
                   16);
      };
      const Out plain = stage(0), one = stage(1), three = stage(3);
      std::printf(
          "    HBM peak per rank at PP 2 x DP %d, %d microbatches (16 layers, hidden 128, f32 "
          "AdamW): plain %.3f, ZeRO-1 %.3f, ZeRO-3 %.3f MiB (%.3fx plain DP's, %.3fx ZeRO-1's)\n",
          dp, m, mib(plain.result.hbm_peak_bytes), mib(one.result.hbm_peak_bytes),
          mib(three.result.hbm_peak_bytes),
          static_cast<double>(three.result.hbm_peak_bytes) / plain.result.hbm_peak_bytes,
          static_cast<double>(three.result.hbm_peak_bytes) / one.result.hbm_peak_bytes);
      EXPECT_LE(worst_rel(three.rows.loss, plain.rows.loss), 1e-6) << dp << " " << m;
      EXPECT_LT(three.result.hbm_peak_bytes, plain.result.hbm_peak_bytes) << dp << " " << m;
      if (dp == 4) EXPECT_LT(three.result.hbm_peak_bytes, one.result.hbm_peak_bytes) << m;
    }
}

// A large vocabulary (32768, f32: the embedding and the untied head E = 16 MiB each) at PP 2 x
// DP 4 with 8 microbatches under 1F1B and GPipe. The first stage's embedding is a lookup unit
// gathered for each microbatch's lookup: that stage's peak drops by (1 - 1/DP) E against ZeRO-1
// (1F1B 76.69 -> 64.68 MiB, GPipe 80.44 -> 67.81). The last stage keeps its final norm and head
// whole (optimizer_config.zero3_pipeline_head's default): sharded, its gathers would lie beside
// the head's accumulated .grad at that stage's peak, E/DP above whole (measured with them sharded:
// 81.68 and 91.47 MiB against 77.68 and 87.47; docs/design/fsdp.md). So ZeRO-3's largest peak is
// at most ZeRO-1's, with ZeRO-1's losses.
TEST(Zero3PipelineTrain, LargeVocabularyFirstStageBelowZero1AndNoStageAbove) {
  auto d = nxd::testing::test_temp_dir("nxd_zero3_pp_vocab_");
  const int64_t e = int64_t{32768} * 128 * 4;  // the embedding's bytes
  for (const char* schedule : {"1f1b", "gpipe"}) {
    auto stage = [&](int s) {
      return run(d, std::string(schedule) + std::to_string(s),
                 {"backend.world_size=8", "distributed_strategy.tensor_model_parallel_size=1", kPp2,
                  "model.hidden_size=128", "model.num_attention_heads=4", "data.seq_length=8",
                  "data.micro_batch_size=1", "data.global_batch_size=32", "trainer.max_steps=3",
                  "data.kind=random", "model.vocab_size=32768",
                  std::string("distributed_strategy.pipeline_schedule=") + schedule,
                  "distributed_strategy.zero_stage=" + std::to_string(s)},
                 16);
    };
    const Out one = stage(1), three = stage(3);
    const double wl = worst_rel(three.rows.loss, one.rows.loss);
    // the ranks of each pipeline stage (pipeline rank outermost: ranks 0-3 are the first stage)
    auto stage_peak = [](const Out& o, size_t first) {
      int64_t m = 0;
      for (size_t r = first; r < first + 4 && r < o.result.rank_peak_bytes.size(); ++r)
        m = std::max(m, o.result.rank_peak_bytes[r]);
      return mib(m);
    };
    std::printf(
        "    PP 2 x DP 4 %s, 8 microbatches, vocabulary 32768: HBM peak ZeRO-1 %.2f, ZeRO-3 %.2f "
        "MiB (%.3fx; first / last stage ZeRO-1 %.2f / %.2f, ZeRO-3 %.2f / %.2f); losses within "
        "%.3g\n",
        schedule, mib(one.result.hbm_peak_bytes), mib(three.result.hbm_peak_bytes),
        static_cast<double>(three.result.hbm_peak_bytes) / one.result.hbm_peak_bytes,
        stage_peak(one, 0), stage_peak(one, 4), stage_peak(three, 0), stage_peak(three, 4), wl);
    EXPECT_LE(wl, 1e-6) << schedule;
    EXPECT_LE(three.result.hbm_peak_bytes, one.result.hbm_peak_bytes) << schedule;
    // the first stage's peak at least (1 - 1/DP) E - 1 MiB below ZeRO-1's (it is 12.0 MiB)
    EXPECT_LT(stage_peak(three, 0), stage_peak(one, 0) - mib(e * 3 / 4) + 1.0) << schedule;
  }
}

// A PP 2 x DP 2 stage-3 checkpoint (each stage's DP ranks writing their blocks of its chunks'
// units, format 3; ZeRO-1's sharded optimizer files) resumes at stage 3 and stage 1 as the
// uninterrupted run, bitwise, and at PP 1 x DP 2 (the reshard across pipeline degrees) within 1e-6.
TEST(Zero3PipelineTrain, CheckpointResumesAtStages1And3AndAnotherPipelineDegree) {
  auto d = nxd::testing::test_temp_dir("nxd_zero3_pp_ckpt_");
  const std::vector<std::string> base = {"distributed_strategy.tensor_model_parallel_size=1",
                                         "trainer.max_steps=8", "model.optim.sched.max_steps=8",
                                         kBucketPerParam};
  auto args = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return extra;
  };
  const std::vector<std::string> pp2 = {"backend.world_size=4", kPp2,
                                        "distributed_strategy.zero_stage=3"};
  auto with = [&](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return args(a);
  };
  const Out whole = run(d, "whole", with(pp2, {}));
  run(d, "cut",
      with(pp2, {"trainer.max_steps=5",
                 "exp_manager.checkpoint_callback_params.every_n_train_steps=4"}));
  const std::string ckpt = (d / "cut" / "checkpoints" / "step_4").string();
  EXPECT_TRUE(ckpt::read_metadata(ckpt)["parallel"].value("zero3", false));
  for (int pp = 0; pp < 2; ++pp)
    for (int dp = 0; dp < 2; ++dp)
      EXPECT_TRUE(fs::exists(
          fs::path(ckpt) /
          ckpt::detail::shard_file(
              "model",
              {.dp_rank = dp, .pp_rank = pp, .files = ckpt::detail::ShardFiles::zero3_blocks})))
          << "pp " << pp << " dp " << dp;
  const std::vector<double> tail(whole.rows.loss.begin() + 4, whole.rows.loss.end());
  const std::string resume = "exp_manager.resume_from_checkpoint=" + ckpt;
  for (const int to : {3, 1}) {
    const Out r = run(d, "resumed" + std::to_string(to),
                      args({"backend.world_size=4", kPp2,
                            "distributed_strategy.zero_stage=" + std::to_string(to), resume}));
    ASSERT_EQ(r.rows.loss.size(), 4u);
    const double w = worst_rel(r.rows.loss, tail);
    std::printf("    PP2 x DP2 stage-3 checkpoint resumed at stage %d: losses within %.3g\n", to,
                w);
    EXPECT_EQ(w, 0.0) << "stage 3 -> " << to;
  }
  const Out pp1 = run(d, "resumed_pp1",
                      args({"backend.world_size=2", "distributed_strategy.zero_stage=3", resume}));
  ASSERT_EQ(pp1.rows.loss.size(), 4u);
  const double w = worst_rel(pp1.rows.loss, tail);
  std::printf(
      "    PP2 x DP2 stage-3 checkpoint resumed at PP 1 x DP 2, stage 3: losses within %.3g\n", w);
  EXPECT_LE(w, 1e-6);
}
