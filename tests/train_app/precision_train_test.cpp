// NxD Training's precision.type through nxd-train's keys, on the default corpus: 100 steps of
// mixed_precision track the fp32 losses within 2% at every logged step; bf16SR learns (its loss at
// step 100 within 5% of fp32's) and is bitwise reproducible; the sim device charges bf16 bytes and
// FLOPs (lower modeled step time; bf16SR, whose gradients and parameters are bf16, a lower HBM
// peak). The deprecated trainer.matmul_precision alias resolves to precision.type and a
// contradiction between them is an error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "nxd/train_app/train.h"
#include "train_util.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;

namespace {

struct PrecisionRun {
  TrainResult result;
  nxd::testing::Rows rows;
};

// 100 steps of a 2-layer Llama on the default corpus (fortunes) at TP2 x DP1 on the sim backend.
PrecisionRun run(const fs::path& dir, const std::string& precision) {
  Config c;
  for (std::string s :
       {"backend.world_size=2", "distributed_strategy.tensor_model_parallel_size=2",
        "trainer.max_steps=100", "trainer.log_every_n_steps=10", "trainer.val_check_interval=0",
        "data.seq_length=64", "data.global_batch_size=8", "model.num_layers=2",
        "model.hidden_size=128", "generation.max_new_tokens=0"})
    c.apply_override(s);
  c.apply_override("precision.type=" + precision);
  c.apply_override("exp_manager.exp_dir=" + (dir / precision).string());
  PrecisionRun r;
  r.result = train(resolve(c), {.quiet = true});
  r.rows = nxd::testing::read_rows(dir / precision / "metrics.csv");
  return r;
}

}  // namespace

TEST(PrecisionTrain, MixedPrecisionTracksFp32AndBf16SRLearns) {
  if (!fs::exists("/usr/share/games/fortunes")) GTEST_SKIP() << "no default corpus";
  auto d = nxd::testing::test_temp_dir("nxd_precision_");
  const PrecisionRun fp32 = run(d, "fp32");
  const PrecisionRun mixed = run(d, "mixed_precision");
  const PrecisionRun sr = run(d, "bf16SR");
  ASSERT_EQ(fp32.rows.loss.size(), 10u);
  ASSERT_EQ(mixed.rows.loss.size(), 10u);
  double worst = 0;
  for (size_t i = 0; i < fp32.rows.loss.size(); ++i)
    worst = std::max(worst, std::abs(mixed.rows.loss[i] - fp32.rows.loss[i]) / fp32.rows.loss[i]);
  const double sr_last =
      std::abs(sr.rows.loss.back() - fp32.rows.loss.back()) / fp32.rows.loss.back();
  std::printf(
      "    loss at step 100: fp32 %.4f, mixed_precision %.4f (largest relative difference "
      "over the logged steps %.4f), bf16SR %.4f (%.4f)\n",
      fp32.rows.loss.back(), mixed.rows.loss.back(), worst, sr.rows.loss.back(), sr_last);
  std::printf(
      "    modeled step: fp32 %.3f ms, mixed_precision %.3f ms, bf16SR %.3f ms; HBM peak "
      "%.2f / %.2f / %.2f MiB\n",
      fp32.result.sim_step_seconds * 1e3, mixed.result.sim_step_seconds * 1e3,
      sr.result.sim_step_seconds * 1e3, fp32.result.hbm_peak_bytes / 1048576.0,
      mixed.result.hbm_peak_bytes / 1048576.0, sr.result.hbm_peak_bytes / 1048576.0);
  EXPECT_LE(worst, 0.02);
  EXPECT_LT(sr.rows.loss.back(), sr.rows.loss.front());  // it learns
  EXPECT_LE(sr_last, 0.05);
  EXPECT_LT(mixed.result.sim_step_seconds, fp32.result.sim_step_seconds);
  EXPECT_LT(sr.result.sim_step_seconds, fp32.result.sim_step_seconds);
  EXPECT_LT(sr.result.hbm_peak_bytes, fp32.result.hbm_peak_bytes);
  // same seed and config: the same bits
  const PrecisionRun again = run(d / "again", "bf16SR");
  EXPECT_EQ(again.rows.loss, sr.rows.loss);
  EXPECT_EQ(again.rows.grad_norm, sr.rows.grad_norm);
}

TEST(PrecisionTrain, MatmulPrecisionAliasAndErrors) {
  auto resolved = [](std::vector<std::string> sets) {
    Config c;
    for (auto& s : sets) c.apply_override(s);
    return resolve(c).precision.type;
  };
  EXPECT_EQ(resolved({}), "autocast");
  EXPECT_EQ(resolved({"trainer.matmul_precision=fp32"}), "fp32");
  EXPECT_EQ(resolved({"trainer.matmul_precision=bf16"}), "autocast");
  EXPECT_EQ(resolved({"trainer.matmul_precision=bf16", "precision.type=mixed_precision"}),
            "mixed_precision");
  try {
    resolved({"trainer.matmul_precision=fp32", "precision.type=bf16SR"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("contradicts precision.type=bf16SR"), std::string::npos)
        << e.what();
  }
  try {
    resolved({"precision.type=fp16"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("precision.type"), std::string::npos) << e.what();
  }
}
