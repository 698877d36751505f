// Offline resharding of mixture-of-experts checkpoints (nxd-ckpt reshard --ep) against the online
// path: a tiny Mixtral trained 2 steps at EP 4 x DP 4 (AdamW, and ZeRO-1) is resharded offline to
// EP 2 x DP 4, EP 2 x DP 2 and one rank; a run at each of those degrees that loads the offline
// checkpoint gets every parameter and optimizer state tensor bitwise equal to a run that loads
// the EP 4 checkpoint itself (and to the saved values), and a continued step gives the same loss
// and parameters bitwise. export-hf of the EP 2 checkpoint (also resharded to PP 2 x EP 2) and of
// the EP 4 one equal that of the one-rank one tensor for tensor, byte for byte. Saving at CP 2 x
// EP 2 writes every expert once.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "ckpt_util.h"
#include "nxd/api/nxd_api.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/parallel/context_parallel.h"
#include "nxd/optim/zero1.h"
#include "support/ranks.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
namespace ps = nxd::parallel_state;
using json = nlohmann::json;
using namespace nxd::api;

// micro_model with Mixtral's MoE in every layer: 4 experts, top 2.
ModelConfig tiny_mixtral() {
  ModelConfig c = nxd::testing::micro_model("llama");
  c.arch = "mixtral";
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.frequency = 1;
  c.moe.router_aux_loss_coef = 0.05;
  return c;
}

struct Run {
  int world = 1, ep = 1, cp = 1;
  bool zero1 = false;
};

// What a run held after loading (or saving), and after one more step.
struct State {
  std::map<std::string, Tensor> params, optim;  // every rank's, by name (TP 1: whole tensors)
  double loss = 0;                              // the continued step's (DP mean)
  std::map<std::string, Tensor> params_after;   // after that step
};

Tensor ids(int dp_rank, int step, uint64_t base) {
  return nxd::testing::random_ids(base + static_cast<uint64_t>(step),
                                  static_cast<uint64_t>(dp_rank), 32);
}

// Trains `steps` steps at r's degrees (seed 3), then saves root/tag (save) or loads it into a
// model of another seed and takes one more step (load).
State run(const Run& r, const fs::path& root, const std::string& tag, bool save, int steps = 2) {
  State s;
  std::mutex mu;
  nxd::testing::run_ranks(r.world, [&] {
    NxDConfig want;
    want.expert_parallel_size = r.ep;
    want.context_parallel_size = r.cp;
    want.optimizer_config.zero_one_enabled = r.zero1;
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto model = initialize_parallel_model(cfg, tiny_mixtral(), save ? 3 : 77);
    auto opt = initialize_parallel_optimizer(
        cfg, *model, optim::default_param_groups(model->local_named_parameters(), 1e-2, 0.1),
        optim::AdamWOptions{});
    Module& m = *model->local_modules().at(0);
    const int d = ps::get_data_parallel_rank();
    auto* z = dynamic_cast<optim::Zero1AdamW*>(&opt->inner());
    auto record = [&](std::map<std::string, Tensor>& params, std::map<std::string, Tensor>* st) {
      if (z && st) z->gather_state();  // collective over DP
      std::lock_guard<std::mutex> l(mu);
      for (const auto& [n, t] : m.named_parameters())
        if (!params.count(n)) params[n] = t.detach().clone();
      if (st)
        for (const auto& [n, t] : opt->inner().state_tensors())
          if (!st->count(n)) (*st)[n] = t.detach().clone();
    };
    auto here = [&](const Tensor& t) {  // this CP rank's chunks of the sequences
      const int cp = ps::get_context_parallel_size();
      return cp > 1 ? context_parallel_slice(t, 1, ps::get_context_parallel_rank(), cp) : t;
    };
    auto step = [&](int k) {
      double loss = model->run_train(here(ids(d, k, 700)), here(ids(d, k, 900))).item();
      ps::get_data_parallel_group().all_reduce(&loss, &loss, 1, DType::f64, ReduceOp::sum);
      opt->step();
      opt->zero_grad();
      return loss / ps::get_data_parallel_size();
    };
    if (save) {
      for (int k = 0; k < steps; ++k) step(k);
      save_checkpoint(root, tag, &m, &opt->inner(), nullptr);
      record(s.params, &s.optim);
      return;
    }
    load_checkpoint(root, &m, &opt->inner(), nullptr, {.tag = tag});
    record(s.params, &s.optim);
    if (z) z->release_state();
    const double loss = step(steps);
    if (current_context().rank() == 0) s.loss = loss;
    record(s.params_after, nullptr);
  });
  return s;
}

void expect_same(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [n, t] : a) {
    ASSERT_TRUE(b.count(n)) << what << ": " << n;
    EXPECT_TRUE(nxd::testing::bitwise_equal(t, b.at(n), what + ": " + n));
  }
}

// export-hf of root/<from>/s2 into root/hf_<from>; its model.safetensors.
fs::path export_to(const fs::path& root, const std::string& from) {
  export_hf(root / from / "s2", root / ("hf_" + from));
  return root / ("hf_" + from) / "model.safetensors";
}

