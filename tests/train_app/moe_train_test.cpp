// Mixture-of-experts training through NxD's wrappers (initialize_parallel_model /
// initialize_parallel_optimizer) at EP x TP x DP against one rank: 20 AdamW steps, every loss (the
// DP mean) and gradient norm within 1e-5, the first step's reduced gradients of every parameter
// within 1e-5 (TP = 1 runs: no TP shards to gather). The single rank computes the DP ranks'
// losses one shard at a time and averages them (the auxiliary loss is per shard). AdamW at lr 1e-3:
// at 1e-2 it amplifies the last-bit differences of the reduction order (an element whose
// gradient nearly cancels moves by ~lr either way) to 3.5e-5 in the norm by step 18; at 1e-3 the
// norms stay within 3e-7. Also under mpirun -np 4 (label mpi).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>

#include "moe_train_util.h"
#include "nxd/api/nxd_api.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/moe/moe.h"
#include "nxd/layers/param_unit.h"
#include "nxd/optim/zero1.h"
#include "nxd/train_app/config.h"
#include "nxd/train_app/train.h"
#include "support/compare.h"
#include "support/files.h"
#include "support/ranks.h"
#include "support/tiny_models.h"
#include "train_util.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace ps = nxd::parallel_state;

using namespace nxd::testing::moe;

TEST(MoeTrain, ExpertParallelDp2MatchesOneRank) {
  const Trace one = train(1, NxDConfig{}, 2);
  expect_matches(one, train(2, sizes(1, 1), 2), "EP1 TP1 DP2");
  expect_matches(one, train(2, sizes(1, 2), 2), "EP2 TP1 DP2");
  expect_matches(one, train(4, sizes(2, 2), 2), "EP2 TP2 DP2");
}

TEST(MoeTrain, ExpertParallelDp4MatchesOneRank) {
  const Trace one = train(1, NxDConfig{}, 4);
  expect_matches(one, train(4, sizes(1, 4), 4), "EP4 TP1 DP4");
  expect_matches(one, train(4, sizes(1, 2), 4), "EP2 TP1 DP4");
  expect_matches(one, train(8, sizes(2, 4), 4), "EP4 TP2 DP4");
}

// ZeRO-1 with experts (NxD's two ZeRO-1 optimizers): the experts' state sharded over the
// expert-data-parallel group, the rest over DP, the norm over both.
TEST(MoeTrain, Zero1WithExpertParallelMatchesOneRank) {
  const Trace one = train(1, NxDConfig{}, 4);
  NxDConfig c = sizes(1, 2);
  c.optimizer_config.zero_one_enabled = true;
  expect_matches(one, train(4, c, 4), "ZeRO-1 EP2 TP1 DP4");
  c.optimizer_config.grad_clipping = true;  // the clipping coefficient from both norms
  c.optimizer_config.max_grad_norm = 0.05;
  NxDConfig c1;
  c1.optimizer_config = c.optimizer_config;
  c1.optimizer_config.zero_one_enabled = false;
  expect_matches(train(1, c1, 4), train(4, c, 4), "ZeRO-1 EP2 TP1 DP4 clipped");
}

// ZeRO-2 (optimizer_config.zero_stage 2): the experts' second optimizer over the expert-DP group
// takes the stage too; clipped, as one rank.
TEST(MoeTrain, Zero2WithExpertParallelMatchesOneRank) {
  NxDConfig c = sizes(1, 2);
  c.optimizer_config.zero_stage = optim::ZeroStage::two;
  c.optimizer_config.grad_clipping = true;
  c.optimizer_config.max_grad_norm = 0.05;
  NxDConfig c1;
  c1.optimizer_config = c.optimizer_config;
  c1.optimizer_config.zero_stage = optim::ZeroStage::none;
  expect_matches(train(1, c1, 4), train(4, c, 4), "ZeRO-2 EP2 TP1 DP4 clipped");
}

