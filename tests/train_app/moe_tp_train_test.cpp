// Mixture of experts with tensor parallelism inside each expert (w1/w3 split by rows, w2 by
// columns over TP; one all-reduce or, under sequence parallelism, one reduce-scatter for the
// layer), with sequence parallelism, and with context parallelism, against one rank:
//   - EP {1, 2, 4} x TP 2 with SP off and on (TP 1: moe_train_test.cpp), ZeRO-1, PP 2: 20 AdamW
//     steps, every loss and gradient norm within 1e-5, the first step's gradients with the
//     experts' TP shards gathered within 1e-5; each rank holds 1/TP of its experts' parameters;
//   - a TP 2 x EP 2 checkpoint loads at TP 1 x EP 1 x DP 2 and on one rank (parameters and AdamW
//     state bitwise the gathered saved ones), and export-hf writes the whole experts;
//   - nxd-train at CP 2, CP 2 x TP 2 (SP) and CP 2 x EP 2 equals one rank over 20 steps (losses,
//     gradient norms, the auxiliary loss: the experts' loads summed over CP), and what CP cannot
//     do is a configuration error;
//   - CP x EP through NxD's wrappers (EP folded over DP x CP: CP 2 x EP 2 (also x TP 2 SP), CP 4 x
//     EP 2 with the expert-DP group spanning CP, DP 2 x CP 2 x EP 2 and x EP 4, ZeRO-1): losses,
//     gradient norms and the first step's gradients within 1e-5 of one rank, and every copy of
//     every parameter bitwise equal across the DP, CP and expert-DP replicas after the last step.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "moe_train_util.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/train_app/config.h"
#include "nxd/train_app/train.h"
#include "train_util.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
using namespace nxd::testing::moe;

namespace {

int64_t expert_numel(NxDModel& model) {
  int64_t n = 0;
  for (Module* m : model.local_modules())
    for (const Tensor& t : moe_expert_parameters(*m)) n += t.numel();
  return n;
}

std::string name(int ep, int dp, bool sp) {
  return "EP" + std::to_string(ep) + " TP2 DP" + std::to_string(dp) + (sp ? " SP" : "");
}

}  // namespace

// 4 ranks (also under mpirun -np 4): EP 1 and 2 x TP 2 x DP 2, ZeRO-1, PP 2.
TEST(MoeTensorParallel, ShardedExpertsDp2MatchOneRank) {
  const Trace one = train(1, NxDConfig{}, 2);
  for (int ep : {1, 2})
    for (bool sp : {false, true})
      expect_matches(one, train(4, sizes(2, ep, sp), 2), name(ep, 2, sp));
  NxDConfig z = sizes(2, 2, true);  // ZeRO-1: the experts' TP shards sharded over expert-DP
  z.optimizer_config.zero_one_enabled = true;
  expect_matches(one, train(4, z, 2), "ZeRO-1 EP2 TP2 DP2 SP");
  NxDConfig pp = sizes(2, 1, true);  // the stages' MoE layers split over TP too
  pp.pipeline_parallel_size = 2;
  pp.pipeline_config.num_microbatches = 2;
  expect_matches(one, train(4, pp, 2), "PP2 TP2 SP");
}

// 8 ranks: EP 4 x TP 2 x DP 4.
TEST(MoeTensorParallel, ShardedExpertsDp4MatchOneRank) {
  const Trace one = train(1, NxDConfig{}, 4);
  for (bool sp : {false, true}) expect_matches(one, train(8, sizes(2, 4, sp), 4), name(4, 4, sp));
}

