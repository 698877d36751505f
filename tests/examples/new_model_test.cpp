// examples/new_model: the GPT-2 a user defines outside the library trains on the library's
// trainer, learns, and at TP2 x DP2 and at PP2 on sim ranks gives the single rank's losses; its
// pipeline stages give the single rank's loss and gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "gpt2.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/train_app/train.h"
#include "support/compare.h"
#include "support/files.h"
#include "support/ranks.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
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
  { nxd::testing::tiny_corpus(d, 300); }
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

namespace {

std::shared_ptr<CausalLM> build_gpt2(const ModelConfig& c, uint64_t seed, const ModelPart& part) {
  auto m = std::make_shared<gpt2::GPT2LMHeadModel>(c, part);
  m->init_parameters(seed);
  return m;
}

Tensor ids_of(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  RngStream s{seed, 17};
  std::vector<int64_t> v(B * S);
  for (int64_t i = 0; i < B * S; ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * vocab);
  return from_vector<int64_t>(v, {B, S});
}

}  // namespace

// GPT-2's own pieces (wte + wpe on the first stage, a tied wte copy with ln_f on the last) at PP2
// over 2 microbatches: loss and every gradient within 1e-5 of one rank accumulating the same
// microbatches (max|a-b| / max|b| per tensor), cut by parameters and by modeled cost.
TEST(NewModel, Gpt2PipelineStagesMatchOneRank) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = 64;
  c.num_layers = 4;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 8;
  c.tie_word_embeddings = true;
  c.init_method = InitMethod::scaled_normal;
  c.init_std = 0.2;
  const Tensor ids = ids_of(4, 8, c.vocab_size, 1), targets = ids_of(4, 8, c.vocab_size, 2);
  double want = 0;
  std::map<std::string, Tensor> grads;
  nxd::testing::run_ranks(1, [&] {
    auto m = build_gpt2(c, 9, {});
    for (int i = 0; i < 2; ++i) {
      Tensor l = mul(
          m->loss(ids.narrow(0, 2 * i, 2).contiguous(), targets.narrow(0, 2 * i, 2).contiguous()),
          0.5);
      backward(l);
      want += l.item();
    }
    for (auto& [n, t] : m->named_parameters()) grads[n] = t.grad().clone();
  });
  for (auto balance :
       {pipeline::PartitionBalance::parameters, pipeline::PartitionBalance::modeled_cost}) {
    std::mutex mu;
    double worst = 0;
    std::string worst_name;
    std::map<std::string, int> owners;
    nxd::testing::run_ranks(2, [&] {
      parallel_state::initialize_model_parallel(1, 2);
      pipeline::PipelineOptions o;
      o.num_microbatches = 2;
      o.balance = balance;
      o.pieces.build = build_gpt2;
      pipeline::PipelineModel pm(c, 9, o);
      EXPECT_EQ(pm.pieces().layer_prefix, "transformer.h.");
      EXPECT_EQ(pm.pieces().tied, std::vector<std::string>{"transformer.wte.weight"});
      Tensor loss = pm.run_train(ids, targets);
      EXPECT_TRUE(nxd::testing::close_rel(loss, scalar(want), 1e-5, "loss"));
      std::lock_guard<std::mutex> g(mu);
      for (const auto& p : pm.local_named_parameters()) {
        ++owners[p.name];
        ASSERT_TRUE(p.param.grad().defined()) << p.name;
        EXPECT_TRUE(nxd::testing::close_rel(p.param.grad(), grads.at(p.name), 1e-5, p.name));
        const double d = nxd::testing::diff(p.param.grad(), grads.at(p.name)).rel();
        if (d >= worst) worst = d, worst_name = p.name;
      }
    });
    EXPECT_EQ(owners.size(), grads.size());
    EXPECT_EQ(owners["transformer.wte.weight"], 2);  // both ends, gradients summed
    EXPECT_EQ(owners["transformer.wpe.weight"], 1);  // the first stage only
    std::printf("    [%s] largest relative gradient difference %.3g (%s)\n",
                pipeline::partition_balance_name(balance), worst, worst_name.c_str());
  }
}

// nxd-train's keys pipeline the user's module: PP2 (balanced by modeled cost) gives the single
// rank's losses.
TEST(NewModel, Gpt2TrainsAtPp2LikeOneRank) {
  auto d = nxd::testing::test_temp_dir("nxd_new_model_pp_test");
  { nxd::testing::tiny_corpus(d, 300); }
  run(gpt2_config(d / "one", d / "corpus.txt", {}));
  TrainResult pp2 = run(
      gpt2_config(d / "pp2", d / "corpus.txt",
                  {"backend.world_size=2", "distributed_strategy.pipeline_model_parallel_size=2",
                   "distributed_strategy.pipeline_partition=modeled_cost"}));
  const auto a = losses(d / "one" / "metrics.csv"), b = losses(d / "pp2" / "metrics.csv");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), a.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(b[i] - a[i]) / a[i]);
  EXPECT_LE(worst, 1e-4) << "largest relative loss difference " << worst;
  EXPECT_GE(pp2.sim_bubble, 0.0);  // a modeled pipeline ran
}
