// Resume through the Trainer: a run stopped after step k by max_steps and resumed from its
// ModelCheckpoint (TrainerOptions::ckpt_path) gives bitwise the losses of an uninterrupted run for
// every later step — model, AdamW state, LR schedule position, data order across an epoch
// boundary and the dropout RNG restored — on one rank and on sim TP2 x DP2. Plus the callback's
// retention (save_top_k, newest or best by monitor) and its option errors. A rank killed the
// moment a step's checkpoint is complete leaves that step's metrics row written.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "checkpoint/ckpt_util.h"
#include "nxd/trainer/checkpointing.h"
#include "nxd/trainer/trainer.h"
#include "support/files.h"
#include "support/ranks.h"

namespace nxd::trainer {
namespace {
namespace fs = std::filesystem;

class TinyLM : public TrainingModule {
 public:
  explicit TinyLM(int tp, double dropout = 0.1) : tp_(tp), dropout_(dropout) {}
  std::shared_ptr<Module> build_model() override {
    ModelConfig c = nxd::testing::ckpt_model_config(tp_);
    c.dropout = dropout_;  // the RNG counter must be restored too
    lm_ = make_causal_lm(c, 3);
    return lm_;
  }
  Tensor training_step(const Batch& b, int64_t) override { return lm_->loss(b.ids, b.targets); }
  OptimizerSetup configure_optimizers() override {
    OptimizerSetup s;
    s.optimizer = std::make_unique<optim::AdamW>(param_groups_by_weight_decay(model(), 1e-2, 0.01));
    s.schedule.emplace(nxd::testing::ckpt_schedule());
    return s;
  }

