#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nxd/runtime/blas.h"
#include "nxd/train_app/train.h"
#include "support/files.h"
#include "train_util.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;
using nxd::testing::parallel_run;
using nxd::testing::read_rows;
using nxd::testing::tiny;
using nxd::testing::tiny_corpus;

namespace {

fs::path temp_dir(const std::string& tag) {
  return nxd::testing::test_temp_dir("nxd_train_test_" + tag);
}

std::vector<std::string> loss_columns(const fs::path& csv) {
  std::vector<std::string> out;  // "step,loss,val_loss": the first three columns of each row
  for (const auto& row : nxd::testing::read_csv(csv).rows)
    out.push_back(row.at(0) + "," + row.at(1) + "," + row.at(2));
  return out;
}

}  // namespace

TEST(Train, TinyRunLearnsAndWritesFiles) {
  auto d = temp_dir("");
  auto t = tiny(d / "out", tiny_corpus(d));
  TrainResult r = train(t, {.quiet = true});
  EXPECT_EQ(r.steps, 30);
  ASSERT_TRUE(r.initial_val_loss && r.final_val_loss);
  EXPECT_GT(*r.initial_val_loss, 5.0);  // ~ ln 256 at init
  EXPECT_LT(*r.final_val_loss, *r.initial_val_loss - 2.0);
  EXPECT_LT(r.last_loss, r.first_loss);
  EXPECT_TRUE(fs::exists(d / "out" / "metrics.csv"));
  EXPECT_TRUE(fs::exists(d / "out" / "config.yaml"));
  EXPECT_TRUE(fs::exists(d / "out" / "sample.txt"));
  EXPECT_EQ(r.sample.size(), t.generation.prompt.size() + 20);
  auto rows = loss_columns(d / "out" / "metrics.csv");
  ASSERT_EQ(rows.size(), 6u);  // steps 5, 10, ..., 30
  EXPECT_EQ(rows[0].substr(0, 2), "5,");
  EXPECT_EQ(rows[0].back(), ',');  // no validation at step 5: val_loss empty
  EXPECT_NE(rows[1].back(), ',');  // validation at step 10
  // config.yaml reloads to the same configuration
  Config back;
  back.merge_file((d / "out" / "config.yaml").string());
  EXPECT_EQ(back.values(), t.resolved.values());
}

TEST(Train, SeedChangesTheRun) {
  // (bitwise reproducibility across runs is tested on the binary: tests/tools)
  auto d = temp_dir("");
  auto corpus = tiny_corpus(d);
  train(tiny(d / "a", corpus, {"trainer.max_steps=5"}), {.quiet = true});
  train(tiny(d / "c", corpus, {"trainer.max_steps=5", "seed=5"}), {.quiet = true});
  EXPECT_NE(loss_columns(d / "a" / "metrics.csv"), loss_columns(d / "c" / "metrics.csv"));
}

TEST(Train, Bf16MatmulPrecisionLearnsIsReproducibleAndRestoresTheMode) {
  auto d = temp_dir("");
  auto corpus = tiny_corpus(d);
  auto r32 = train(tiny(d / "f", corpus, {"trainer.max_steps=10", "trainer.matmul_precision=fp32"}),
                   {.quiet = true});
  auto a = train(tiny(d / "a", corpus, {"trainer.max_steps=10", "trainer.matmul_precision=bf16"}),
                 {.quiet = true});
  auto b = train(tiny(d / "b", corpus, {"trainer.max_steps=10", "trainer.matmul_precision=bf16"}),
                 {.quiet = true});
  EXPECT_EQ(blas::matmul_precision(), blas::MatmulPrecision::fp32);  // restored after the run
  EXPECT_EQ(loss_columns(d / "a" / "metrics.csv"), loss_columns(d / "b" / "metrics.csv"));
  // bf16-rounded products: close to the f32 run, but not the same numbers
  EXPECT_NE(loss_columns(d / "a" / "metrics.csv"), loss_columns(d / "f" / "metrics.csv"));
  EXPECT_NEAR(a.first_loss, r32.first_loss, 2e-2);
  EXPECT_LT(a.last_loss, a.first_loss - 0.5);
  EXPECT_THROW(tiny(d / "x", corpus, {"trainer.matmul_precision=fp16"}), ConfigError);
}

TEST(Train, GradientAccumulationMatchesOneBigBatch) {
  auto d = temp_dir("");
  auto corpus = tiny_corpus(d);
  auto r1 = train(tiny(d / "a", corpus, {"trainer.max_steps=5", "data.micro_batch_size=8"}),
                  {.quiet = true});
  auto r2 = train(tiny(d / "b", corpus, {"trainer.max_steps=5", "data.micro_batch_size=2"}),
                  {.quiet = true});
  // same samples per step, the gradient of the same mean: equal up to rounding
  EXPECT_NEAR(r1.first_loss, r2.first_loss, 1e-5);
  EXPECT_NEAR(r1.last_loss, r2.last_loss, 1e-4);
}

TEST(Train, RandomDataAndSgd) {
  auto d = temp_dir("");
  auto t = tiny(d / "out", d,
                {"data.kind=random", "data.random_num_samples=64", "trainer.max_steps=4",
                 "model.optim.name=sgd", "model.optim.momentum=0.9", "model.optim.nesterov=true"});
  TrainResult r = train(t, {.quiet = true});
  EXPECT_EQ(r.steps, 4);
  EXPECT_TRUE(std::isfinite(r.last_loss));
  EXPECT_TRUE(r.sample.empty());  // no text sample for random tokens
}

