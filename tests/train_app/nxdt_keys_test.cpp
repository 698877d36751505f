// NxD's and NxD Training's small settings: max_epochs (Lightning's, trainer.max_epochs), log_rank0
// (NeuronLTModule's), the optimizer's grad_norm before a step (None in NxD), and
// model.do_layer_norm_weight_decay.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/train_app/train.h"
#include "support/files.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;

namespace {

TrainConfig small(const fs::path& out, std::vector<std::string> extra = {}) {
  Config c;
  for (std::string s :
       {"backend.world_size=1", "distributed_strategy.tensor_model_parallel_size=1",
        "distributed_strategy.sequence_parallel=false", "trainer.max_steps=6",
        "trainer.log_every_n_steps=1", "trainer.val_check_interval=0", "trainer.num_threads=1",
        "trainer.matmul_precision=fp32", "data.kind=random", "data.random_num_samples=64",
        "data.seq_length=16", "data.global_batch_size=4", "data.micro_batch_size=2",
        "model.vocab_size=64", "model.num_layers=2", "model.hidden_size=16",
        "model.num_attention_heads=2", "generation.max_new_tokens=0"})
    c.apply_override(s);
  c.apply_override("exp_manager.exp_dir=" + out.string());
  for (auto& s : extra) c.apply_override(s);
  return resolve(c);
}

// Records the rank and loss of every row it is given.
class RankLogger : public Logger {
 public:
  std::mutex* mu = nullptr;
  std::vector<std::pair<int, double>>* rows = nullptr;
  void log_metrics(const MetricsRow& row, const std::map<std::string, double>&) override {
    std::lock_guard<std::mutex> g(*mu);
    rows->push_back({current_context().rank(), row.loss});
  }
};

}  // namespace

TEST(NxdtKeys, MaxEpochsStopsAfterTheStepThatFinishesTheEpochs) {
  auto d = nxd::testing::test_temp_dir("nxd_nxdt_keys_");
  const TrainConfig cfg = small(d);
  // 40 samples, micro batches of 2, 3 per step: a global batch of 6. An epoch is whole global
  // batches (the sampler deals whole micro batches so every layout sees the same samples, as
  // Megatron's sampler: data.h), 6 of them (36 samples; the last 4 wait for the next epoch), so
  // epoch 1 ends with step 6 and epoch 2 with step 12.
  for (int64_t epochs : {1, 2}) {
    CausalLMModule m(cfg);
    DatasetDataModule data(std::make_shared<RandomDataset>(40, 16, 64, 5), nullptr,
                           {.micro_batch_size = 2, .seed = 1});
    TrainerOptions to = trainer_options(cfg);
    to.max_steps = 1000;
    to.accumulate_grad_batches = 3;
    to.max_epochs = epochs;
    const FitResult r = Trainer(to).fit(m, data);
    EXPECT_EQ(r.steps, epochs == 1 ? 6 : 12) << "max_epochs=" << epochs;
    EXPECT_EQ(r.stop_reason, "max_epochs=" + std::to_string(epochs) + " reached");
  }
  // through nxd-train's key; max_steps still wins when it comes first
  const TrainResult k =
      train(small(d / "key", {"trainer.max_epochs=1", "trainer.max_steps=3"}), {.quiet = true});
  EXPECT_EQ(k.steps, 3);
  EXPECT_TRUE(k.stop_reason.empty()) << k.stop_reason;
  try {
    TrainerOptions bad;
    bad.max_epochs = 0;
    Trainer t(bad);
    FAIL() << "max_epochs=0 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("max_epochs must be positive or -1 (no limit), got 0"),
              std::string::npos)
        << e.what();
  }
}