 private:
  int tp_;
  double dropout_;
  std::shared_ptr<CausalLM> lm_;
};

struct Record : Callback {
  std::map<int64_t, double> loss;
  void on_train_batch_end(Trainer&, TrainingModule&, const StepOutput& out) override {
    loss[out.step] = out.loss;
  }
};

// One fit on the current rank: `steps` steps, optionally saving every 3 and/or resuming.
std::map<int64_t, double> run(int tp, int64_t steps, const std::string& save_dir,
                              const std::string& resume, int64_t accumulate = 1,
                              double dropout = 0.1) {
  current_context().rng().set_seed(7);
  TinyLM module(tp, dropout);
  // 24 samples: 12 micro batches of 2 per epoch on one rank, 6 per DP rank at DP 2
  DatasetDataModule data(std::make_shared<RandomDataset>(24, 8, 32, 11), nullptr,
                         DatasetDataOptions{2, 5, true});
  auto rec = std::make_shared<Record>();
  TrainerOptions o;
  o.nxd.tensor_parallel_size = tp;
  o.max_steps = steps;
  o.accumulate_grad_batches = accumulate;
  o.log_every_n_steps = 100;
  o.gradient_clip_val = 1.0;
  o.callbacks.push_back(rec);
  if (!save_dir.empty())
    o.callbacks.push_back(std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions{.dirpath = save_dir, .every_n_train_steps = 3, .save_top_k = 2}));
  Trainer(o).fit(module, data, resume);  // Lightning's fit(model, datamodule, ckpt_path)
  return rec->loss;
}

void expect_resume_matches(int tp, int world, const fs::path& dir) {
  std::map<int64_t, double> whole, first, rest;
  nxd::testing::run_ranks(world, [&] {
    auto w = run(tp, 10, "", "");
    auto f = run(tp, 7, (dir / "ckpt").string(), "");  // saves step_3, step_6, step_7 (last)
    auto r = run(tp, 10, "", (dir / "ckpt" / "step_6").string());
    if (current_context().rank() == 0) whole = w, first = f, rest = r;
  });
  ASSERT_EQ(whole.size(), 10u);
  ASSERT_EQ(rest.size(), 4u) << "the resumed run starts after step 6";
  for (const auto& [s, l] : first) EXPECT_EQ(l, whole.at(s)) << "step " << s;
  for (const auto& [s, l] : rest) EXPECT_EQ(l, whole.at(s)) << "resumed, step " << s;
  // save_top_k = 2 kept the newest two
  auto tags = ckpt::list_checkpoints(dir / "ckpt");
  ASSERT_EQ(tags.size(), 2u);
  EXPECT_EQ(tags[0].tag, "step_6");
  EXPECT_EQ(tags[1].tag, "step_7");
}

TEST(TrainerResume, BitwiseLikeAnUninterruptedRunOneRank) {
  const nxd::testing::ScratchDir dir("nxd_resume_");
  expect_resume_matches(1, 1, dir.path);
}

TEST(TrainerResume, BitwiseLikeAnUninterruptedRunTp2Dp2) {
  const nxd::testing::ScratchDir dir("nxd_resume_");
  expect_resume_matches(2, 4, dir.path);
}

// A checkpoint of TP2 x DP2 resumes on one rank (resharded; the data position converted to DP
// 1, two micro batches accumulated so the global batch holds the same samples; no dropout, whose
// masks depend on the layout): steps 7..10 track the uninterrupted TP2 x DP2 run within 1e-4
// (other reduction orders).
TEST(TrainerResume, ResumesAtOtherDegrees) {
  const nxd::testing::ScratchDir dir("nxd_resume_");
  std::map<int64_t, double> whole, rest;
  nxd::testing::run_ranks(4, [&] {
    auto f = run(2, 7, (dir.path / "ckpt").string(), "", 1, 0.0);
    auto w = run(2, 10, "", "", 1, 0.0);
    if (current_context().rank() == 0) whole = w;
  });
  rest = run(1, 10, "", (dir.path / "ckpt" / "step_6").string(), 2, 0.0);
  ASSERT_EQ(rest.size(), 4u);
  for (const auto& [s, l] : rest) EXPECT_NEAR(l, whole.at(s), 1e-4 * std::abs(whole.at(s))) << s;
}

TEST(TrainerResume, TopKByMonitorAndOptionErrors) {
  const nxd::testing::ScratchDir dir("nxd_resume_");
  TinyLM module(1);
  DatasetDataModule data(std::make_shared<RandomDataset>(24, 8, 32, 11), nullptr,
                         DatasetDataOptions{2, 5, true});
  auto rec = std::make_shared<Record>();
  auto cb = std::make_shared<ModelCheckpoint>(ModelCheckpointOptions{
      .dirpath = dir.path.string(), .every_n_train_steps = 1, .save_top_k = 2, .monitor = "loss"});
  TrainerOptions o;
  o.max_steps = 6;
  o.callbacks = {rec, cb};
  Trainer(o).fit(module, data);
  // the two lowest training losses are kept
  std::vector<std::pair<double, int64_t>> by_loss;
  for (const auto& [s, l] : rec->loss) by_loss.emplace_back(l, s);
  std::sort(by_loss.begin(), by_loss.end());
  std::set<std::string> want = {"step_" + std::to_string(by_loss[0].second),
                                "step_" + std::to_string(by_loss[1].second)};
  std::set<std::string> got;
  for (const auto& t : ckpt::list_checkpoints(dir.path)) got.insert(t.tag);
  EXPECT_EQ(got, want);
  EXPECT_THROW(ModelCheckpoint({.dirpath = ""}), ConfigError);
  EXPECT_THROW(ModelCheckpoint({.dirpath = "x", .save_top_k = 0}), ConfigError);
  EXPECT_THROW(ModelCheckpoint({.dirpath = "x", .monitor = "acc"}), ConfigError);
  // resuming from a folder without checkpoints is an error naming it
  TrainerOptions bad;
  bad.max_steps = 2;
  bad.ckpt_path = (dir.path / "none").string();
  TinyLM m2(1);
  EXPECT_THROW(Trainer(bad).fit(m2, data), ckpt::CheckpointError);
}

// A host dying at the first moment step_3 is complete (a callback after ModelCheckpoint throws in
// every hook once it sees step_3 committed): step 3's metrics row is already in metrics.csv, and
// the run resumed from step_3 logs 4..6, so the two files hold every step exactly once. Before
// the fix the checkpoint was saved ahead of the row and step 3 had no row anywhere.
struct DieOnceCommitted : Callback {
  fs::path ckpt;
  void check() {
    if (ckpt::newest_checkpoint(ckpt) == "step_3") throw CommError("[test] host died");
  }
  void on_train_batch_end(Trainer&, TrainingModule&, const StepOutput&) override { check(); }
  void on_log(Trainer&, const MetricsRow&) override { check(); }
  void on_step_end(Trainer&, TrainingModule&, const StepOutput&) override { check(); }
};

TEST(TrainerResume, AKillRightAfterACheckpointKeepsItsStepsMetricsRow) {
  const nxd::testing::ScratchDir dir("nxd_resume_");
  const fs::path ckpt = dir.path / "ckpt";
  auto fit = [&](const std::string& logs, const std::string& resume, bool die) {
    current_context().rng().set_seed(7);
    TinyLM module(1);
    DatasetDataModule data(std::make_shared<RandomDataset>(24, 8, 32, 11), nullptr,
                           DatasetDataOptions{2, 5, true});
    TrainerOptions o;
    o.max_steps = 6;
    o.log_every_n_steps = 1;
    o.callbacks.push_back(std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions{.dirpath = ckpt.string(), .every_n_train_steps = 3}));
    if (die) {
      auto d = std::make_shared<DieOnceCommitted>();
      d->ckpt = ckpt;
      o.callbacks.push_back(d);
    }
    o.loggers.push_back(std::make_shared<CSVLogger>((dir.path / logs).string()));
    Trainer(o).fit(module, data, resume);
  };
  EXPECT_THROW(fit("first", "", true), CommError);
  ASSERT_EQ(ckpt::newest_checkpoint(ckpt), "step_3");
  fit("resumed", ckpt.string(), false);
  std::vector<std::string> steps;
  for (const char* part : {"first", "resumed"})
    for (const auto& row : nxd::testing::read_csv(dir.path / part / "metrics.csv").rows)
      steps.push_back(row.at(0));
  EXPECT_EQ(steps, (std::vector<std::string>{"1", "2", "3", "4", "5", "6"}));
}

}  // namespace
}  // namespace nxd::trainer
