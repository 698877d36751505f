// The Trainer / TrainingModule / Callback API: hook order, early stopping, the LR monitor, the
// loggers, errors from a module that breaks the contract, and the default output location.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nxd/collectives/sim/launch.h"
#include "nxd/train_app/train.h"
#include "support/files.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;

namespace {

TrainConfig tiny_config(const fs::path& out, std::vector<std::string> extra = {}) {
  Config c;
  for (std::string s :
       {"backend.world_size=1", "distributed_strategy.tensor_model_parallel_size=1",
        "distributed_strategy.sequence_parallel=false", "trainer.max_steps=6",
        "trainer.log_every_n_steps=2", "trainer.val_check_interval=3",
        "trainer.limit_val_batches=2", "trainer.num_threads=1", "trainer.matmul_precision=fp32",
        "data.kind=random", "data.random_num_samples=256", "data.seq_length=16",
        "data.global_batch_size=4", "data.micro_batch_size=2", "model.vocab_size=64",
        "model.num_layers=1", "model.hidden_size=16", "model.num_attention_heads=2",
        "generation.max_new_tokens=0"})
    c.apply_override(s);
  c.apply_override("exp_manager.exp_dir=" + out.string());
  for (auto& s : extra) c.apply_override(s);
  return resolve(c);
}

// Records every hook it sees, then does what the built-in module does.
class RecordingModule : public CausalLMModule {
 public:
  using CausalLMModule::CausalLMModule;
  std::vector<std::string>* log = nullptr;
  std::shared_ptr<Module> build_model() override {
    log->push_back("build_model");
    return CausalLMModule::build_model();
  }
  OptimizerSetup configure_optimizers() override {
    log->push_back("configure_optimizers");
    return CausalLMModule::configure_optimizers();
  }
  Tensor training_step(const Batch& b, int64_t i) override {
    log->push_back("training_step " + std::to_string(i));
    return CausalLMModule::training_step(b, i);
  }
  Tensor validation_step(const Batch& b, int64_t i) override {
    log->push_back("validation_step " + std::to_string(i));
    return lm().loss(b.ids, b.targets);
  }
  void on_train_batch_end(const StepOutput& out) override {
    log->push_back("on_train_batch_end " + std::to_string(out.step));
  }
  void on_fit_start() override { log->push_back("on_fit_start"); }
  void on_fit_end() override { log->push_back("on_fit_end"); }
};

class RecordingCallback : public Callback {
 public:
  std::vector<std::string>* log = nullptr;
  void on_fit_start(Trainer&, TrainingModule&) override { log->push_back("cb.on_fit_start"); }
  void on_train_batch_end(Trainer&, TrainingModule&, const StepOutput& o) override {
    log->push_back("cb.on_train_batch_end " + std::to_string(o.step));
  }
  void on_validation_end(Trainer&, TrainingModule&, int64_t step, double) override {
    log->push_back("cb.on_validation_end " + std::to_string(step));
  }
  void on_log(Trainer&, const MetricsRow& r) override {
    log->push_back("cb.on_log " + std::to_string(r.step));
  }
  void on_fit_end(Trainer&, TrainingModule&) override { log->push_back("cb.on_fit_end"); }
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

struct Fit {
  FitResult result;
  std::vector<std::string> log;
};

Fit fit_tiny(const TrainConfig& cfg, std::vector<std::shared_ptr<Callback>> extra = {},
             std::vector<std::shared_ptr<Logger>> loggers = {}) {
  Fit f;
  TrainData data = build_data(cfg);
  auto dm = make_data_module(data, cfg);
  RecordingModule m(cfg);
  m.log = &f.log;
  auto cb = std::make_shared<RecordingCallback>();
  cb->log = &f.log;
  TrainerOptions to = trainer_options(cfg);
  to.callbacks.push_back(cb);
  for (auto& e : extra) to.callbacks.push_back(e);
  to.loggers = std::move(loggers);
  Trainer t(std::move(to));
  f.result = t.fit(m, *dm);
  return f;
}

}  // namespace

TEST(TrainerApi, HooksRunInLightningOrder) {
  auto d = nxd::testing::test_temp_dir("nxd_trainer_api_");
  TrainConfig cfg = tiny_config(
      d, {"trainer.max_steps=3", "trainer.val_check_interval=2", "trainer.log_every_n_steps=5",
          "data.micro_batch_size=1", "data.global_batch_size=2", "trainer.limit_val_batches=1"});
  Fit f = fit_tiny(cfg);
  // 2 micro batches per step (accumulation), validation before training, at step 2 and the last
  const std::vector<std::string> want = {"build_model",
                                         "configure_optimizers",
                                         "cb.on_fit_start",
                                         "on_fit_start",
                                         "validation_step 0",
                                         "cb.on_validation_end 0",
                                         "training_step 0",
                                         "training_step 1",
                                         "on_train_batch_end 1",
                                         "cb.on_train_batch_end 1",
                                         "training_step 2",
                                         "training_step 3",
                                         "on_train_batch_end 2",
                                         "cb.on_train_batch_end 2",
                                         "validation_step 0",
                                         "cb.on_validation_end 2",
                                         "cb.on_log 2",
                                         "training_step 4",
                                         "training_step 5",
                                         "on_train_batch_end 3",
                                         "cb.on_train_batch_end 3",
                                         "validation_step 0",
                                         "cb.on_validation_end 3",
                                         "cb.on_log 3",
                                         "cb.on_fit_end",
                                         "on_fit_end"};
  EXPECT_EQ(join(f.log), join(want));
  EXPECT_EQ(f.result.steps, 3);
  EXPECT_TRUE(f.result.stop_reason.empty());
}

TEST(TrainerApi, TrainerMatchesNxdTrainLosses) {
  // the Trainer driven by hand and train() (nxd-train's path) give bitwise-equal losses
  auto d = nxd::testing::test_temp_dir("nxd_trainer_api_");
  TrainConfig cfg = tiny_config(d / "a");
  Fit f = fit_tiny(cfg);
  TrainResult r = train(tiny_config(d / "b"), {.quiet = true});
  EXPECT_EQ(f.result.first_loss, r.first_loss);
  EXPECT_EQ(f.result.last_loss, r.last_loss);
  ASSERT_TRUE(f.result.final_val_loss && r.final_val_loss);
  EXPECT_EQ(*f.result.final_val_loss, *r.final_val_loss);
}

TEST(TrainerApi, EarlyStoppingStopsWhenValLossStalls) {
  auto d = nxd::testing::test_temp_dir("nxd_trainer_api_");
  // lr 0: the validation loss never changes, so it stops after 1 + patience validations
  TrainConfig cfg = tiny_config(d, {"trainer.max_steps=40", "trainer.val_check_interval=2",
                                    "model.optim.lr=0", "model.optim.sched.min_lr=0"});
  auto es = std::make_shared<EarlyStopping>(EarlyStoppingOptions{"val_loss", 2, 0.0, "min"});
  Fit f = fit_tiny(cfg, {es});
  // validations at steps 0 (best), 2 (wait 1), 4 (wait 2), 6 (wait 3 > patience): stop at 6
  EXPECT_EQ(f.result.steps, 6) << f.result.stop_reason;
  EXPECT_NE(f.result.stop_reason.find("val_loss did not improve"), std::string::npos)
      << f.result.stop_reason;
  // the last step is validated and logged like max_steps would be
  EXPECT_EQ(f.log[f.log.size() - 3], "cb.on_log 6");
}

TEST(TrainerApi, EarlyStoppingKeepsGoingWhileImproving) {
  auto d = nxd::testing::test_temp_dir("nxd_trainer_api_");
  TrainConfig cfg = tiny_config(
      d, {"trainer.max_steps=12", "trainer.val_check_interval=2", "model.optim.lr=1e-2"});
  auto es = std::make_shared<EarlyStopping>(EarlyStoppingOptions{"loss", 100, 0.0, "min"});
  Fit f = fit_tiny(cfg, {es});
  EXPECT_EQ(f.result.steps, 12);
  EXPECT_TRUE(f.result.stop_reason.empty());
}

TEST(TrainerApi, EarlyStoppingRejectsBadOptions) {
  EXPECT_THROW(EarlyStopping(EarlyStoppingOptions{"accuracy", 1, 0.0, "min"}), ConfigError);
  EXPECT_THROW(EarlyStopping(EarlyStoppingOptions{"loss", 1, 0.0, "lowest"}), ConfigError);
  EXPECT_THROW(EarlyStopping(EarlyStoppingOptions{"loss", -1, 0.0, "min"}), ConfigError);
}

TEST(TrainerApi, EarlyStoppingFromConfigKeys) {
  auto d = nxd::testing::test_temp_dir("nxd_trainer_api_");
  TrainConfig cfg = tiny_config(
      d, {"trainer.max_steps=40", "trainer.val_check_interval=2", "model.optim.lr=0",
          "model.optim.sched.min_lr=0", "exp_manager.create_early_stopping_callback=true",
          "exp_manager.early_stopping_callback_params.patience=1"});
  TrainResult r = train(cfg, {.quiet = true});
  EXPECT_EQ(r.steps, 4);
  EXPECT_FALSE(r.stop_reason.empty());
}

TEST(TrainerApi, LearningRateMonitorLogsEveryGroup) {
  auto d = nxd::testing::test_temp_dir("nxd_trainer_api_");
  struct Capture : Logger {
    std::vector<std::map<std::string, double>> extras;
    void log_metrics(const MetricsRow&, const std::map<std::string, double>& e) override {
      extras.push_back(e);
    }
  };
  auto cap = std::make_shared<Capture>();
  Fit f = fit_tiny(tiny_config(d), {std::make_shared<LearningRateMonitor>()}, {cap});
  ASSERT_FALSE(cap->extras.empty());
  for (const auto& e : cap->extras) {
    EXPECT_EQ(e.count("lr-decay"), 1u);
    EXPECT_EQ(e.count("lr-no_decay"), 1u);
  }
}

TEST(TrainerApi, ModuleContractErrorsNameTheProblem) {
  auto d = nxd::testing::test_temp_dir("nxd_trainer_api_");
  TrainConfig cfg = tiny_config(d);
  TrainData data = build_data(cfg);
  auto dm = make_data_module(data, cfg);
  struct NoModel : CausalLMModule {
    using CausalLMModule::CausalLMModule;
    std::shared_ptr<Module> build_model() override { return nullptr; }
  };
  struct VectorLoss : CausalLMModule {
    using CausalLMModule::CausalLMModule;
    Tensor training_step(const Batch& b, int64_t) override {
      return sum(lm().forward(b.ids), {2});  // [B, S]: not a scalar
    }
  };
  Trainer t(trainer_options(cfg));
  NoModel a(cfg);
  EXPECT_THROW(t.fit(a, *dm), ConfigError);
  VectorLoss b(cfg);
  try {
    t.fit(b, *dm);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("scalar loss, got shape [2,16]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Trainer(TrainerOptions{.max_steps = -1}), ConfigError);  // 0: evaluate only
}

TEST(TrainerApi, RunsOnSimRanksWithTensorAndDataParallel) {
  // the same Trainer on 4 sim ranks (TP2 x DP2) gives the single rank's losses
  auto d = nxd::testing::test_temp_dir("nxd_trainer_api_");
  TrainConfig one = tiny_config(d / "one");
  TrainConfig four = tiny_config(
      d / "four", {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=2",
                   "distributed_strategy.sequence_parallel=true", "data.micro_batch_size=1"});
  TrainResult a = train(one, {.quiet = true});
  TrainResult b = train(four, {.quiet = true});
  EXPECT_NEAR(a.first_loss, b.first_loss, 1e-5 * std::abs(a.first_loss));
  EXPECT_NEAR(a.last_loss, b.last_loss, 1e-4 * std::abs(a.last_loss));
}

TEST(TrainerApi, DefaultOutputIsIgnoredByGit) {
  // the README's first command leaves `git status` clean: the default exp_dir is git-ignored
  const TrainConfig cfg = resolve(Config());
  const fs::path src = NXD_SOURCE_DIR;
  if (!fs::exists(src / ".git")) GTEST_SKIP() << "not a git checkout";
  if (std::system("git --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no git";
  EXPECT_TRUE(fs::path(cfg.out_dir).is_relative()) << cfg.out_dir;
  const std::string cmd = "cd '" + src.string() + "' && git check-ignore -q '" + cfg.out_dir +
                          "/metrics.csv' && git check-ignore -q '" + cfg.out_dir +
                          "/tensorboard/events.out.tfevents.1.host'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cfg.out_dir << " is not ignored by git";
}
