// Manual optimization (trainer/manual.h): the Neuron-PT-Lightning developer guide's
// training_step (manual_backward, the optimizer and scheduler stepped every grad_accum_steps micro
// batches, the loss reduced over DP by the module) against the automatic loop on the same data:
// the same losses and grad norms, and bitwise the same weights; and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/train_app/train.h"
#include "support/compare.h"
#include "train_app/train_util.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;

namespace {

// The guide's NeuronLlamaLTModule.training_step and on_train_batch_end, in C++.
class LightningGuideModule : public CausalLMModule {
 public:
  LightningGuideModule(TrainConfig cfg, int64_t grad_accum_steps, double clip)
      : CausalLMModule(std::move(cfg)), grad_accum_steps_(grad_accum_steps), clip_(clip) {
    automatic_optimization = false;
  }
  std::vector<double> logged_losses;

  Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    should_print_ = false;
    Tensor loss = lm().loss(batch.ids, batch.targets) / static_cast<double>(grad_accum_steps_);
    manual_backward(loss);
    averaged_loss_ += loss.item();
    if ((batch_idx + 1) % grad_accum_steps_ == 0) {
      should_print_ = true;
      const int dp = parallel_state::get_data_parallel_size();
      double loss_reduced = averaged_loss_ / dp;
      parallel_state::get_data_parallel_group().all_reduce(&loss_reduced, &loss_reduced, 1,
                                                           DType::f64, ReduceOp::sum);
      averaged_loss_ = 0;
      ManualOptimizer& optimizer = optimizers();
      LRScheduler& scheduler = lr_schedulers();
      if (clip_ > 0) clip_gradients(clip_);
      optimizer.step();
      optimizer.zero_grad();
      scheduler.step();
      loss_ = loss_reduced;
    }
    return loss;
  }
  void on_train_batch_end(const StepOutput&) override {
    if (!should_print_) return;
    trainer().log("loss", loss_);
    trainer().log("global_step", static_cast<double>(trainer().global_step()));
    logged_losses.push_back(loss_);
  }

 private:
  int64_t grad_accum_steps_;
  double clip_;
  double averaged_loss_ = 0, loss_ = 0;
  bool should_print_ = false;
};

// What a fit leaves on every rank: the steps' outputs and the final parameters.
struct RankRun {
  std::vector<StepOutput> steps;
  std::vector<double> module_losses;  // the guide module's own reduced losses
  std::vector<Tensor> params;
};

class StepRecorder : public Callback {
 public:
  std::vector<StepOutput>* out = nullptr;
  void on_train_batch_end(Trainer&, TrainingModule&, const StepOutput& o) override {
    out->push_back(o);
  }
};

enum class Mode { automatic, manual };

std::vector<RankRun> fit_on_ranks(const TrainConfig& cfg, Mode mode, double clip) {
  const int n = static_cast<int>(cfg.dist.world_size);
  std::vector<RankRun> runs(static_cast<size_t>(n));
  sim::LaunchOptions lo;
  lo.world_size = n;
  lo.seed = cfg.seed;
  blas::MatmulPrecisionScope fp32(blas::MatmulPrecision::fp32);
  sim::launch(lo, [&] {
    current_context().rng().set_seed(cfg.seed);
    RankRun& r = runs[static_cast<size_t>(current_context().rank())];
    TrainData data = build_data(cfg);
    auto dm = make_data_module(data, cfg);
    TrainerOptions to = trainer_options(cfg);
    auto rec = std::make_shared<StepRecorder>();
    rec->out = &r.steps;
    to.callbacks.push_back(rec);
    std::unique_ptr<CausalLMModule> m;
    if (mode == Mode::manual) {
      m = std::make_unique<LightningGuideModule>(cfg, to.accumulate_grad_batches, clip);
      to.accumulate_grad_batches = 1;  // the module accumulates
    } else {
      m = std::make_unique<CausalLMModule>(cfg);
      to.gradient_clip_val = clip;
    }
    Trainer t(std::move(to));
    t.fit(*m, *dm);
    if (auto* g = dynamic_cast<LightningGuideModule*>(m.get())) r.module_losses = g->logged_losses;
    for (auto& [name, p] : m->model().named_parameters()) r.params.push_back(p.detach().clone());
  });
  return runs;
}