void reshard_matches_online(bool zero1) {
  const nxd::testing::ScratchDir dir(zero1 ? "moe_offline_z1_" : "moe_offline_");
  const fs::path& root = dir.path;
  const State saved = run({.world = 4, .ep = 4, .zero1 = zero1}, root / "ep4", "s2", true);
  EXPECT_EQ(saved.params.count("model.layers.1.block_sparse_moe.experts.3.w2.weight"), 1u);
  EXPECT_GT(saved.optim.size(), 0u);
  EXPECT_GT(verify_checkpoint(root / "ep4" / "s2").experts, 0);
  for (const Run& to :
       {Run{.world = 4, .ep = 2, .zero1 = zero1}, Run{.world = 2, .ep = 2, .zero1 = zero1},
        Run{.world = 1, .zero1 = zero1}}) {
    const std::string name = str("dp", to.world, "_ep", to.ep);
    reshard_checkpoint(root / "ep4" / "s2", root / name, {.dp = to.world, .ep = to.ep});
    const VerifyReport v = verify_checkpoint(root / name / "s2");
    EXPECT_GT(v.experts, 0) << name;
    const json meta = read_metadata(root / name / "s2");
    EXPECT_EQ(meta.value("expert_parallel", 1), to.ep) << name;
    EXPECT_EQ(meta["parallel"].value("zero1", false), zero1) << name;
    const State online = run(to, root / "ep4", "s2", false);
    const State offline = run(to, root / name, "s2", false);
    expect_same(offline.params, online.params, name + " parameters");
    expect_same(offline.optim, online.optim, name + " optimizer state");
    expect_same(offline.params, saved.params, name + " parameters vs saved");
    expect_same(offline.optim, saved.optim, name + " optimizer state vs saved");
    EXPECT_EQ(offline.loss, online.loss) << name;  // bitwise
    expect_same(offline.params_after, online.params_after, name + " after a step");
    std::printf(
        "    %s%s: offline = online bitwise (%zu parameters, %zu state tensors), loss %.9g\n",
        name.c_str(), zero1 ? " zero1" : "", offline.params.size(), offline.optim.size(),
        offline.loss);
  }
  // pipeline stages with experts split: PP 2 x DP 2 x EP 2
  reshard_checkpoint(root / "ep4" / "s2", root / "pp2_ep2", {.pp = 2, .dp = 2, .ep = 2});
  EXPECT_GT(verify_checkpoint(root / "pp2_ep2" / "s2").experts, 0);
  // export-hf of EP 2 (with and without PP), EP 4 and one rank: the same tensors, byte for byte
  const auto one = io::SafetensorsReader(export_to(root, "dp1_ep1")).read_all();
  ASSERT_EQ(one.size(), saved.params.size());
  for (const char* from : {"dp2_ep2", "ep4", "pp2_ep2"}) {
    const auto other = io::SafetensorsReader(export_to(root, from)).read_all();
    ASSERT_EQ(other.size(), one.size()) << from;
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(other[i].first, one[i].first) << from;
      EXPECT_TRUE(nxd::testing::bitwise_equal(other[i].second, one[i].second,
                                              str(from, " vs one rank: ", one[i].first)));
    }
  }
  for (const auto& [name, t] : one)
    EXPECT_TRUE(nxd::testing::bitwise_equal(t, saved.params.at(name), name + " vs saved"));
  // model.init_from reads an EP checkpoint the same way (every expert from its EP rank's file)
  const auto init = read_source_weights(inspect_weight_source(root / "ep4" / "s2"));
  ASSERT_EQ(init.size(), saved.params.size());
  for (const auto& [name, t] : init)
    EXPECT_TRUE(nxd::testing::bitwise_equal(t, saved.params.at(name), name + " init_from"));
}

TEST(MoeOffline, ReshardEp4ToEp2AndOneRankMatchesOnlineLoad) {
  reshard_matches_online(false);
}

TEST(MoeOffline, Zero1ReshardEp4ToEp2AndOneRankMatchesOnlineLoad) {
  reshard_matches_online(true);
}

// Context parallelism counts as data parallelism in a checkpoint: at CP 2 x EP 2 (DP 2) EP is
// folded over the data x context ranks q = 2 dp + cp, so the experts of EP rank 1 come from q = 1
// (DP index 0, CP rank 1: expert-DP rank 0 of EP rank 1), written once, and the experts' ZeRO-1
// state (sharded over the expert-DP group, here the DP ranks of one CP rank) once too: trained 2
// steps, saved, the checkpoint loads on one rank and at CP 2 x EP 4 bitwise.
TEST(MoeOffline, ContextParallelSaveWritesEveryExpertOnce) {
  const nxd::testing::ScratchDir dir("moe_cp_ep_");
  for (bool zero1 : {false, true}) {
    const std::string tag = zero1 ? "z" : "a";
    const State saved =
        run({.world = 4, .ep = 2, .cp = 2, .zero1 = zero1}, dir.path, tag, true, /*steps=*/2);
    EXPECT_GT(verify_checkpoint(dir.path / tag).experts, 0);
    const State one = run({.world = 1, .zero1 = zero1}, dir.path, tag, false, 2);
    expect_same(one.params, saved.params, tag + " parameters");
    expect_same(one.optim, saved.optim, tag + " optimizer state");
    // and back at CP 2 with the experts split another way (EP 4: one EP group of all four ranks,
    // the ZeRO-1 expert state unsharded): the same tensors
    const State ep4 = run({.world = 4, .ep = 4, .cp = 2, .zero1 = zero1}, dir.path, tag, false, 2);
    expect_same(ep4.params, saved.params, tag + " parameters at CP 2 x EP 4");
    expect_same(ep4.optim, saved.optim, tag + " optimizer state at CP 2 x EP 4");
  }
}

}  // namespace
}  // namespace nxd::ckpt
