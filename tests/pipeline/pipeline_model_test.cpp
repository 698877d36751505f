// PipelineModel against the single-rank model: the same microbatches accumulated on one rank
// (backward of loss_mb / M each) give the reference loss and gradients; every PP (x TP x DP)
// configuration must match them within 1e-5 relative (max|a-b| / max|b| per tensor), every
// parameter must start bitwise equal to the whole model's (init by name), and every parameter
// of the whole model must live on exactly one stage (two for a tied embedding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/optim/optimizer.h"
#include "nxd/pipeline/partition.h"
#include "nxd/pipeline/pipeline_model.h"
#include "support/compare.h"
#include "support/gather_tp.h"
#include "support/ranks.h"
#include "support/tiny_models.h"
#include "toy_lm.h"

using namespace nxd;
using namespace nxd::pipeline;
using nxd::testing::gather_tp;
using nxd::testing::run_ranks;
namespace ps = nxd::parallel_state;

namespace {

constexpr double kTol = 1e-5;
constexpr uint64_t kSeed = 23;

ModelConfig tiny(const std::string& arch = "llama", int64_t layers = 8) {
  ModelConfig c = nxd::testing::micro_model(arch);
  c.num_layers = layers;
  return c;
}

Tensor ids_of(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  RngStream s{seed, 91};
  std::vector<int64_t> v(B * S);
  for (int64_t i = 0; i < B * S; ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * vocab);
  return from_vector<int64_t>(v, {B, S});
}

struct Batch {
  Tensor ids, targets;  // the global batch: DP rank d owns rows [d*B/dp, (d+1)*B/dp)
};
Batch batch(const ModelConfig& c, int64_t B, int64_t S, int step = 0) {
  Batch b{ids_of(B, S, c.vocab_size, 5 + step), ids_of(B, S, c.vocab_size, 105 + step)};
  b.targets.set({0, 1}, -100);  // an ignored target
  return b;
}

struct Reference {
  std::vector<double> losses;                    // per step
  std::map<std::string, Tensor> weights, grads;  // after the first step's backward
  double grad_norm = 0;
};

// One rank: `steps` SGD steps, each over M*dp microbatches (the DP ranks' microbatches in order).
Reference reference(const ModelConfig& cfg, int64_t B, int64_t S, int mbs, int steps = 1,
                    double lr = 0.1, const PartBuilder& build = {}) {
  Reference r;
  run_ranks(1, [&] {
    auto m = build_part(build, cfg, kSeed, ModelPart{});
    for (auto& [n, t] : m->named_parameters()) r.weights[n] = t.detach().clone();
    std::vector<optim::NamedParam> params;
    for (auto& [n, t] : m->named_parameters()) params.push_back({n, t});
    optim::SGD opt({optim::ParamGroup{"all", params, lr}});
    for (int s = 0; s < steps; ++s) {
      m->zero_grad();
      Batch b = batch(cfg, B, S, s);
      const int64_t rows = B / mbs;
      double loss = 0;
      for (int i = 0; i < mbs; ++i) {
        Tensor l = mul(m->loss(b.ids.narrow(0, i * rows, rows).contiguous(),
                               b.targets.narrow(0, i * rows, rows).contiguous()),
                       1.0 / mbs);
        backward(l);
        loss += l.item();
      }
      r.losses.push_back(loss);
      if (s == 0) {
        double sq = 0;
        for (auto& [n, t] : m->named_parameters()) {
          r.grads[n] = t.grad().clone();
          for (double g : t.grad().to_vector()) sq += g * g;
        }
        r.grad_norm = std::sqrt(sq);
      }
      opt.step();
    }
  });
  return r;
}

struct PPCase {
  std::string what;
  ModelConfig cfg;
  int tp = 1, pp = 2, dp = 1;
  PipelineOptions opts;
  int64_t B = 8, S = 8;
};

struct Worst {
  std::mutex mu;
  double rel = 0;
  std::string what;
  double tol = kTol;
  void add(const Tensor& a, const Tensor& b, const std::string& w) {
    EXPECT_TRUE(nxd::testing::close_rel(a, b, tol, w));
    if (a.shape() != b.shape()) return;
    const double d = nxd::testing::diff(a, b).rel();
    std::lock_guard<std::mutex> g(mu);
    if (d > rel || what.empty()) rel = d, what = w;
  }
};

void check_matches_single_rank(const PPCase& s) {
  SCOPED_TRACE(s.what);
  const int M = s.opts.num_microbatches;
  const Reference ref = reference(s.cfg, s.B, s.S, M * s.dp, 1, 0.1, s.opts.pieces.build);
  Worst worst;
  std::mutex mu;
  std::multiset<std::string> owned;  // parameter names over PP stages (TP/DP rank 0)
  std::vector<std::string> tied;     // the tied weights (held by the first and last stage)
  run_ranks(s.tp * s.pp * s.dp, [&] {
    ps::initialize_model_parallel(s.tp, s.pp);
    PipelineModel pm(s.cfg, kSeed, s.opts);
    if (ps::get_pipeline_model_parallel_rank() == 0 && ps::get_tensor_model_parallel_rank() == 0 &&
        ps::get_data_parallel_rank() == 0)
      tied = pm.pieces().tied;
    Batch b = batch(s.cfg, s.B, s.S);
    const int64_t rows = s.B / s.dp, d = ps::get_data_parallel_rank();
    Tensor loss = pm.run_train(b.ids.narrow(0, d * rows, rows).contiguous(),
                               b.targets.narrow(0, d * rows, rows).contiguous());
    worst.add(loss, scalar(ref.losses[0]), "loss");
    for (auto& chunk : pm.chunks())
      for (const ParallelParameter& p : parallel_parameters(*chunk)) {
        auto it = ref.weights.find(p.name);
        if (it == ref.weights.end()) {
          ADD_FAILURE() << p.name << " is not a parameter of the whole model";
          continue;
        }
        EXPECT_TRUE(nxd::testing::bitwise_equal(gather_tp(p.tensor, p.attrs), it->second, p.name));
        if (!p.tensor.grad().defined()) {
          ADD_FAILURE() << "no gradient for " << p.name;
          continue;
        }
        worst.add(gather_tp(p.tensor.grad(), p.attrs), ref.grads.at(p.name), p.name + ".grad");
        if (ps::get_tensor_model_parallel_rank() == 0 && d == 0) {
          std::lock_guard<std::mutex> g(mu);
          owned.insert(p.name);
        }
      }
    const double norm = optim::parallel_grad_norm(pm.norm_params(), pm.norm_groups());
    EXPECT_NEAR(norm, ref.grad_norm, kTol * ref.grad_norm) << "grad norm";
  });
  EXPECT_EQ(tied.size(), s.cfg.tie_word_embeddings ? 1u : 0u);
  for (const auto& [name, t] : ref.weights) {
    const bool twice = s.pp > 1 && std::find(tied.begin(), tied.end(), name) != tied.end();
    EXPECT_EQ(owned.count(name), twice ? 2u : 1u) << name;
  }
  EXPECT_EQ(owned.size(), ref.weights.size() + (s.pp > 1 ? tied.size() : 0));
  std::printf("    [%s] largest relative difference %.3g (%s)\n", s.what.c_str(), worst.rel,
              worst.what.c_str());
}

}  // namespace