TrainConfig guide_config(const fs::path& d, const std::string& name,
                         std::vector<std::string> extra) {
  for (const char* s :
       {"trainer.max_steps=8", "trainer.log_every_n_steps=1", "trainer.val_check_interval=0",
        "generation.max_new_tokens=0", "trainer.matmul_precision=fp32",
        "trainer.gradient_clip_val=0", "data.micro_batch_size=2", "model.num_layers=2"})
    extra.insert(extra.begin(), s);
  return nxd::testing::tiny(d / name, nxd::testing::tiny_corpus(d), extra);
}

// The guide's manual step against the automatic loop at this layout: losses (the trainer's and
// the module's own DP reduction) and grad norms within 1e-6, every rank's weights bitwise.
void expect_manual_equals_automatic(const std::string& name, std::vector<std::string> layout,
                                    double clip) {
  auto d = nxd::testing::test_temp_dir("nxd_manual_opt_");
  const TrainConfig cfg = guide_config(d, name, layout);
  ASSERT_GT(cfg.grad_accum_steps, 1) << "the case is meant to accumulate";
  const auto autos = fit_on_ranks(cfg, Mode::automatic, clip);
  const auto manuals = fit_on_ranks(cfg, Mode::manual, clip);
  const RankRun &a = autos[0], &m = manuals[0];
  ASSERT_EQ(a.steps.size(), static_cast<size_t>(cfg.trainer.max_steps));
  ASSERT_EQ(m.steps.size(), a.steps.size());
  ASSERT_EQ(m.module_losses.size(), a.steps.size());
  double worst_loss = 0, worst_norm = 0, worst_module = 0;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(m.steps[i].step, a.steps[i].step);
    EXPECT_EQ(m.steps[i].lr, a.steps[i].lr) << "step " << i + 1;
    worst_loss = std::max(worst_loss, std::abs(m.steps[i].loss - a.steps[i].loss));
    worst_module = std::max(worst_module, std::abs(m.module_losses[i] - a.steps[i].loss));
    worst_norm = std::max(
        worst_norm, std::abs(m.steps[i].grad_norm - a.steps[i].grad_norm) / a.steps[i].grad_norm);
  }
  std::printf("%s: largest loss difference %.3g (module's own %.3g), grad norm %.3g (rel)\n",
              name.c_str(), worst_loss, worst_module, worst_norm);
  EXPECT_LE(worst_loss, 1e-6);
  EXPECT_LE(worst_module, 1e-6);
  EXPECT_LE(worst_norm, 1e-6);
  EXPECT_GT(a.steps.front().loss - a.steps.back().loss, 0.05) << "the model trains";
  if (clip > 0) EXPECT_GT(a.steps.front().grad_norm, clip) << "clipping acts";
  for (size_t r = 0; r < autos.size(); ++r) {
    ASSERT_EQ(autos[r].params.size(), manuals[r].params.size());
    for (size_t i = 0; i < autos[r].params.size(); ++i)
      EXPECT_BITWISE_EQ(manuals[r].params[i], autos[r].params[i]);
  }
}

}  // namespace

TEST(ManualOptimization, LightningGuideStepEqualsAutomaticAtDp2) {
  // world 2 (DP 2), global batch 8 of micro batches of 2: 2 micro batches per step and rank
  expect_manual_equals_automatic(
      "dp2",
      {"backend.world_size=2", "data.global_batch_size=8", "model.optim.sched.warmup_steps=3"},
      0.0);
}

TEST(ManualOptimization, ClipGradientsWithZero1AtTp2Dp2EqualsAutomatic) {
  // TP 2 (sequence parallel) x DP 2 with ZeRO-1; clip_gradients(0.05) against gradient_clip_val
  expect_manual_equals_automatic(
      "tp2dp2_zero1",
      {"backend.world_size=4", "distributed_strategy.tensor_model_parallel_size=2",
       "distributed_strategy.sequence_parallel=true", "distributed_strategy.zero1=true",
       "data.global_batch_size=8"},
      0.05);
}