// ZeRO-3 (optimizer_config.zero_stage 3): each decoder layer a unit over DP; at EP 2 each MoE
// layer's experts a unit of their own, nested in the layer's, sharded by the experts' optimizer
// over expert-DP; at EP 1 (MoE without EP) the experts are dense parameters of the layer's unit.
// Clipped, one parameter per bucket (the bucket layout of every stage alike): every loss, norm and
// final parameter is stage 1's and stage 2's bitwise, and one rank's within 1e-6.
TEST(MoeTrain, Zero3WithAndWithoutExpertParallelMatchesStages1And2AndOneRank) {
  for (const int ep : {2, 1}) {
    NxDConfig c = sizes(1, ep);
    c.grad_bucket_mb = 1e-6;
    c.optimizer_config.grad_clipping = true;
    c.optimizer_config.max_grad_norm = 0.05;
    auto at = [&](optim::ZeroStage s) {
      c.optimizer_config.zero_stage = s;
      return train(4, c, 4);
    };
    const Trace three = at(optim::ZeroStage::three), two = at(optim::ZeroStage::two),
                one_ = at(optim::ZeroStage::one);
    NxDConfig c1;
    c1.optimizer_config = c.optimizer_config;
    c1.optimizer_config.zero_stage = optim::ZeroStage::none;
    const Trace single = train(1, c1, 4);
    const std::string what = "ZeRO-3 EP" + std::to_string(ep) + " TP1 DP4 clipped";
    expect_bitwise(one_, three, what + " vs ZeRO-1");
    expect_bitwise(two, three, what + " vs ZeRO-2");
    expect_matches(single, three, what);
    if (!single.losses.empty()) {  // (under mpirun: the first process)
      EXPECT_LE(nxd::testing::worst_rel(three.losses, single.losses), 1e-6) << what;
      EXPECT_LE(nxd::testing::worst_rel(three.norms, single.norms), 1e-6) << what;
    }
  }
}

// ZeRO-3 at EP 2 x DP 4 really shards the experts: between steps every MoE layer's experts module
// holds a unit whose weights have no memory (released), as do the layers' dense weights; inside
// WholeParameters they are back, and a rank holds 1/expert-DP (1/2) of its experts' weights. At
// EP 4 x DP 4 the expert-DP group is one rank: nothing to shard, no expert unit, the experts whole
// (a unit would hold its gathered copy beside a shard as large). The dense buckets go out during
// the backward (each unit's as its backward releases it, UnitLaunch::at_release).
TEST(MoeTrain, Zero3ReleasesTheExpertsBetweenSteps) {
  for (const int ep : {2, 4})
    nxd::testing::run_ranks(4, [&] {
      NxDConfig want = sizes(1, ep);
      want.optimizer_config.zero_stage = optim::ZeroStage::three;
      MoeRun r = moe_run(neuronx_distributed_config(want), moe_llama(), 3);
      train_steps(r, 1);
      {  // every bucket went out during the backward (each unit's as its backward released it)
        const int d = ps::get_data_parallel_rank();
        r.model->run_train(shard_ids(d, 1, 700), shard_ids(d, 1, 900));
        auto& z = dynamic_cast<optim::Zero1Optimizer&>(r.opt->inner());
        EXPECT_EQ(z.grad_sync().launched_buckets(), z.grad_sync().num_buckets()) << "EP " << ep;
        r.opt->step();
        r.opt->zero_grad();
      }
      const std::vector<Module*> local = r.model->local_modules();
      const int edp = 4 / ep;  // the expert-data-parallel size
      int64_t units = 0, expert_bytes = 0, layer_bytes = 0, released = 0, expected_released = 0;
      for (Module* m : local) {
        std::set<const TensorImpl*> expert;
        for (Module* e : moe_expert_modules(*m)) {
          units += e->param_unit() != nullptr;
          for (const Tensor& p : e->parameters()) {
            expert_bytes += p.nbytes();
            expert.insert(p.impl());
          }
        }
        for (const Tensor& p : dynamic_cast<CausalLM&>(*m).decoder_stack()->layers().parameters()) {
          layer_bytes += p.nbytes();
          expected_released += edp > 1 || !expert.count(p.impl());
          released += !p.storage()->has_data();
        }
      }
      EXPECT_EQ(units, edp > 1 ? 2 : 0) << "EP " << ep;  // MoE layers 0 and 2
      EXPECT_EQ(released, expected_released) << "EP " << ep;
      {
        const WholeParameters whole(std::vector<const Module*>(local.begin(), local.end()));
        for (Module* m : local)
          for (Module* e : moe_expert_modules(*m))
            for (const Tensor& p : e->parameters()) EXPECT_TRUE(p.storage()->has_data());
      }
      // the experts' optimizer keeps 1/expert-DP of them, the dense one 1/4 of the layers' other
      // weights and 1/4 of the root unit's (embedding, final norm, head; each bucket padded to a
      // multiple of the group's size)
      auto& z = dynamic_cast<optim::Zero1Optimizer&>(r.opt->inner());
      int64_t all = 0, params = 0;
      for (const auto& p : r.model->local_named_parameters()) {
        all += p.param.nbytes();
        ++params;
      }
      const int64_t dense = layer_bytes - expert_bytes;
      const int64_t expected = (all - layer_bytes) / 4 + dense / 4 + expert_bytes / edp;
      if (current_context().rank() == 0)
        std::printf(
            "    ZeRO-3 EP%d x DP4: a rank holds %lld of its %lld parameter bytes (%lld without "
            "padding; experts %lld)\n",
            ep, static_cast<long long>(z.resident_parameter_bytes()), static_cast<long long>(all),
            static_cast<long long>(expected), static_cast<long long>(expert_bytes));
      EXPECT_GE(z.resident_parameter_bytes(), expected) << "EP " << ep;
      EXPECT_LE(z.resident_parameter_bytes(), expected + 4 * 3 * params)
          << "EP " << ep;  // < 4 elements of padding a bucket
    });
}