TEST(PipelineModel, MatchesSingleRankForEveryScheduleAndMicrobatchCount) {
  for (int pp : {2, 4}) {
    for (int m : {1, 2, 4, 8}) {
      for (ScheduleKind k :
           {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved}) {
        if (k == ScheduleKind::interleaved && m % pp != 0) continue;
        PPCase s;
        s.cfg = tiny();
        s.pp = pp;
        s.opts.num_microbatches = m;
        s.opts.schedule = k;
        s.opts.virtual_pipeline_size = k == ScheduleKind::interleaved ? 2 : 1;
        s.what =
            std::string(schedule_name(k)) + " pp=" + std::to_string(pp) + " M=" + std::to_string(m);
        check_matches_single_rank(s);
      }
    }
  }
}

TEST(PipelineModel, GPTNeoXWithCutsAndTiedEmbeddings) {
  PPCase s;
  s.cfg = tiny("gpt_neox", 4);
  s.cfg.tie_word_embeddings = true;
  s.pp = 2;
  s.opts.num_microbatches = 4;
  s.opts.pipeline_cuts = {"gpt_neox.layers.0"};
  s.what = "gpt_neox tied pp=2 cuts after layer 0";
  check_matches_single_rank(s);
  s.cfg.arch = "llama";
  s.opts.pipeline_cuts.clear();
  s.pp = 4;
  s.what = "llama tied pp=4";
  check_matches_single_rank(s);
}