// Each TP rank holds 1/TP of every local expert's w1, w2, w3 (E/EP experts of 3 x H x I).
TEST(MoeTensorParallel, ExpertParametersPerRankFallByTp) {
  const ModelConfig c = moe_llama();
  const int64_t whole = 3 * c.hidden_size * c.ffn_hidden_size;  // one expert, TP 1
  const int64_t layers = 2;                                     // layers 0 and 2
  for (int tp : {1, 2}) {
    std::mutex mu;
    std::vector<int64_t> per_rank;
    nxd::testing::run_ranks(2 * tp, [&] {
      const NxDConfig cfg = neuronx_distributed_config(sizes(tp, 2));
      auto model = initialize_parallel_model(cfg, c, 3);
      const int64_t n = expert_numel(*model);
      std::lock_guard<std::mutex> l(mu);
      per_rank.push_back(n);
    });
    for (int64_t n : per_rank) EXPECT_EQ(n, layers * (c.moe.num_experts / 2) * whole / tp) << tp;
    std::printf("    TP %d x EP 2: %lld expert parameters per rank\n", tp,
                static_cast<long long>(per_rank.at(0)));
  }
}

// A sequence SP pads (7 tokens at TP 2): without a graph and with dropless routing (evaluation,
// generation) the padding tokens change no real token's output, so the logits equal one rank's;
// with a graph (training) the layer refuses it (the padding would count in the auxiliary loss).
TEST(MoeTensorParallel, NoGradForwardOfAPaddedSequenceMatchesOneRank) {
  const ModelConfig c = moe_llama();
  Tensor ids = zeros({1, 7}, DType::i64);
  for (int64_t i = 0; i < 7; ++i) ids.data<int64_t>()[i] = (i * 37 + 5) % c.vocab_size;
  std::mutex mu;
  std::map<int, Tensor> logits;
  for (int tp : {1, 2}) {
    nxd::testing::run_ranks(tp, [&] {
      auto model = initialize_parallel_model(neuronx_distributed_config(sizes(tp, 1, true)), c, 3);
      Tensor out;
      {
        NoGradGuard ng;
        out = model->forward(ids);
      }
      if (tp == 2) EXPECT_THROW(model->forward(ids), ShapeError);
      std::lock_guard<std::mutex> l(mu);
      if (parallel_state::get_tensor_model_parallel_rank() == 0) logits[tp] = out.detach().clone();
    });
  }
  ASSERT_EQ(logits.at(2).shape(), logits.at(1).shape());
  EXPECT_TRUE(nxd::testing::close_rel(logits.at(2), logits.at(1), 1e-5, "TP 2 SP vs one rank"));
}

namespace {

// name -> the whole tensor (TP shards gathered) of every parameter and AdamW state tensor here.
void record_whole(NxDModel& model, optim::Optimizer& opt, std::map<std::string, Tensor>& out,
                  std::mutex& mu) {
  std::map<std::string, ParallelAttrs> attrs;
  std::map<std::string, Tensor> mine;
  for (Module* m : model.local_modules())
    for (const auto& p : parallel_parameters(*m)) {
      attrs[p.name] = p.attrs;
      mine[p.name] = gather_tp_shards(p.tensor.detach(), p.attrs);
    }
  for (const auto& [n, t] : opt.state_tensors()) {
    const auto dot = n.rfind('.');
    const auto a = attrs.find(n.substr(0, dot));
    mine["optim." + n] = a != attrs.end() && t.dim() > 0 ? gather_tp_shards(t.detach(), a->second)
                                                         : t.detach().clone();
  }
  if (ps::get_tensor_model_parallel_rank() != 0) return;
  std::lock_guard<std::mutex> l(mu);
  for (auto& [n, t] : mine) out.emplace(n, t);
}

}  // namespace