// Full activation checkpointing: the recomputed MoE layers inject the auxiliary loss's gradient in
// the same backward (TrainingLossScale), so the run equals the one without recomputation.
TEST(MoeTrain, FullActivationCheckpointingMatchesNone) {
  NxDConfig full;
  full.activation_checkpoint_config = "full";
  NxDConfig full_ep = sizes(1, 2);
  full_ep.activation_checkpoint_config = "full";
  const Trace none = train(1, NxDConfig{}, 2);
  expect_matches(none, train(1, full, 2), "full checkpointing, one rank");
  expect_matches(none, train(2, full_ep, 2), "full checkpointing, EP2 DP2");
}

// Pipeline parallelism: every stage's MoE layers inject their auxiliary loss's gradient (scaled
// 1/microbatches) in their backward, and the stages' auxiliary losses are added to the reported
// loss, so PP 2 with one microbatch per shard equals one rank; with full checkpointing too.
TEST(MoeTrain, PipelineMatchesOneRank) {
  const Trace one = train(1, NxDConfig{}, 2);
  NxDConfig pp;
  pp.pipeline_parallel_size = 2;
  pp.pipeline_config.num_microbatches = 2;
  expect_matches(one, train(2, pp, 2), "PP2, 2 microbatches");
  pp.activation_checkpoint_config = "full";
  expect_matches(one, train(2, pp, 2), "PP2, 2 microbatches, full checkpointing");
}

// nxd-train end to end: gradient accumulation over 4 micro batches on one rank (the trainer's
// TrainingLossScale 1/4) against PP 2 with the same 4 micro batches as its microbatches (the
// pipeline's 1/4): every step's loss (auxiliary losses included) and gradient norm alike.
TEST(MoeTrain, NxdTrainAccumulationMatchesPipeline) {
  const auto d = nxd::testing::test_temp_dir("moe_nxd_train");
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> s = {"model.num_layers=2", "model.moe.num_experts=4",
                                  "model.moe.router_aux_loss_coef=0.1",
                                  "model.moe.router_z_loss_coef=0.01", "data.global_batch_size=8"};
    s.insert(s.end(), extra.begin(), extra.end());
    train(nxd::testing::tiny(d / name, nxd::testing::tiny_corpus(d), nxd::testing::parallel_run(s)),
          {.quiet = true});
    return nxd::testing::read_rows(d / name / "metrics.csv");
  };
  const auto one = run("one", {});
  const auto pp =
      run("pp2", {"backend.world_size=2", "distributed_strategy.pipeline_model_parallel_size=2"});
  ASSERT_EQ(one.loss.size(), 20u);
  ASSERT_EQ(pp.loss.size(), one.loss.size());
  double worst = 0, worst_norm = 0;
  for (size_t i = 0; i < one.loss.size(); ++i) {
    worst = std::max(worst, std::abs(pp.loss[i] - one.loss[i]) / one.loss[i]);
    worst_norm =
        std::max(worst_norm, std::abs(pp.grad_norm[i] - one.grad_norm[i]) / one.grad_norm[i]);
  }
  std::printf("    nxd-train accumulation 4 vs PP2 x 4 microbatches: loss %.3g, grad norm %.3g\n",
              worst, worst_norm);
  EXPECT_LE(worst, 1e-5);
  EXPECT_LE(worst_norm, 1e-5);
  // moe_metrics.csv: the last micro batch's figures, over every stage's layers under PP
  const auto m1 = nxd::testing::read_csv(d / "one" / "moe_metrics.csv").rows;
  const auto m2 = nxd::testing::read_csv(d / "pp2" / "moe_metrics.csv").rows;
  ASSERT_EQ(m1.size(), 20u);
  ASSERT_EQ(m2.size(), m1.size());
  for (size_t i = 0; i < m1.size(); ++i) {
    EXPECT_NEAR(std::stod(m2[i].at(1)), std::stod(m1[i].at(1)), 1e-6 * std::stod(m1[i].at(1)))
        << "step " << i + 1 << " moe_aux_loss";
    for (size_t c = 2; c < 5; ++c) EXPECT_EQ(m2[i].at(c), m1[i].at(c)) << "step " << i + 1;
  }
  std::filesystem::remove_all(d);
}