// A CausalLM the library does not know (tests/pipeline/toy_lm.h: its own names, unequal layers)
// pipelines through its part builder, cut by parameters or by modeled cost.
TEST(PipelineModel, AUserDefinedCausalLMMatchesOneRank) {
  for (bool tied : {false, true})
    for (PartitionBalance balance :
         {PartitionBalance::parameters, PartitionBalance::modeled_cost}) {
      PPCase s;
      s.cfg = nxd::testing::toy_config(6);
      s.cfg.tie_word_embeddings = tied;
      s.opts.pieces.build = nxd::testing::build_toy;
      s.opts.balance = balance;
      s.opts.num_microbatches = 4;
      const std::string toy = std::string("toy ") + (tied ? "tied " : "");
      s.what = toy + "pp=2 balanced by " + partition_balance_name(balance);
      check_matches_single_rank(s);
      if (balance == PartitionBalance::modeled_cost) continue;
      s.pp = 3;
      s.opts.pipeline_cuts = {"blocks.2", "blocks.4"};
      s.what = toy + "pp=3 cut after blocks.2, blocks.4";
      check_matches_single_rank(s);
    }
}

TEST(PipelineModel, TensorSequenceAndDataParallelInsideThePipeline) {
  PPCase s;
  s.cfg = tiny("llama", 4);
  s.tp = 2;
  s.pp = 2;
  s.opts.num_microbatches = 2;
  s.what = "tp=2 pp=2";
  check_matches_single_rank(s);
  s.cfg.sequence_parallel = true;
  s.what = "tp=2 sp pp=2";
  check_matches_single_rank(s);
  s.cfg.activations_checkpoint_granularity = CheckpointGranularity::full;
  s.what = "tp=2 sp pp=2 full activation checkpointing";
  check_matches_single_rank(s);
  s.cfg.activations_checkpoint_granularity = CheckpointGranularity::selective;
  s.opts.schedule = ScheduleKind::gpipe;
  s.what = "tp=2 sp pp=2 gpipe selective activation checkpointing";
  check_matches_single_rank(s);
  s.cfg.activations_checkpoint_granularity = CheckpointGranularity::none;
  s.opts.schedule = ScheduleKind::one_f_one_b;
  s.dp = 2;
  s.cfg.tie_word_embeddings = true;
  s.what = "tp=2 sp pp=2 dp=2 tied";
  check_matches_single_rank(s);
}

TEST(PipelineModel, TiedEmbeddingsStayBitwiseEqualOverSteps) {
  ModelConfig cfg = tiny("llama", 4);
  cfg.tie_word_embeddings = true;
  constexpr int kSteps = 20, kM = 2;
  const Reference ref = reference(cfg, 8, 8, kM, kSteps);
  Worst worst;
  worst.tol = 1e-4;  // 20 SGD steps: the single rank's losses within 1e-4 per step
  run_ranks(2, [&] {
    ps::initialize_model_parallel(1, 2);
    PipelineOptions o;
    o.num_microbatches = kM;
    PipelineModel pm(cfg, kSeed, o);
    optim::SGD opt({optim::ParamGroup{"all", pm.local_named_parameters(), 0.1}});
    for (int s = 0; s < kSteps; ++s) {
      pm.zero_grad();
      Batch b = batch(cfg, 8, 8, s);
      worst.add(pm.run_train(b.ids, b.targets), scalar(ref.losses[s]),
                "loss step " + std::to_string(s));
      opt.step();
    }
    Communicator& g = ps::get_pipeline_model_parallel_group();
    Tensor mine = (g.rank() == 0 ? pm.chunks().front() : pm.chunks().back())
                      ->get_parameter("model.embed_tokens.weight")
                      .detach()
                      .clone();
    Tensor first = mine.clone();
    g.broadcast(first, 0);
    EXPECT_TRUE(nxd::testing::bitwise_equal(mine, first, "embedding copy on pp rank 1"));
    // and the eval loss of the trained model is the same on both ranks
    Batch b = batch(cfg, 8, 8, 99);
    Tensor e = pm.run_eval(b.ids, b.targets);
    Tensor e0 = e.clone();
    g.broadcast(e0, 1);
    EXPECT_TRUE(nxd::testing::bitwise_equal(e, e0, "eval loss"));
  });
  std::printf("    largest relative difference %.3g (%s)\n", worst.rel, worst.what.c_str());
}

TEST(PipelineModel, EvalMatchesTheSingleRankLoss) {
  ModelConfig cfg = tiny("gpt_neox", 4);
  double want = 0;
  run_ranks(1, [&] {
    auto m = make_causal_lm(cfg, kSeed);
    NoGradGuard ng;
    Batch b = batch(cfg, 4, 8);
    for (int i = 0; i < 2; ++i)
      want += m->loss(b.ids.narrow(0, 2 * i, 2).contiguous(),
                      b.targets.narrow(0, 2 * i, 2).contiguous())
                  .item() /
              2;
  });
  for (int vpp : {1, 2}) {
    run_ranks(2, [&] {
      ps::initialize_model_parallel(1, 2);
      PipelineOptions o;
      o.num_microbatches = 2;
      o.virtual_pipeline_size = vpp;
      o.schedule = vpp > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b;
      PipelineModel pm(cfg, kSeed, o);
      Batch b = batch(cfg, 4, 8);
      EXPECT_NEAR(pm.run_eval(b.ids, b.targets).item(), want, kTol * want) << "vpp " << vpp;
      for (const auto& p : pm.local_named_parameters())
        EXPECT_FALSE(p.param.grad().defined()) << p.name;
    });
  }
}

