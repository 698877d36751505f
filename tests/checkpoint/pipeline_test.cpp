// Checkpoints of pipeline stages: a PipelineModel (tied embeddings) saved at TP2 x PP2 loads at
// TP1 x PP1, TP1 x PP2 and TP1 x PP4, and a single-rank checkpoint loads at TP2 x PP2; on every
// rank every parameter and AdamW state tensor is bitwise its block of the single-rank tensor,
// and the loaded pipeline computes the single-rank loss within 1e-6.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <mutex>

#include "ckpt_util.h"
#include "nxd/checkpoint/reshard.h"
#include "nxd/pipeline/pipeline_model.h"
#include "support/files.h"
#include "support/ranks.h"

namespace nxd::ckpt {
namespace {
namespace fs = std::filesystem;
namespace ps = parallel_state;
using nxd::testing::run_ranks;

ModelConfig pp_config(int tp) {
  ModelConfig c = nxd::testing::ckpt_model_config(tp);
  c.num_layers = 4;
  c.tie_word_embeddings = true;
  return c;
}

struct Batch {
  Tensor ids, targets;
};
Batch batch(int64_t k) {
  std::vector<int64_t> v(4 * 9);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 5 + k * 3 + 1) % 32);
  Tensor all = from_vector<int64_t>(v, {4, 9});
  return {all.narrow(1, 0, 8).contiguous(), all.narrow(1, 1, 8).contiguous()};
}

struct Stage {
  std::unique_ptr<pipeline::PipelineModel> pm;
  std::unique_ptr<optim::AdamW> opt;
  std::vector<Module*> chunks;
  std::vector<const Module*> const_chunks;
  Stage(int tp, uint64_t seed) {
    pipeline::PipelineOptions o;
    o.num_microbatches = 2;
    pm = std::make_unique<pipeline::PipelineModel>(pp_config(tp), seed, o);
    opt = std::make_unique<optim::AdamW>(
        optim::default_param_groups(pm->local_named_parameters(), 1e-2, 0.01));
    for (const auto& c : pm->chunks()) {
      chunks.push_back(c.get());
      const_chunks.push_back(c.get());
    }
  }
};

// Every local tensor (model and optimizer state) against its block of the single-rank tensors.
void expect_blocks(Stage& s, const std::map<std::string, Tensor>& full, const std::string& what) {
  std::map<std::string, ShardSpec> spec;
  for (Module* m : s.chunks)
    for (const auto& p : parallel_parameters(*m)) spec[p.name] = shard_spec(p.attrs);
  const int r = ps::get_tensor_model_parallel_rank();
  auto check = [&](const std::string& key, const std::string& param, const Tensor& t) {
    const ShardSpec sp = t.dim() > 0 && spec.count(param) ? spec[param] : ShardSpec{};
    ASSERT_TRUE(full.count(key)) << what << ": " << key;
    EXPECT_TRUE(nxd::testing::bitwise_equal(
        t.detach(), shard_view(full.at(key), sp, r).contiguous(), what + " " + key));
  };
  for (Module* m : s.chunks)
    for (const auto& [n, t] : m->state_dict()) check("m:" + n, n, t);
  for (const auto& [n, t] : s.opt->state_tensors()) check("o:" + n, n.substr(0, n.rfind('.')), t);
}

TEST(CheckpointPipeline, Tp2Pp2ToOtherLayoutsAndBack) {
  const nxd::testing::ScratchDir root_scratch("nxd_ckpt_pp_");
  const fs::path& root = root_scratch.path;
  const Batch b = batch(0);
  run_ranks(4, [&] {
    ps::initialize_model_parallel(2, 2);
    Stage s(2, 1);
    s.pm->zero_grad();
    s.pm->run_train(b.ids, b.targets);
    s.opt->step();
    save_checkpoint(root / "tp2pp2", "t", s.const_chunks, s.opt.get(), nullptr,
                    nlohmann::json{{"pp", 2}});
  });
  const nlohmann::json meta = read_metadata(root / "tp2pp2/t");
  EXPECT_EQ(meta["parallel"]["pp"], 2);
  EXPECT_TRUE(fs::exists(root / "tp2pp2/t/model/dp_rank_00_tp_rank_01_pp_rank_01.safetensors"));
  // the single-rank view of the checkpoint
  nxd::testing::Trainee one(1, 5);
  one.model = make_causal_lm(pp_config(1), 5);
  std::vector<optim::NamedParam> ps1;
  for (const auto& [n, t] : one.model->named_parameters()) ps1.push_back({n, t});
  one.opt = std::make_unique<optim::AdamW>(optim::default_param_groups(ps1, 1e-2, 0.01));
  EXPECT_EQ(load_checkpoint(root / "tp2pp2", one.model.get(), one.opt.get(), nullptr).at("pp"), 2);
  const auto full = nxd::testing::snapshot(*one.model, one.opt.get());
  const double loss1 = one.model->loss(b.ids, b.targets).item();
  save_checkpoint(root / "tp1pp1", "t", one.model.get(), one.opt.get(), nullptr);

  struct Layout {
    int tp, pp;
    const char* from;
  };
  for (const Layout& l : {Layout{2, 2, "tp2pp2"}, Layout{1, 2, "tp2pp2"}, Layout{1, 4, "tp2pp2"},
                          Layout{2, 2, "tp1pp1"}}) {
    const std::string what =
        std::string(l.from) + " -> tp" + std::to_string(l.tp) + "pp" + std::to_string(l.pp);
    std::mutex mu;
    run_ranks(l.tp * l.pp, [&] {
      ps::initialize_model_parallel(l.tp, l.pp);
      Stage s(l.tp, 9);
      load_checkpoint(root / l.from, s.chunks, s.opt.get(), nullptr);
      const double loss = s.pm->run_eval(b.ids, b.targets).item();
      std::lock_guard<std::mutex> g(mu);
      expect_blocks(s, full, what);
      EXPECT_LE(std::abs(loss - loss1), 1e-6 * std::abs(loss1))
          << what << ": " << loss << " vs " << loss1;
    });
  }
}

}  // namespace
}  // namespace nxd::ckpt
