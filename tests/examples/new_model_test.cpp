// examples/new_model: the GPT-2 a user defines outside the library trains on the library's
// trainer, learns, and at TP2 x DP2 on sim ranks gives the single rank's losses.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "gpt2.h"
#include "nxd/trainer/train.h"
#include "support/files.h"

using namespace nxd;
using namespace nxd::trainer;
namespace fs = std::filesystem;

namespace {

TrainConfig gpt2_config(const fs::path& out, const fs::path& corpus,
                        const std::vector<std::string>& extra) {
  Config c;
  for (std::string s : {"model.arch=gpt2",
                        "model.tie_word_embeddings=true",
                        "model.init_method=scaled_normal",
                        "distributed_strategy.sequence_parallel=false",
                        "backend.world_size=1",
                        "distributed_strategy.tensor_model_parallel_size=1",
                        "trainer.max_steps=20",
                        "trainer.log_every_n_steps=1",
                        "trainer.val_check_interval=20",
                        "trainer.num_threads=1",
                        "trainer.matmul_precision=fp32",
                        "data.seq_length=32",
                        "data.micro_batch_size=2",
                        "data.global_batch_size=8",
                        "model.num_layers=2",
                        "model.hidden_size=32",
                        "model.num_attention_heads=2",
                        "model.optim.lr=1e-2",
                        "model.optim.sched.warmup_steps=3",
                        "generation.max_new_tokens=0"})
    c.apply_override(s);
  c.apply_override("data.path=" + corpus.string());
  c.apply_override("exp_manager.exp_dir=" + out.string());
  for (const auto& s : extra) c.apply_override(s);
  return resolve(c);
}

std::vector<double> losses(const fs::path& csv) {
  std::vector<double> v;
  for (const auto& row : nxd::testing::read_csv(csv).rows) v.push_back(std::stod(row.at(1)));
  return v;
}

TrainResult run(const TrainConfig& c) {
  return train(c, {.quiet = true},
               [](const TrainConfig& tc) { return std::make_unique<gpt2::LMModule>(tc); });
}

}  // namespace

TEST(NewModel, Gpt2LearnsAndTp2Dp2MatchesOneRank) {
  auto d = nxd::testing::test_temp_dir("nxd_new_model_test");
  {
    std::ofstream f(d / "corpus.txt");
    for (int i = 0; i < 300; ++i) f << "the cat sat on the mat. " << (i % 7) << " dogs ran.\n";
  }
  TrainResult one = run(gpt2_config(d / "one", d / "corpus.txt", {}));
  TrainResult four = run(
      gpt2_config(d / "tp2dp2", d / "corpus.txt",
                  {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=2"}));
  ASSERT_TRUE(one.initial_val_loss && one.final_val_loss);
  EXPECT_GT(*one.initial_val_loss, 5.0);  // ~ ln 256
  EXPECT_LT(*one.final_val_loss, *one.initial_val_loss - 2.0);
  EXPECT_EQ(four.num_parameters, one.num_parameters);
  const auto a = losses(d / "one" / "metrics.csv"), b = losses(d / "tp2dp2" / "metrics.csv");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), a.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(b[i] - a[i]) / a[i]);
  EXPECT_LE(worst, 1e-4) << "largest relative loss difference " << worst;
  // parameter names are GPT-2's
  auto m = gpt2_config(d / "x", d / "corpus.txt", {});
  gpt2::GPT2LMHeadModel model(model_config(m));
  EXPECT_NO_THROW(model.get_parameter("transformer.h.1.ln_2.weight"));
  EXPECT_NO_THROW(model.get_parameter("transformer.wpe.weight"));
}