// The auxiliary loss is taken per micro batch (NxD's, Megatron's and transformers' Mixtral's) and
// averaged with the cross entropy over the global batch's micro batches; the sampler gives every
// step the same micro batches in every layout (trainer/data.h). So nxd-train with the aux loss on
// (8 experts, top-2, dropless, fp32, global batch 8 in micro batches of 2, 20 steps) trains alike
// on one rank with 4 accumulation steps, at DP 4, at DP 2 x 2 accumulation steps and at EP 2 x
// DP 2: every logged loss and the final weights (exported from the step-20 checkpoints).
TEST(MoeTrain, NxdTrainAuxLossDoesNotDependOnTheLayout) {
  const auto d = nxd::testing::test_temp_dir("moe_layouts");
  const auto corpus = nxd::testing::tiny_corpus(d);
  struct Run {
    std::vector<double> loss;
    std::map<std::string, Tensor> weights;
  };
  auto run = [&](const std::string& name, std::vector<std::string> layout) {
    for (const char* s : {"model.num_layers=2", "model.moe.num_experts=8", "model.moe.top_k=2",
                          "model.moe.dropless=true", "data.global_batch_size=8",
                          "exp_manager.checkpoint_callback_params.every_n_train_steps=20"})
      layout.push_back(s);
    const TrainConfig c = nxd::testing::tiny(d / name, corpus, nxd::testing::parallel_run(layout));
    EXPECT_GT(c.model.moe.router_aux_loss_coef, 0);
    train(c, {.quiet = true});
    Run r{nxd::testing::read_rows(d / name / "metrics.csv").loss, {}};
    ckpt::export_merged(d / name / "checkpoints" / "step_20", d / (name + ".safetensors"));
    for (auto& [n, t] : io::SafetensorsReader(d / (name + ".safetensors")).read_all())
      r.weights[n] = t;
    return r;
  };
  const Run one = run("one", {"backend.world_size=1"});
  ASSERT_EQ(one.loss.size(), 20u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"DP 4", {"backend.world_size=4"}},
      {"DP 2 x 2 accumulation steps", {"backend.world_size=2"}},
      {"EP 2 x DP 2",
       {"backend.world_size=4", "distributed_strategy.expert_model_parallel_size=2"}}};
  int i = 0;
  for (const auto& [what, layout] : layouts) {
    const Run r = run("layout" + std::to_string(i++), layout);
    const double wl = nxd::testing::worst_rel(r.loss, one.loss);
    double ww = 0;
    std::string worst;
    ASSERT_EQ(r.weights.size(), one.weights.size()) << what;
    for (const auto& [n, t] : one.weights) {
      ASSERT_TRUE(r.weights.count(n)) << what << ": " << n;
      const double w = nxd::testing::diff(r.weights.at(n), t).max_abs;
      if (w >= ww) ww = w, worst = n;
    }
    std::printf(
        "    %s vs one rank x 4 accumulation steps: losses within %.3g (relative), final "
        "weights within %.3g (%s)\n",
        what.c_str(), wl, ww, worst.c_str());
    EXPECT_LE(wl, 1e-6) << what;
    EXPECT_LE(ww, 1e-6) << what;
  }
  std::filesystem::remove_all(d);
}