TEST(NxdtKeys, LogRank0LogsOnGlobalRankZeroTheSameRows) {
  auto d = nxd::testing::test_temp_dir("nxd_nxdt_keys_");
  const TrainConfig cfg =
      small(d, {"backend.world_size=2", "distributed_strategy.pipeline_model_parallel_size=2"});
  std::vector<std::vector<std::pair<int, double>>> runs(2);
  for (int rank0 = 0; rank0 < 2; ++rank0) {
    std::mutex mu;
    sim::LaunchOptions lo;
    lo.world_size = 2;
    lo.seed = cfg.seed;
    sim::launch(lo, [&] {
      current_context().rng().set_seed(cfg.seed);
      TrainData data = build_data(cfg);
      auto dm = make_data_module(data, cfg);
      CausalLMModule m(cfg);
      TrainerOptions to = trainer_options(cfg);
      to.log_rank0 = rank0 == 1;
      auto logger = std::make_shared<RankLogger>();
      logger->mu = &mu;
      logger->rows = &runs[static_cast<size_t>(rank0)];
      to.loggers.push_back(logger);
      Trainer(to).fit(m, *dm);
    });
  }
  ASSERT_EQ(runs[0].size(), 6u);
  ASSERT_EQ(runs[1].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(runs[0][i].first, 1) << "the last stage logs by default";
    EXPECT_EQ(runs[1][i].first, 0) << "log_rank0: global rank 0 logs";
    EXPECT_EQ(runs[1][i].second, runs[0][i].second) << "row " << i;
  }
}

TEST(NxdtKeys, GradNormIsNoneBeforeTheFirstStep) {
  Linear lin(3, 2);
  std::vector<optim::NamedParam> ps;
  for (auto& [n, t] : lin.named_parameters()) ps.push_back({n, t});
  NxDConfig cfg;
  auto opt = initialize_parallel_optimizer(cfg, lin, optim::default_param_groups(ps, 0.1, 0.0),
                                           optim::SGDOptions{});
  EXPECT_FALSE(opt->grad_norm().has_value());
  backward(sum(lin.forward(ones({4, 3}))));
  opt->step();
  ASSERT_TRUE(opt->grad_norm().has_value());
  EXPECT_GT(*opt->grad_norm(), 0.0);
}

TEST(NxdtKeys, DoLayerNormWeightDecayDecaysNormWeightsNotBiases) {
  auto d = nxd::testing::test_temp_dir("nxd_nxdt_keys_");
  EXPECT_FALSE(small(d).optim.do_layer_norm_weight_decay);
  const TrainConfig cfg = small(d, {"model.do_layer_norm_weight_decay=true"});
  EXPECT_TRUE(cfg.optim.do_layer_norm_weight_decay);
  Tensor w = zeros({2}), b = zeros({2}), n = zeros({2});
  for (Tensor* t : {&w, &b, &n}) t->set_requires_grad(true);  // frozen ones get no group
  const std::vector<optim::NamedParam> ps = {{"layers.0.mlp.up.weight", w},
                                             {"layers.0.mlp.up.bias", b},
                                             {"layers.0.input_layernorm.weight", n}};
  auto names = [](const optim::ParamGroup& g) {
    std::string s;
    for (const auto& p : g.params) s += p.name + " ";
    return s;
  };
  const auto plain = optim::default_param_groups(ps, 0.1, 0.01);
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(names(plain[1]), "layers.0.mlp.up.bias layers.0.input_layernorm.weight ");
  const auto with =
      optim::default_param_groups(ps, 0.1, 0.01, {.do_layer_norm_weight_decay = true});
  ASSERT_EQ(with.size(), 2u);
  EXPECT_EQ(names(with[0]), "layers.0.mlp.up.weight layers.0.input_layernorm.weight ");
  EXPECT_EQ(names(with[1]), "layers.0.mlp.up.bias ");
}

// exp_manager.save_bf16: the trainer's checkpoints hold bf16 weights and the optimizer state as
// held; an f32 run resumes from one.
TEST(NxdtKeys, SaveBf16CheckpointsResumeInAnF32Run) {
  auto d = nxd::testing::test_temp_dir("nxd_nxdt_keys_");
  train(small(d / "bf16", {"exp_manager.save_bf16=true", "trainer.max_steps=3",
                           "exp_manager.checkpoint_callback_params.every_n_train_steps=3"}),
        {.quiet = true});
  const fs::path ckpt = d / "bf16" / "checkpoints" / "step_3";
  const auto meta = ckpt::read_metadata(ckpt);
  for (const auto& [n, e] : meta["model"].items()) EXPECT_EQ(e["dtype"], "BF16") << n;
  for (const auto& [n, e] : meta["optimizer"]["tensors"].items())
    EXPECT_NE(e["dtype"], "BF16") << n;
  const TrainResult r =
      train(small(d / "f32",
                  {"trainer.max_steps=5", "exp_manager.resume_from_checkpoint=" + ckpt.string()}),
            {.quiet = true});
  EXPECT_EQ(r.start_step, 3);
  EXPECT_EQ(r.steps, 2);
  EXPECT_TRUE(std::isfinite(r.last_loss));
}