// A checkpoint saved at TP 2 x EP 2 (experts split over TP, each EP rank's in its own files)
// loads at TP 1 x EP 1 x DP 2 and on one rank, and so does its offline reshard to TP 1 (nxd-ckpt
// reshard): every parameter and AdamW state tensor bitwise the gathered saved one (the loading
// runs start from other seeds); export-hf of it writes every expert whole (Mixtral's names and
// shapes), bitwise.
TEST(MoeTensorParallel, CheckpointSavedAtTp2Ep2LoadsAtTp1AndExportsWhole) {
  const auto dir = nxd::testing::test_temp_dir("moe_tp_ckpt");
  ModelConfig c = moe_llama();
  c.arch = "mixtral";  // transformers' Mixtral: every layer MoE, no z-loss
  c.moe.frequency = 1;
  c.moe.router_z_loss_coef = 0;
  std::map<std::string, Tensor> saved, loaded;
  std::mutex mu;
  auto run = [&](int world, int tp, int ep, uint64_t seed, bool save,
                 const std::filesystem::path& root) {
    loaded.clear();
    nxd::testing::run_ranks(world, [&] {
      MoeRun r = moe_run(neuronx_distributed_config(sizes(tp, ep)), c, seed);
      auto& model = r.model;
      auto& opt = r.opt;
      Module& m = *model->local_modules().at(0);
      if (save) {
        train_steps(r, 2);
        ckpt::save_checkpoint(root, "s2", &m, &opt->inner(), nullptr);
      } else {
        ckpt::load_checkpoint(root, &m, &opt->inner(), nullptr, {.tag = "s2"});
      }
      record_whole(*model, opt->inner(), save ? saved : loaded, mu);
    });
  };
  run(4, 2, 2, 3, true, dir);
  ASSERT_EQ(saved.count("model.layers.2.block_sparse_moe.experts.3.w2.weight"), 1u);
  EXPECT_EQ(saved.at("model.layers.2.block_sparse_moe.experts.3.w2.weight").shape(),
            (Shape{16, 24}));
  for (const char* f : {"model/dp_rank_01_tp_rank_01_pp_rank_00.safetensors",
                        "optim/dp_rank_01_tp_rank_01_pp_rank_00.safetensors"})
    EXPECT_TRUE(std::filesystem::exists(dir / "s2" / f)) << f;
  // nxd-ckpt reshard to TP 1 x DP 1 (offline), loaded on one rank
  ckpt::reshard_checkpoint(dir / "s2", dir / "tp1", {.tp = 1, .pp = 1, .dp = 1});
  for (auto [world, tp, ep, root] :
       {std::tuple{2, 1, 1, dir}, std::tuple{1, 1, 1, dir}, std::tuple{1, 1, 1, dir / "tp1"}}) {
    run(world, tp, ep, 99, false, root);
    EXPECT_EQ(loaded.size(), saved.size()) << root << " " << world;
    for (const auto& [n, t] : saved) {
      ASSERT_TRUE(loaded.count(n)) << n;
      EXPECT_TRUE(nxd::testing::bitwise_equal(loaded.at(n), t, n)) << root << " " << world;
    }
  }
  ckpt::export_hf(dir / "s2", dir / "hf");
  const auto hf = ckpt::read_hf_weights(dir / "hf", c);
  int64_t experts = 0;
  for (const auto& [n, t] : hf) {
    ASSERT_TRUE(saved.count(n)) << n;
    EXPECT_TRUE(nxd::testing::bitwise_equal(t, saved.at(n), n));
    experts += n.find(".experts.") != std::string::npos;
  }
  EXPECT_EQ(experts, c.num_layers * c.moe.num_experts * 3);
  std::filesystem::remove_all(dir);
}

namespace {

nxd::testing::Rows run_nxd_train(const std::filesystem::path& d, const std::string& name,
                                 std::vector<std::string> extra) {
  std::vector<std::string> s = {"model.num_layers=2", "model.moe.num_experts=4",
                                "model.moe.router_aux_loss_coef=0.1",
                                "model.moe.router_z_loss_coef=0.01"};
  s.insert(s.end(), extra.begin(), extra.end());
  train_app::train(
      nxd::testing::tiny(d / name, nxd::testing::tiny_corpus(d), nxd::testing::parallel_run(s)),
      {.quiet = true});
  return nxd::testing::read_rows(d / name / "metrics.csv");
}

}  // namespace