TEST(MoeTrain, ImpossibleCombinationsAreConfigErrors) {
  nxd::testing::run_ranks(4, [] {
    NxDConfig c = sizes(1, 3);  // EP 3 does not divide DP 4
    EXPECT_THROW(neuronx_distributed_config(c), ConfigError);
  });
  nxd::testing::run_ranks(4, [] {
    const NxDConfig cfg = neuronx_distributed_config(sizes(1, 4));
    ModelConfig m = moe_llama();
    m.moe.num_experts = 6;  // not divisible by EP 4
    EXPECT_THROW(initialize_parallel_model(cfg, m, 3), ConfigError);
  });
}

// nxd-train's keys: the impossible combinations are ConfigErrors naming the keys.
TEST(MoeTrain, TrainKeysRejectImpossibleCombinations) {
  auto err = [](std::vector<std::string> sets) -> std::string {
    Config c;
    for (const char* s :
         {"data.kind=random", "model.moe.num_experts=4",
          "distributed_strategy.tensor_model_parallel_size=1", "backend.world_size=4"})
      c.apply_override(s);
    for (auto& s : sets) c.apply_override(s);
    try {
      resolve(c);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(err({"distributed_strategy.expert_model_parallel_size=2"}), "");
  EXPECT_EQ(err({"model.activations_checkpoint_granularity=full"}), "");
  EXPECT_EQ(err({"distributed_strategy.pipeline_model_parallel_size=2"}), "");
  EXPECT_EQ(
      err({"distributed_strategy.expert_model_parallel_size=2", "distributed_strategy.zero1=true"}),
      "");
  // TP-sharded experts under sequence parallelism (the default at TP 2)
  EXPECT_EQ(err({"distributed_strategy.tensor_model_parallel_size=2"}), "");
  // dropless: the sample's padded prompt changes no real token's output
  EXPECT_EQ(
      err({"distributed_strategy.tensor_model_parallel_size=2", "generation.max_new_tokens=8"}),
      "");
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"model.moe.top_k=5"}, "top_k=5 must be in [1, num_experts=4]"},
      {{"distributed_strategy.expert_model_parallel_size=3"},
       "expert_model_parallel_size=3 does not divide the data-parallel size 4"},
      {{"distributed_strategy.expert_model_parallel_size=4", "model.moe.num_experts=6"},
       "model.moe.num_experts=6 is not divisible by"},
      {{"distributed_strategy.tensor_model_parallel_size=2", "data.seq_length=31"},
       "padding tokens would be routed"},
      {{"distributed_strategy.tensor_model_parallel_size=2", "model.moe.dropless=false",
        "generation.max_new_tokens=8"},
       "padding tokens would take experts' capacity"},
      {{"model.moe.num_experts=0", "distributed_strategy.expert_model_parallel_size=2"},
       "needs a mixture-of-experts model"},
      {{"model.arch=gpt_neox"}, "needs model.arch llama or mixtral"},
      {{"model.moe.num_experts=0", "model.arch=mixtral"}, "mixtral needs model.moe.num_experts"}};
  for (const auto& [sets, want] : bad) {
    const std::string m = err(sets);
    EXPECT_NE(m.find(want), std::string::npos) << sets[0] << ": got '" << m << "'";
  }
}

