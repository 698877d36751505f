#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "nxd/trainer/train.h"

using namespace nxd;
using namespace nxd::trainer;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() /
               (std::string("nxd_train_test_") +
                ::testing::UnitTest::GetInstance()->current_test_info()->name() + tag);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A small repetitive text a tiny model learns within a few dozen steps.
fs::path tiny_corpus(const fs::path& dir) {
  std::ofstream f(dir / "corpus.txt");
  for (int i = 0; i < 300; ++i) f << "the cat sat on the mat. " << (i % 7) << " dogs ran.\n";
  return dir / "corpus.txt";
}

TrainConfig tiny(const fs::path& out, const fs::path& corpus, std::vector<std::string> extra = {}) {
  Config c;
  for (std::string s :
       {"trainer.max_steps=30", "trainer.log_every_n_steps=5", "trainer.val_check_interval=10",
        "trainer.limit_val_batches=2", "trainer.num_threads=1", "data.seq_length=32",
        "data.micro_batch_size=8", "data.global_batch_size=8", "model.num_layers=1",
        "model.hidden_size=32", "model.num_attention_heads=2", "model.optim.lr=1e-2",
        "model.optim.sched.warmup_steps=3", "generation.max_new_tokens=20"})
    c.apply_override(s);
  c.apply_override("data.path=" + corpus.string());
  c.apply_override("exp_manager.exp_dir=" + out.string());
  for (auto& s : extra) c.apply_override(s);
  return resolve(c);
}

std::vector<std::string> loss_columns(const fs::path& csv) {
  std::ifstream in(csv);
  std::string line;
  std::vector<std::string> out;
  std::getline(in, line);
  while (std::getline(in, line)) {
    // step,loss,val_loss: the first three columns
    size_t p = 0;
    for (int k = 0; k < 3; ++k) p = line.find(',', p) + 1;
    out.push_back(line.substr(0, p - 1));  // "step,loss,val_loss"
  }
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

TEST(Train, SummarizesSkippedFiles) {
  std::vector<SkippedFile> s{{"/x/a.dat", "binary: NUL byte at offset 3"},
                             {"/x/b.dat", "binary: NUL byte at offset 0"},
                             {"/x/a.u8", "duplicate: same file as /x/a"}};
  EXPECT_EQ(summarize_skipped(s), "skipped 3 file(s): 2 binary (a.dat, b.dat); 1 duplicate (a.u8)");
}