// Context parallelism: each CP rank routes its chunks' tokens; the auxiliary losses take the
// loads and token count of the whole sequence (summed over CP), so CP 2 and CP 2 x TP 2 (SP,
// experts split over TP) equal one rank: losses, gradient norms and the logged auxiliary loss.
TEST(MoeContextParallel, NxdTrainMatchesOneRank) {
  const auto d = nxd::testing::test_temp_dir("moe_cp_train");
  const auto one = run_nxd_train(d, "one", {});
  const auto m1 = nxd::testing::read_csv(d / "one" / "moe_metrics.csv").rows;
  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"cp2", {"backend.world_size=2", "distributed_strategy.context_parallel_size=2"}},
      {"cp2_tp2_sp",
       {"backend.world_size=4", "distributed_strategy.context_parallel_size=2",
        "distributed_strategy.tensor_model_parallel_size=2",
        "distributed_strategy.sequence_parallel=true"}},
      {"cp2_ep2",  // DP 1: the EP group is the CP group
       {"backend.world_size=2", "distributed_strategy.context_parallel_size=2",
        "distributed_strategy.expert_model_parallel_size=2"}}};
  for (const auto& [name, keys] : runs) {
    const auto cp = run_nxd_train(d, name, keys);
    const double wl = nxd::testing::worst_rel(cp.loss, one.loss);
    const double wn = nxd::testing::worst_rel(cp.grad_norm, one.grad_norm);
    const auto m2 = nxd::testing::read_csv(d / name / "moe_metrics.csv").rows;
    ASSERT_EQ(m2.size(), m1.size()) << name;
    std::vector<double> a1, a2;
    for (size_t i = 0; i < m1.size(); ++i) {
      a1.push_back(std::stod(m1[i].at(1)));
      a2.push_back(std::stod(m2[i].at(1)));
    }
    const double wa = nxd::testing::worst_rel(a2, a1);
    std::printf(
        "    MoE %s vs one rank over 20 steps: losses %.3g, grad norms %.3g, aux loss %.3g\n",
        name.c_str(), wl, wn, wa);
    EXPECT_LE(wl, 1e-5) << name;
    EXPECT_LE(wn, 1e-5) << name;
    EXPECT_LE(wa, 1e-5) << name;
  }
  std::filesystem::remove_all(d);
}