// Checkpoints with experts: saved at EP 4 (DP ranks 0..3 each write their experts), loaded at EP 2
// and on one rank (every expert from the file of the rank that held it): every parameter and
// AdamW state tensor bitwise the saved one (the loading runs start from other seeds).
TEST(MoeTrain, CheckpointSavedAtEp4LoadsAtEp2AndOnOneRank) {
  const auto dir = nxd::testing::test_temp_dir("moe_ckpt");
  std::map<std::string, Tensor> saved;  // parameters and optimizer state, by name
  std::mutex mu;
  auto run = [&](int world, int ep, uint64_t seed, bool save) {
    nxd::testing::run_ranks(world, [&] {
      MoeRun r = moe_run(neuronx_distributed_config(sizes(1, ep)), moe_llama(), seed);
      auto& opt = r.opt;
      Module& m = *r.model->local_modules().at(0);
      if (save) {
        train_steps(r, 2);
        ckpt::save_checkpoint(dir, "s2", &m, &opt->inner(), nullptr);
        std::lock_guard<std::mutex> l(mu);
        for (const auto& [n, t] : m.named_parameters()) saved[n] = t.detach().clone();
        for (const auto& [n, t] : opt->inner().state_tensors())
          saved["optim." + n] = t.detach().clone();
        return;
      }
      ckpt::load_checkpoint(dir, &m, &opt->inner(), nullptr, {.tag = "s2"});
      for (const auto& [n, t] : m.named_parameters()) {
        ASSERT_TRUE(saved.count(n)) << n;
        EXPECT_BITWISE_EQ(t, saved.at(n));
      }
      int64_t states = 0;
      for (const auto& [n, t] : opt->inner().state_tensors()) {
        ASSERT_TRUE(saved.count("optim." + n)) << n;
        EXPECT_BITWISE_EQ(t, saved.at("optim." + n));
        ++states;
      }
      EXPECT_GT(states, 0);
    });
  };
  run(4, 4, 3, true);
  EXPECT_EQ(saved.count("model.layers.2.block_sparse_moe.experts.3.w2.weight"), 1u);
  for (const char* f : {"model/dp_rank_00_tp_rank_00_pp_rank_00.safetensors",
                        "model/dp_rank_03_tp_rank_00_pp_rank_00.safetensors",
                        "optim/dp_rank_03_tp_rank_00_pp_rank_00.safetensors"})
    EXPECT_TRUE(std::filesystem::exists(dir / "s2" / f)) << f;
  run(2, 2, 99, false);  // EP 4 -> EP 2, another init
  run(1, 1, 98, false);  // EP 4 -> one rank
  std::filesystem::remove_all(dir);
}

// ZeRO-1 with experts in a checkpoint: saved at EP 2 x DP 4 (each DP rank's file holds its shard
// of the dense parameters' state and of its EP rank's experts'), loaded without ZeRO-1 on one rank
// and with ZeRO-1 at EP 2 x DP 2: every parameter and AdamW state tensor (gathered) bitwise the
// saved one.
TEST(MoeTrain, Zero1CheckpointWithExpertsLoadsAtOtherDegrees) {
  const auto dir = nxd::testing::test_temp_dir("moe_zero1_ckpt");
  std::map<std::string, Tensor> saved;  // parameters and optimizer state, by name
  std::mutex mu;
  auto run = [&](int world, int ep, bool zero1, uint64_t seed, bool save) {
    nxd::testing::run_ranks(world, [&] {
      NxDConfig want = sizes(1, ep);
      want.optimizer_config.zero_one_enabled = zero1;
      const NxDConfig cfg = neuronx_distributed_config(want);
      auto model = initialize_parallel_model(cfg, moe_llama(), seed);
      auto opt = initialize_parallel_optimizer(
          cfg, *model, optim::default_param_groups(model->local_named_parameters(), 1e-3, 0.1),
          optim::AdamWOptions{});
      Module& m = *model->local_modules().at(0);
      const int d = ps::get_data_parallel_rank();
      auto* z = dynamic_cast<optim::Zero1AdamW*>(&opt->inner());
      auto state = [&] {  // the full per-parameter state (ZeRO-1: gathered, collective)
        if (z) z->gather_state();
        return opt->inner().state_tensors();
      };
      if (save) {
        for (int step = 0; step < 2; ++step) {
          model->run_train(shard_ids(d, step, 700), shard_ids(d, step, 900));
          opt->step();
          opt->zero_grad();
        }
        ckpt::save_checkpoint(dir, "z2", &m, &opt->inner(), nullptr);
        const auto st = state();
        std::lock_guard<std::mutex> l(mu);
        for (const auto& [n, t] : m.named_parameters()) saved[n] = t.detach().clone();
        for (const auto& [n, t] : st) saved["optim." + n] = t.detach().clone();
        return;
      }
      ckpt::load_checkpoint(dir, &m, &opt->inner(), nullptr, {.tag = "z2"});
      for (const auto& [n, t] : m.named_parameters()) {
        ASSERT_TRUE(saved.count(n)) << n;
        EXPECT_BITWISE_EQ(t, saved.at(n));
      }
      int64_t states = 0;
      for (const auto& [n, t] : state()) {
        ASSERT_TRUE(saved.count("optim." + n)) << n;
        EXPECT_BITWISE_EQ(t, saved.at("optim." + n));
        ++states;
      }
      EXPECT_GT(states, 0);
    });
  };
  run(4, 2, true, 3, true);
  EXPECT_EQ(saved.count("optim.model.layers.2.block_sparse_moe.experts.3.w2.weight.exp_avg"), 1u);
  run(1, 1, false, 98, false);  // one rank, AdamW
  run(2, 2, true, 99, false);   // EP 2 x DP 2, ZeRO-1
  std::filesystem::remove_all(dir);
}