TEST(Train, TimelineIsWrittenWhenAskedFor) {
  auto d = temp_dir("");
  auto corpus = tiny_corpus(d);
  const fs::path trace = d / "trace.json";
  const std::vector<std::string> short_run = {"trainer.max_steps=3", "trainer.val_check_interval=0",
                                              "generation.max_new_tokens=0"};
  auto with = short_run;
  with.push_back("backend.timeline=" + trace.string());
  TrainResult plain = train(tiny(d / "a", corpus, short_run), {.quiet = true});
  TrainResult traced = train(tiny(d / "b", corpus, with), {.quiet = true});
  EXPECT_EQ(traced.last_loss, plain.last_loss);  // the trace does not change the run
  std::ifstream in(trace);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(ss.str().find("\"name\":\"matmul"), std::string::npos) << ss.str().substr(0, 500);
  // Only the sim backend has a modeled clock; an unwritable path fails before training.
  auto mpi = with;
  mpi.push_back("backend.kind=mpi");
  EXPECT_THROW(tiny(d / "c", corpus, mpi), ConfigError);
  auto bad = short_run;
  bad.push_back("backend.timeline=" + (d / "no_such_dir" / "t.json").string());
  try {
    train(tiny(d / "e", corpus, bad), {.quiet = true});
    ADD_FAILURE() << "no error for an unwritable backend.timeline";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_dir"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d / "e" / "metrics.csv"));
}

TEST(Train, SummarizesSkippedFiles) {
  std::vector<SkippedFile> s{{"/x/a.dat", "binary: NUL byte at offset 3"},
                             {"/x/b.dat", "binary: NUL byte at offset 0"},
                             {"/x/a.u8", "duplicate: same file as /x/a"}};
  EXPECT_EQ(summarize_skipped(s), "skipped 3 file(s): 2 binary (a.dat, b.dat); 1 duplicate (a.u8)");
}

TEST(TrainParallel, SimTp2Dp2MatchesSingleRank) {
  auto d = temp_dir("");
  auto corpus = tiny_corpus(d);
  TrainResult r1 = train(tiny(d / "one", corpus, parallel_run({})), {.quiet = true});
  TrainResult r4 = train(tiny(d / "tp2dp2", corpus,
                              parallel_run({"backend.world_size=4",
                                            "distributed_strategy.tensor_model_parallel_size=2",
                                            "distributed_strategy.sequence_parallel=true"})),
                         {.quiet = true});
  EXPECT_EQ(r4.num_parameters, r1.num_parameters);  // the whole model, counted once
  nxd::testing::Rows a = read_rows(d / "one" / "metrics.csv"),
                     b = read_rows(d / "tp2dp2" / "metrics.csv");
  ASSERT_EQ(a.loss.size(), 20u);
  ASSERT_EQ(b.loss.size(), 20u);
  for (size_t i = 0; i < a.loss.size(); ++i)
    EXPECT_LE(std::abs(b.loss[i] - a.loss[i]) / std::abs(a.loss[i]), 1e-4) << "step " << i + 1;
  // the first step's gradient is that of the same parameters on the same batch
  EXPECT_LE(std::abs(b.grad_norm[0] - a.grad_norm[0]) / a.grad_norm[0], 1e-6)
      << b.grad_norm[0] << " vs " << a.grad_norm[0];
  EXPECT_LT(a.loss.back(), a.loss.front());  // and it learns (clipping was active)
  // the sim backend reports the modeled step time and memory; one rank runs without a device
  EXPECT_GT(r4.sim_step_seconds, 0.0);
  EXPECT_GT(r4.hbm_peak_bytes, 0);
  EXPECT_GT(b.sim_step.back(), 0.0);
  EXPECT_EQ(a.sim_step.back(), 0.0);
  EXPECT_FALSE(fs::exists(d / "tp2dp2" / "sample.txt"));
}

TEST(TrainParallel, DataParallelValidationMatchesSingleRank) {
  auto d = temp_dir("");
  auto corpus = tiny_corpus(d);
  auto extra = std::vector<std::string>{
      "trainer.max_steps=3",     "trainer.val_check_interval=3", "trainer.limit_val_batches=3",
      "data.micro_batch_size=2", "generation.max_new_tokens=4",  "generation.temperature=0"};
  TrainResult r1 = train(tiny(d / "one", corpus, extra), {.quiet = true});
  extra.push_back("backend.world_size=2");  // DP=2: 3 validation batches split 2 + 1
  TrainResult r2 = train(tiny(d / "dp2", corpus, extra), {.quiet = true});
  ASSERT_TRUE(r1.final_val_loss && r2.final_val_loss);
  EXPECT_NEAR(*r2.initial_val_loss, *r1.initial_val_loss, 1e-5 * *r1.initial_val_loss);
  EXPECT_NEAR(*r2.final_val_loss, *r1.final_val_loss, 1e-4 * *r1.final_val_loss);
  EXPECT_EQ(r2.sample, r1.sample);  // greedy, from nearly the same logits
  EXPECT_TRUE(fs::exists(d / "dp2" / "sample.txt"));
}

TEST(TrainParallel, ErrorOnOneRankReachesTheCaller) {
  auto d = temp_dir("");
  // the data path is missing: every rank fails alike; sim::launch rethrows the same error type
  auto t = tiny(d / "out", d / "missing.txt",
                {"backend.world_size=2", "distributed_strategy.tensor_model_parallel_size=2"});
  EXPECT_THROW(train(t, {.quiet = true}), UserError);
}