TEST(MoeContextParallel, WhatItCannotDoIsAConfigError) {
  const auto d = nxd::testing::test_temp_dir("moe_cp_config");
  const auto corpus = nxd::testing::tiny_corpus(d);
  auto expect_error = [&](std::vector<std::string> extra, const std::string& says) {
    extra.insert(extra.end(),
                 {"model.moe.num_experts=4", "distributed_strategy.context_parallel_size=2"});
    try {
      nxd::testing::tiny(d / "x", corpus, extra);
      ADD_FAILURE() << "no error for " << extra.front();
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect_error({"backend.world_size=2", "model.moe.dropless=false"},
               "with model.moe.dropless=false: capacity drops follow the whole sequence");
  // EP divides DP x CP (not DP alone): EP 2 at DP 1 x CP 2 resolves, EP 4 there does not
  EXPECT_NO_THROW(nxd::testing::tiny(d / "x", corpus,
                                     {"backend.world_size=2", "model.moe.num_experts=4",
                                      "distributed_strategy.context_parallel_size=2",
                                      "distributed_strategy.expert_model_parallel_size=2"}));
  expect_error({"backend.world_size=2", "distributed_strategy.expert_model_parallel_size=4"},
               "expert_model_parallel_size=4 does not divide the data-parallel size 1 x "
               "context_parallel_size 2 = 2");
  std::filesystem::remove_all(d);
}

namespace {

NxDConfig cp_ep(int cp, int ep, bool zero1 = false, int tp = 1) {
  NxDConfig c = sizes(tp, ep, /*sp=*/tp > 1);
  c.context_parallel_size = cp;
  c.optimizer_config.zero_one_enabled = zero1;
  return c;
}

// The parallel run against one rank, and every parameter's copies bitwise equal after the last
// step (with the expert-DP group inside one CP slice, as before, the CP ranks drifted apart: 36 of
// 41 parameters differed at CP 2 x EP 2).
void expect_cp_matches(const Trace& one, const Trace& par, const std::string& what) {
  expect_matches(one, par, what);
  // (under mpirun a process holds one rank: the copies are compared on the sim)
  if (nxd::testing::under_mpi()) return;
  std::printf("    %s: %lld parameter copies compared across replicas, %zu differ\n", what.c_str(),
              static_cast<long long>(par.replica_copies), par.replicas_differing.size());
  EXPECT_GT(par.replica_copies, 0) << what;
  EXPECT_TRUE(par.replicas_differing.empty())
      << what << ": " << par.replicas_differing.size() << " differ, first "
      << par.replicas_differing.front();
  EXPECT_EQ(par.final_params.size(), one.final_params.size()) << what;
}

}  // namespace

// DP 1: CP 2 x EP 2 (the EP group is the CP group, expert-DP one rank), CP 4 x EP 2 with ZeRO-1
// (EP groups {cp 0, 1} and {cp 2, 3}; expert-DP {0, 2} and {1, 3}: the experts' gradients
// averaged and their AdamW state sharded across CP ranks) and CP 2 x EP 2 x TP 2 with SP.
TEST(MoeContextParallel, ExpertParallelMatchesOneRank) {
  const Trace one = train(1, NxDConfig{}, 1);
  expect_cp_matches(one, train(2, cp_ep(2, 2), 1), "CP2 EP2");
  expect_cp_matches(one, train(4, cp_ep(4, 2, true), 1), "ZeRO-1 CP4 EP2");
  // experts split over TP 2 (SP) too: the EP groups are the CP groups of each TP rank
  expect_cp_matches(one, train(4, cp_ep(2, 2, false, 2), 1), "CP2 EP2 TP2 SP");
}

// DP 2 x CP 2: EP 2 (EP group = the CP group, expert-DP = the DP group) and EP 4 with ZeRO-1 (one
// EP group of all four ranks).
TEST(MoeContextParallel, ExpertParallelDp2MatchesOneRank) {
  const Trace one = train(1, NxDConfig{}, 2);
  expect_cp_matches(one, train(4, cp_ep(2, 2), 2), "DP2 CP2 EP2");
  expect_cp_matches(one, train(4, cp_ep(2, 4, true), 2), "ZeRO-1 DP2 CP2 EP4");
}

// ZeRO-3 at DP 2 x CP 2 x EP 2 (NxDOptimizer): the layers' dense parameters sharded over the
// DP x CP group, each MoE layer's experts (a unit nested in its layer's) over expert-DP, which at
// EP 2 x CP 2 is the DP group. With one parameter per bucket it is stage 1's run bitwise (losses,
// norms, every final parameter), and one rank's within 1e-6, every replica of every parameter
// bitwise equal.
TEST(MoeContextParallel, Zero3ExpertParallelDp2MatchesStage1AndOneRank) {
  const Trace one = train(1, NxDConfig{}, 2);
  NxDConfig c = cp_ep(2, 2);
  c.grad_bucket_mb = 1e-6;
  c.optimizer_config.zero_stage = optim::ZeroStage::three;
  const Trace three = train(4, c, 2);
  c.optimizer_config.zero_stage = optim::ZeroStage::one;
  expect_bitwise(train(4, c, 2), three, "ZeRO-3 DP2 CP2 EP2 vs ZeRO-1");
  expect_cp_matches(one, three, "ZeRO-3 DP2 CP2 EP2");
  if (!one.losses.empty()) {
    EXPECT_LE(nxd::testing::worst_rel(three.losses, one.losses), 1e-6);
    EXPECT_LE(nxd::testing::worst_rel(three.norms, one.norms), 1e-6);
  }
}