namespace {
// The guide's module at DP 2 for `max_steps`, checkpointing every 4 steps into `dir`, resumed
// from `resume` ("" = fresh); rank 0's step outputs.
std::vector<StepOutput> guide_run(const TrainConfig& cfg, int64_t max_steps, const fs::path& dir,
                                  const std::string& resume) {
  std::vector<std::vector<StepOutput>> steps(2);
  sim::LaunchOptions lo;
  lo.world_size = 2;
  lo.seed = cfg.seed;
  blas::MatmulPrecisionScope fp32(blas::MatmulPrecision::fp32);
  sim::launch(lo, [&] {
    current_context().rng().set_seed(cfg.seed);
    TrainData data = build_data(cfg);
    auto dm = make_data_module(data, cfg);
    TrainerOptions to = trainer_options(cfg);
    to.max_steps = max_steps;
    LightningGuideModule m(cfg, to.accumulate_grad_batches, 0.0);
    to.accumulate_grad_batches = 1;
    auto rec = std::make_shared<StepRecorder>();
    rec->out = &steps[static_cast<size_t>(current_context().rank())];
    to.callbacks.push_back(rec);
    to.callbacks.push_back(std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions{.dirpath = dir.string(), .every_n_train_steps = 4}));
    Trainer(to).fit(m, *dm, resume);
  });
  return steps[0];
}
}  // namespace

// A checkpoint of a manual-optimization run holds the micro-batch index and the scheduler's
// position: resumed at step 4 it continues bitwise as the uninterrupted run.
TEST(ManualOptimization, ResumesBitwiseFromACheckpoint) {
  auto d = nxd::testing::test_temp_dir("nxd_manual_opt_");
  const TrainConfig cfg = guide_config(
      d, "resume",
      {"backend.world_size=2", "data.global_batch_size=8", "model.optim.sched.warmup_steps=6"});
  const auto whole = guide_run(cfg, 8, d / "whole_ckpts", "");
  guide_run(cfg, 5, d / "cut_ckpts", "");
  const auto resumed =
      guide_run(cfg, 8, d / "resumed_ckpts", (d / "cut_ckpts" / "step_4").string());
  ASSERT_EQ(whole.size(), 8u);
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(resumed[i].step, whole[i + 4].step);
    EXPECT_EQ(resumed[i].lr, whole[i + 4].lr) << "step " << i + 5;
    EXPECT_EQ(resumed[i].loss, whole[i + 4].loss) << "step " << i + 5;
    EXPECT_EQ(resumed[i].grad_norm, whole[i + 4].grad_norm) << "step " << i + 5;
  }
}

namespace {
// A module that leaves automatic optimization on but calls the manual API.
class MisusedModule : public CausalLMModule {
 public:
  using CausalLMModule::CausalLMModule;
  Tensor training_step(const Batch& b, int64_t) override {
    Tensor loss = lm().loss(b.ids, b.targets);
    manual_backward(loss);
    return loss;
  }
};

std::string fit_error(const TrainConfig& cfg, CausalLMModule& m, TrainerOptions to) {
  TrainData data = build_data(cfg);
  auto dm = make_data_module(data, cfg);
  try {
    Trainer(std::move(to)).fit(m, *dm);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ManualOptimization, RefusalsNameTheValue) {
  auto d = nxd::testing::test_temp_dir("nxd_manual_opt_");
  const TrainConfig cfg = guide_config(d, "refuse", {"data.global_batch_size=4"});
  {
    LightningGuideModule m(cfg, 2, 0.0);
    TrainerOptions to = trainer_options(cfg);
    EXPECT_EQ(to.accumulate_grad_batches, 2);
    const std::string e = fit_error(cfg, m, to);
    EXPECT_NE(e.find("accumulate_grad_batches=2 with manual optimization"), std::string::npos) << e;
  }
  {
    LightningGuideModule m(cfg, 2, 0.0);
    TrainerOptions to = trainer_options(cfg);
    to.accumulate_grad_batches = 1;
    to.gradient_clip_val = 0.5;
    const std::string e = fit_error(cfg, m, to);
    EXPECT_NE(e.find("gradient_clip_val=0.5 with manual optimization"), std::string::npos) << e;
  }
  {
    LightningGuideModule m(cfg, 2, 0.0);  // validation needs its own validation_step
    TrainerOptions to = trainer_options(cfg);
    to.accumulate_grad_batches = 1;
    to.val_check_interval = 1;
    const std::string e = fit_error(cfg, m, to);
    EXPECT_NE(e.find("needs the module's own validation_step"), std::string::npos) << e;
  }
  {
    MisusedModule m(cfg);
    const std::string e = fit_error(cfg, m, trainer_options(cfg));
    EXPECT_NE(e.find("manual_backward() is for manual optimization"), std::string::npos) << e;
  }
}