// The mixtral architecture in transformers' form: export-hf writes MixtralForCausalLM's config
// and tensor names (block_sparse_moe.gate, experts.E.w1/w2/w3 with transformers' shapes), and
// import-hf reads them back bitwise into a checkpoint (at TP 1 and 2).
TEST(MoeTrain, MixtralHuggingFaceRoundTrip) {
  const auto root = nxd::testing::test_temp_dir("moe_hf");
  ModelConfig c = moe_llama();
  c.arch = "mixtral";
  c.moe.frequency = 1;
  c.moe.router_z_loss_coef = 0;
  c.num_kv_heads = 2;
  auto m = make_causal_lm(c, 4);
  EXPECT_EQ(m->type_name(), "MixtralForCausalLM");
  ckpt::save_checkpoint(root / "src", "a", m.get(), nullptr, nullptr);
  ckpt::export_hf(root / "src" / "a", root / "hf");
  const auto j = nlohmann::json::parse(nxd::testing::slurp(root / "hf" / "config.json"));
  EXPECT_EQ(j["model_type"], "mixtral");
  EXPECT_EQ(j["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(j["num_local_experts"], 4);
  EXPECT_EQ(j["num_experts_per_tok"], 2);
  EXPECT_EQ(j["intermediate_size"], 24);
  EXPECT_DOUBLE_EQ(j["router_aux_loss_coef"].get<double>(), 0.05 * 3 / 2);  // x layers / top_k
  const ModelConfig r = ckpt::model_config_from_hf(j);
  EXPECT_EQ(r.arch, "mixtral");
  EXPECT_EQ(r.moe.num_experts, 4);
  EXPECT_EQ(r.moe.top_k, 2);
  EXPECT_NEAR(r.moe.router_aux_loss_coef, 0.05, 1e-15);
  std::map<std::string, Shape> shapes;
  io::SafetensorsReader rd(root / "hf" / "model.safetensors");
  for (const auto& t : rd.header().tensors) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes.size(), m->state_dict().size());
  const std::string l = "model.layers.2.block_sparse_moe.";
  EXPECT_EQ(shapes.at(l + "gate.weight"), (Shape{4, 16}));
  EXPECT_EQ(shapes.at(l + "experts.3.w1.weight"), (Shape{24, 16}));
  EXPECT_EQ(shapes.at(l + "experts.3.w3.weight"), (Shape{24, 16}));
  EXPECT_EQ(shapes.at(l + "experts.3.w2.weight"), (Shape{16, 24}));
  EXPECT_EQ(shapes.count("model.layers.1.mlp.gate_proj.weight"), 0u);  // every layer is MoE
  for (int tp : {1, 2}) {
    const std::string tag = "b" + std::to_string(tp);
    ckpt::import_hf(root / "hf", root / "back", tag, tp, 1);
    auto m2 = make_causal_lm(c, 99);
    ckpt::load_checkpoint(root / "back", m2.get(), nullptr, nullptr, {.tag = tag});
    for (const auto& [n, x] : m->state_dict())
      EXPECT_TRUE(nxd::testing::bitwise_equal(m2->state_dict().at(n), x.detach(), n));
  }
  c.moe.frequency = 2;  // not transformers' Mixtral
  EXPECT_THROW(ckpt::hf_config_json(c), ckpt::CheckpointError);
  std::filesystem::remove_all(root);
}