TEST(PipelineModel, PartitioningByCutsAndByParameterCount) {
  ModelConfig cfg = tiny("llama", 6);
  auto parts = partition_by_cuts(measure_pieces(cfg), {"model.layers.0", "model.layers.3"}, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].str(cfg), "embedding + layers [0, 1)");
  EXPECT_EQ(parts[1].str(cfg), "layers [1, 4)");
  EXPECT_EQ(parts[2].str(cfg), "layers [4, 6) + head");
  const ModelPieces pieces = measure_pieces(cfg);
  auto err = [&](const std::vector<std::string>& cuts, int stages) {
    try {
      partition_by_cuts(pieces, cuts, stages);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err({"model.layers.9"}, 2).find("'model.layers.9' is not a decoder layer"),
            std::string::npos);
  EXPECT_NE(err({"model.layers.3", "model.layers.1"}, 3).find("does not come after"),
            std::string::npos);
  EXPECT_NE(err({"model.layers.5"}, 2).find("last stage without layers"), std::string::npos);
  EXPECT_NE(err({"model.layers.1"}, 3).find("1 cuts for 3 stages"), std::string::npos);
  EXPECT_THROW(auto_partition(cfg, 7), ConfigError);
  {  // a part holds only its pieces, under the whole model's names, and is not a whole model
    auto mid = make_causal_lm(cfg, kSeed, parts[1]);
    std::vector<std::string> names;
    for (auto& [n, t] : mid->named_parameters())
      if (n.find("input_layernorm") != std::string::npos) names.push_back(n);
    EXPECT_EQ(names, (std::vector<std::string>{"model.layers.1.input_layernorm.weight",
                                               "model.layers.2.input_layernorm.weight",
                                               "model.layers.3.input_layernorm.weight"}));
    EXPECT_EQ(mid->named_parameters().size(), 3 * 9u);
    try {
      mid->forward(ids_of(1, 4, 32, 1));
      ADD_FAILURE() << "forward on a part";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("needs the whole model; this one is layers [1, 4)"),
                std::string::npos)
          << e.what();
    }
  }

  // equal layers: an even split when embedding and head are small ...
  ModelConfig small = cfg;
  small.vocab_size = 4;
  parts = auto_partition(small, 3);
  for (const auto& p : parts) EXPECT_EQ(p.end(small) - p.layer_begin, 2) << p.str(small);
  // ... and fewer layers on the stages holding a large embedding and head
  ModelConfig big = cfg;
  big.vocab_size = 2048;  // embedding and head 32768 elements each, a layer 2240
  EXPECT_EQ(measure_pieces(big).embedding.parameters, 2048 * 16);
  parts = auto_partition(big, 3);
  EXPECT_EQ(parts[0].str(big), "embedding + layers [0, 1)");
  EXPECT_EQ(parts[1].str(big), "layers [1, 5)");
  EXPECT_EQ(parts[2].str(big), "layers [5, 6) + head");
}

TEST(PipelineModel, ConfigurationErrorsNameTheNumbers) {
  auto err = [](int pp, PipelineOptions o, int64_t layers = 4) {
    std::string msg = "no error";
    run_ranks(pp, [&] {
      ps::initialize_model_parallel(1, pp);
      try {
        PipelineModel pm(tiny("llama", layers), kSeed, o);
        Batch b = batch(tiny(), 6, 4);
        pm.run_train(b.ids, b.targets);
      } catch (const UserError& e) {
        if (ps::get_pipeline_model_parallel_rank() == 0) msg = e.what();
      }
    });
    return msg;
  };
  PipelineOptions o;
  o.num_microbatches = 4;
  EXPECT_NE(err(2, o).find("batch of 6 rows is not divisible into 4 microbatches"),
            std::string::npos);
  o.schedule = ScheduleKind::interleaved;
  o.virtual_pipeline_size = 2;
  o.num_microbatches = 3;
  EXPECT_NE(err(2, o).find("multiple of pp"), std::string::npos);
  o.num_microbatches = 2;
  EXPECT_NE(err(2, o, 3).find("num_layers=3 cannot be split into 4 stages"), std::string::npos);
}
