// Context-parallel training against the single-rank model: every CP rank holds its balanced
// chunks of each sequence (context_parallel_slice of ids and shifted targets); 20 steps (SGD; AdamW
// under ZeRO-1) must
// give the single rank's losses within 1e-5, the first step's gradients (after the DP x CP
// reduction, gathered over TP) and the final parameters within 1e-5 relative (max|a-b| / max|b|
// per tensor), with TP (and SP), DP, ZeRO-1 over DP x CP, and PP.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/layers/parallel/context_parallel.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/optimizer.h"
#include "nxd/optim/zero1.h"
#include "nxd/pipeline/pipeline_model.h"
#include "nxd/runtime/context.h"
#include "support/compare.h"
#include "support/gather_tp.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::optim;
using nxd::testing::gather_tp;
using nxd::testing::run_ranks;
namespace ps = nxd::parallel_state;

namespace {

constexpr double kTol = 1e-5;
constexpr uint64_t kSeed = 31;
constexpr int kSteps = 20;
// SGD, except AdamW under ZeRO-1: AdamW turns the rounding noise of a gradient that is zero in
// exact arithmetic (GPT-NeoX's key bias: softmax ignores a per-row constant) into steps of lr
constexpr double kSgdLr = 0.05, kAdamLr = 1e-2;
constexpr int64_t kB = 4, kS = 16;

// tiny_model with a smaller vocabulary, FFN 48 for both architectures, kS positions, init_std 0.1
ModelConfig tiny(const std::string& arch = "llama") {
  ModelConfig c = nxd::testing::tiny_model(arch);
  c.vocab_size = 32;
  c.ffn_hidden_size = 48;
  c.max_position_embeddings = kS;
  c.init_std = 0.1;
  return c;
}

Tensor ids_of(int64_t vocab, uint64_t seed) {
  RngStream s{seed, 77};
  std::vector<int64_t> v(kB * kS);
  for (int64_t i = 0; i < kB * kS; ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * vocab);
  return from_vector<int64_t>(v, {kB, kS});
}

// DP rank d's batch [kB, kS] of step s; targets have an ignored position.
struct Batch {
  Tensor ids, targets;
};
Batch batch(const ModelConfig& c, int d, int s) {
  Batch b{ids_of(c.vocab_size, 1000 + 10 * s + d), ids_of(c.vocab_size, 5000 + 10 * s + d)};
  b.targets.set({0, 3}, -100);
  return b;
}

std::vector<NamedParam> named(Module& m) {
  std::vector<NamedParam> out;
  for (auto& [n, t] : m.named_parameters()) out.push_back({n, t});
  return out;
}

struct Reference {
  std::vector<double> losses;
  std::map<std::string, Tensor> grads, final_weights;  // grads after the first backward
};

// One rank, AdamW: each step the mean over `mbs` microbatches per DP rank's batch (as the DP
// average of PipelineModel's microbatch means; mbs = 1 without PP).
std::unique_ptr<Optimizer> make_optimizer(const std::vector<NamedParam>& params, bool adam) {
  if (adam) return std::make_unique<AdamW>(default_param_groups(params, kAdamLr, 0.0));
  return std::make_unique<SGD>(default_param_groups(params, kSgdLr, 0.0));
}

Reference reference(const ModelConfig& cfg, int dp, int mbs, bool adam) {
  Reference r;
  // a one-rank context of this thread (under mpirun: on every process)
  Context ctx(ContextOptions{.seed = 0});
  ContextGuard guard(ctx);
  {
    auto m = make_causal_lm(cfg, kSeed);
    std::unique_ptr<Optimizer> opt_ptr = make_optimizer(named(*m), adam);
    Optimizer& opt = *opt_ptr;
    const int64_t rows = kB / mbs;
    for (int s = 0; s < kSteps; ++s) {
      opt.zero_grad(true);
      double loss = 0;
      for (int d = 0; d < dp; ++d) {
        const Batch b = batch(cfg, d, s);
        for (int i = 0; i < mbs; ++i) {
          Tensor l = mul(m->loss(b.ids.narrow(0, i * rows, rows).contiguous(),
                                 b.targets.narrow(0, i * rows, rows).contiguous()),
                         1.0 / (mbs * dp));
          backward(l);
          loss += l.item();
        }
      }
      r.losses.push_back(loss);
      if (s == 0)
        for (auto& [n, t] : m->named_parameters()) r.grads[n] = t.grad().clone();
      opt.step();
    }
    for (auto& [n, t] : m->named_parameters()) r.final_weights[n] = t.detach().clone();
  }
  return r;
}

struct CpCase {
  std::string what;
  ModelConfig cfg = tiny();
  int cp = 2, tp = 1, dp = 1, pp = 1;
  bool zero1 = false;
  int microbatches = 1;  // PP
};

struct Worst {
  std::mutex mu;
  double rel = 0;
  std::string what;
  void add(const Tensor& a, const Tensor& b, const std::string& w) {
    EXPECT_TRUE(nxd::testing::close_rel(a, b, kTol, w));
    if (a.shape() != b.shape()) return;
    const double d = nxd::testing::diff(a, b).rel();
    std::lock_guard<std::mutex> g(mu);
    if (d > rel || what.empty()) rel = d, what = w;
  }
};

// The parameters of this rank (whole model, or its pipeline chunks) with their attributes.
std::vector<ParallelParameter> params_of(const std::vector<std::shared_ptr<CausalLM>>& models) {
  std::vector<ParallelParameter> out;
  for (const auto& m : models)
    for (const ParallelParameter& p : parallel_parameters(*m)) out.push_back(p);
  return out;
}

// This rank's rows of DP rank d's batch.
Batch local_batch(const ModelConfig& cfg, int s) {
  const Batch b = batch(cfg, ps::get_data_parallel_rank(), s);
  const int r = ps::get_context_parallel_rank(), n = ps::get_context_parallel_size();
  return {context_parallel_slice(b.ids, 1, r, n), context_parallel_slice(b.targets, 1, r, n)};
}

// One training step of the model without PP; returns the loss averaged over DP.
double step_plain(CausalLM& m, Optimizer& opt, GradSync* sync, const Batch& b) {
  Tensor loss = m.loss(b.ids, b.targets);
  backward(loss);
  if (sync) sync->finish();
  if (m.sequence_parallel()) allreduce_sequence_parallel_gradients(m);
  Tensor l = loss.detach().clone();
  ps::get_data_parallel_group().all_reduce(l, ReduceOp::avg);
  return l.item();
}

void check_matches_single_rank(const CpCase& k) {
  SCOPED_TRACE(k.what);
  const Reference ref = reference(k.cfg, k.dp, k.microbatches, k.zero1);
  Worst worst;
  ModelConfig cfg = k.cfg;
  const bool ran = run_ranks(k.cp * k.tp * k.dp * k.pp, [&] {
    ps::initialize_model_parallel(
        ps::ParallelSizes{.tensor = k.tp, .pipeline = k.pp, .context = k.cp});
    std::vector<std::shared_ptr<CausalLM>> models;
    std::unique_ptr<pipeline::PipelineModel> pm;
    std::vector<NamedParam> params;
    if (k.pp > 1) {
      pipeline::PipelineOptions po;
      po.num_microbatches = k.microbatches;
      pm = std::make_unique<pipeline::PipelineModel>(cfg, kSeed, po);
      models = pm->chunks();
      params = pm->local_named_parameters();
    } else {
      models.push_back(make_causal_lm(cfg, kSeed));
      params = named(*models[0]);
    }
    EXPECT_EQ(models[0]->context_parallel_size(), k.cp);
    std::unique_ptr<Optimizer> opt;
    std::unique_ptr<GradSync> sync;
    if (k.zero1) {
      Zero1Options zo{AdamWOptions{}, nullptr, NormGroups::from_parallel_state(),
                      norm_params(*models[0])};
      opt = std::make_unique<Zero1AdamW>(default_param_groups(params, kAdamLr, 0.0), zo);
    } else {
      opt = make_optimizer(params, false);
      if (!pm)
        sync = std::make_unique<GradSync>(params, GradSyncOptions{.mode = GradSyncMode::at_step});
    }
    for (int s = 0; s < kSteps; ++s) {
      opt->zero_grad(true);
      const Batch b = local_batch(cfg, s);
      const double loss =
          pm ? pm->run_train(b.ids, b.targets).item() : step_plain(*models[0], *opt, sync.get(), b);
      worst.add(scalar(loss, DType::f64), scalar(ref.losses[s], DType::f64),
                "loss step " + std::to_string(s));
      if (s == 0 && !k.zero1)
        for (const ParallelParameter& p : params_of(models))
          worst.add(gather_tp(p.tensor.grad(), p.attrs), ref.grads.at(p.name), p.name + ".grad");
      opt->step();
    }
    for (const ParallelParameter& p : params_of(models))
      worst.add(gather_tp(p.tensor, p.attrs), ref.final_weights.at(p.name), p.name + " (final)");
  });
  if (!ran) {
    std::printf("    [%s] skipped: needs more ranks than this mpirun has\n", k.what.c_str());
    return;
  }
  std::printf(
      "    [%s] loss %.4f -> %.4f; largest relative difference to the single rank %.3g (%s)\n",
      k.what.c_str(), ref.losses.front(), ref.losses.back(), worst.rel, worst.what.c_str());
}

TEST(ContextParallelModel, Cp2AndCp4MatchOneRank) {
  check_matches_single_rank({.what = "cp2"});
  check_matches_single_rank({.what = "cp4", .cp = 4});
}

TEST(ContextParallelModel, WithTensorAndSequenceParallelism) {
  ModelConfig sp = tiny();
  sp.sequence_parallel = true;
  check_matches_single_rank({.what = "cp2 tp2 sp", .cfg = sp, .tp = 2});
  check_matches_single_rank({.what = "cp4 tp2", .cp = 4, .tp = 2});
  check_matches_single_rank({.what = "gpt_neox cp2 tp2", .cfg = tiny("gpt_neox"), .tp = 2});
}

// Dropout: every rank gets its rows of the mask the single rank draws for the whole sequence.
TEST(ContextParallelModel, DropoutMasksAreTheSingleRanks) {
  ModelConfig c = tiny();
  c.dropout = 0.2;
  check_matches_single_rank({.what = "cp2 dropout", .cfg = c});
  c.sequence_parallel = true;
  check_matches_single_rank({.what = "cp2 tp2 sp dropout", .cfg = c, .tp = 2});
  ModelConfig n = tiny("gpt_neox");
  n.dropout = 0.2;
  check_matches_single_rank({.what = "gpt_neox cp4 dropout", .cfg = n, .cp = 4});
}

TEST(ContextParallelModel, WithDataParallelismAndZero1) {
  check_matches_single_rank({.what = "cp2 dp2", .dp = 2});
  check_matches_single_rank({.what = "cp2 dp2 zero1", .dp = 2, .zero1 = true});
}

TEST(ContextParallelModel, WithPipelineParallelism) {
  check_matches_single_rank({.what = "cp2 pp2 M2", .pp = 2, .microbatches = 2});
}

TEST(ContextParallelModel, SequenceParallelNeedsDivisibleLocalLength) {
  run_ranks(4, [&] {
    ps::initialize_model_parallel(ps::ParallelSizes{.tensor = 2, .context = 2});
    ModelConfig c = tiny();
    c.sequence_parallel = true;
    auto m = make_causal_lm(c, kSeed);
    Tensor ids = zeros({1, 3}, DType::i64);  // 3 local tokens, TP 2
    EXPECT_THROW(m->loss(ids, ids), ShapeError);
  });
}

}  // namespace
