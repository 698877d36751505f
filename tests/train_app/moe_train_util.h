#pragma once
// Shared by the mixture-of-experts training tests (moe_train_test.cpp, moe_tp_train_test.cpp):
// a tiny MoE Llama, its per-shard batches, and training through NxD's wrappers
// (initialize_parallel_model / initialize_parallel_optimizer) recording every step's loss (the DP
// mean) and gradient norm and the first step's reduced gradients, TP shards gathered into the
// whole tensors (parallel_attributes: partition dim, stride), for the comparison with one rank.
// The single rank computes the DP ranks' losses one shard at a time and averages them (the
// auxiliary loss is per shard). Under context parallelism every CP rank of a DP replica takes its
// balanced chunks of that replica's shard (context_parallel_slice of ids and targets), and after
// the last step every copy of a parameter (DP, CP, expert-DP replicas) is checked bitwise equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "nxd/api/nxd_api.h"
#include "nxd/checkpoint/reshard.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/moe/moe.h"
#include "nxd/layers/parallel/attributes.h"
#include "nxd/layers/parallel/context_parallel.h"
#include "nxd/layers/param_unit.h"
#include "nxd/layers/step_hooks.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

namespace nxd::testing::moe {

namespace ps = nxd::parallel_state;
using namespace nxd::api;  // NxD's API (api/nxd_api.h)

constexpr int kSteps = 20;

inline ModelConfig moe_llama() {
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = 32;
  c.num_layers = 3;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 24;
  c.max_position_embeddings = 16;
  c.init_std = 0.2;
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  c.moe.frequency = 2;  // layers 0 and 2
  c.moe.router_aux_loss_coef = 0.05;
  c.moe.router_z_loss_coef = 0.01;
  return c;
}

inline Tensor shard_ids(int shard, int step, uint64_t base) {
  return random_ids(base + static_cast<uint64_t>(step), static_cast<uint64_t>(shard), 32);
}

struct Trace {
  std::vector<double> losses, norms;
  std::map<std::string, Tensor> grads0;  // step 0's reduced gradients, TP shards gathered
  // After the last step: each parameter's first copy (TP shards gathered), how many copies were
  // compared with it, and the names of those that differed bitwise on some rank.
  std::map<std::string, Tensor> final_params;
  int64_t replica_copies = 0;
  std::vector<std::string> replicas_differing;
};

// This rank's part of shard `shard`'s ids (base 700) or targets (900): its CP chunks under context
// parallelism, the whole [4, 16] batch without.
inline Tensor shard_ids_here(int shard, int step, uint64_t base) {
  Tensor t = shard_ids(shard, step, base);
  const int cp = ps::get_context_parallel_size();
  return cp > 1 ? context_parallel_slice(t, 1, ps::get_context_parallel_rank(), cp) : t;
}

// The whole tensor from every TP rank's shard `local` of a parameter with attributes `a`
// (collective over the TP group; the shard itself when it is not split).
inline Tensor gather_tp_shards(const Tensor& local, const ParallelAttrs& a) {
  const ckpt::ShardSpec s = ckpt::shard_spec(a);
  if (!s.split) return local.contiguous().clone();
  Communicator& tp = ps::get_tensor_model_parallel_group();
  const int64_t n = local.numel();
  Tensor all = empty({tp.size() * n}, local.dtype());
  tp.all_gather(local.contiguous().raw_data(), all.raw_data(), n, local.dtype());
  Tensor full = zeros(ckpt::full_shape(local.shape(), s), local.dtype());
  for (int r = 0; r < tp.size(); ++r)
    ckpt::shard_view(full, s, r).copy_(all.narrow(0, r * n, n).view(local.shape()));
  return full;
}

// Every parameter's reduced gradient of this rank's modules, TP shards gathered (collective over
// TP), recorded on TP rank 0 (the first rank to record a name wins: EP ranks hold other experts).
inline void record_grads(NxDModel& model, std::map<std::string, Tensor>& out, std::mutex& mu) {
  for (Module* m : model.local_modules())
    for (const auto& p : parallel_parameters(*m)) {
      if (!p.tensor.grad().defined()) continue;
      Tensor g = gather_tp_shards(p.tensor.grad(), p.attrs);
      if (ps::get_tensor_model_parallel_rank() != 0) continue;
      std::lock_guard<std::mutex> l(mu);
      if (!out.count(p.name)) out[p.name] = g;
    }
}

// Every parameter after the step (TP shards gathered, recorded on TP rank 0): the first copy of a
// name is kept, every later one (another DP, CP or expert-DP replica) compared with it bitwise.
inline void record_replicas(NxDModel& model, Trace& t, std::mutex& mu) {
  for (Module* m : model.local_modules())
    for (const auto& p : parallel_parameters(*m)) {
      Tensor w = gather_tp_shards(p.tensor.detach(), p.attrs);
      if (ps::get_tensor_model_parallel_rank() != 0) continue;
      std::lock_guard<std::mutex> l(mu);
      auto [it, first] = t.final_params.emplace(p.name, w);
      if (first) continue;
      ++t.replica_copies;
      if (!bitwise_equal(w, it->second, p.name)) t.replicas_differing.push_back(p.name);
    }
}

// `shards` DP batches per step: the parallel run's DP ranks take one each; one rank takes all.
inline Trace train(int world, NxDConfig want, int shards) {
  Trace t;
  std::mutex mu;
  run_ranks(world, [&] {
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto model = initialize_parallel_model(cfg, moe_llama(), 3);
    auto opt = initialize_parallel_optimizer(
        cfg, *model, optim::default_param_groups(model->local_named_parameters(), 1e-3, 0.1),
        optim::AdamWOptions{});
    const int dp = ps::get_data_parallel_size(), d = ps::get_data_parallel_rank();
    for (int step = 0; step < kSteps; ++step) {
      double loss;
      if (ps::get_pipeline_model_parallel_size() > 1) {  // one microbatch per shard, DP 1
        std::vector<Tensor> ids, tg;
        for (int q = 0; q < shards; ++q)
          ids.push_back(shard_ids(q, step, 700)), tg.push_back(shard_ids(q, step, 900));
        loss = model->run_train(cat(ids, 0), cat(tg, 0)).item();
      } else if (dp == 1) {
        // the shards' losses are scaled by 1/shards: so are their auxiliary losses' gradients
        TrainingLossScale loss_scale(1.0 / shards);
        loss = model
                   ->run_train([&](Module& m) {
                     auto& lm = dynamic_cast<CausalLM&>(m);
                     Tensor l;
                     for (int q = 0; q < shards; ++q) {
                       Tensor lq =
                           lm.loss(shard_ids_here(q, step, 700), shard_ids_here(q, step, 900));
                       l = l.defined() ? add(l, lq) : lq;
                     }
                     return mul(l, 1.0 / shards);
                   })
                   .item();
      } else {
        // (under CP the loss is the whole sequences', the same on every CP rank)
        loss = model->run_train(shard_ids_here(d, step, 700), shard_ids_here(d, step, 900)).item();
        ps::get_data_parallel_group().all_reduce(&loss, &loss, 1, DType::f64, ReduceOp::sum);
        loss /= dp;
      }
      opt->step();
      // (ZeRO-1: each rank's .grad holds the reduced values of its shard only)
      if (step == 0 && !opt->zero1()) record_grads(*model, t.grads0, mu);
      if (step == kSteps - 1) {  // (ZeRO-3: the sharded layers and experts gathered)
        const std::vector<Module*> local = model->local_modules();
        const WholeParameters whole(std::vector<const Module*>(local.begin(), local.end()));
        record_replicas(*model, t, mu);
      }
      opt->zero_grad();
      if (current_context().rank() == 0) {
        t.losses.push_back(loss);
        t.norms.push_back(opt->grad_norm().value());
      }
    }
  });
  return t;
}

inline void expect_matches(const Trace& one, const Trace& par, const std::string& what) {
  ASSERT_EQ(par.losses.size(), one.losses.size()) << what;
  double worst = 0, worst_norm = 0;
  for (size_t i = 0; i < one.losses.size(); ++i) {
    worst = std::max(worst, std::abs(par.losses[i] - one.losses[i]) / std::abs(one.losses[i]));
    worst_norm = std::max(worst_norm, std::abs(par.norms[i] - one.norms[i]) / one.norms[i]);
  }
  double worst_grad = 0;
  for (const auto& [name, g] : par.grads0)
    if (one.grads0.count(name) && one.grads0.at(name).shape() == g.shape())
      worst_grad = std::max(worst_grad, diff(g, one.grads0.at(name)).rel());
  std::printf(
      "    %s vs one rank over %d steps: largest relative loss difference %.3g, grad norm "
      "%.3g, step-0 gradients (%zu, TP shards gathered) %.3g\n",
      what.c_str(), kSteps, worst, worst_norm, par.grads0.size(), worst_grad);
  EXPECT_LE(worst, 1e-5) << what;
  EXPECT_LE(worst_norm, 1e-5) << what;
  // under mpirun a process holds its own ranks' parameters only (and the one-rank run ran on the
  // first process)
  if (par.grads0.empty() || one.grads0.empty()) return;
  if (!under_mpi()) {
    EXPECT_EQ(par.grads0.size(), one.grads0.size()) << what;
  }
  for (const auto& [name, g] : par.grads0) {
    ASSERT_TRUE(one.grads0.count(name)) << what << " " << name;
    EXPECT_TRUE(close_rel(g, one.grads0.at(name), 1e-5, what + " " + name));
  }
}

// A MoE model and its AdamW wrapper from NxD's API (the checkpoint tests' runs).
struct MoeRun {
  std::shared_ptr<NxDModel> model;
  std::unique_ptr<NxDOptimizer> opt;
};
inline MoeRun moe_run(const NxDConfig& cfg, const ModelConfig& c, uint64_t seed) {
  MoeRun r;
  r.model = initialize_parallel_model(cfg, c, seed);
  r.opt = initialize_parallel_optimizer(
      cfg, *r.model, optim::default_param_groups(r.model->local_named_parameters(), 1e-3, 0.1),
      optim::AdamWOptions{});
  return r;
}
// `steps` training steps on this DP rank's shards of the test data.
inline void train_steps(MoeRun& r, int steps) {
  const int d = parallel_state::get_data_parallel_rank();
  for (int step = 0; step < steps; ++step) {
    r.model->run_train(shard_ids(d, step, 700), shard_ids(d, step, 900));
    r.opt->step();
    r.opt->zero_grad();
  }
}

// `par` equals `ref` bitwise: every loss and gradient norm, and every final parameter (ZeRO-3
// against stages 1 and 2 with the same bucket layout).
inline void expect_bitwise(const Trace& ref, const Trace& par, const std::string& what) {
  EXPECT_EQ(par.losses, ref.losses) << what;
  EXPECT_EQ(par.norms, ref.norms) << what;
  EXPECT_EQ(par.final_params.size(), ref.final_params.size()) << what;
  int64_t differ = 0;
  for (const auto& [name, w] : par.final_params)
    if (!ref.final_params.count(name) || !bitwise_equal(w, ref.final_params.at(name), what + name))
      ++differ;
  std::printf("    %s: %zu losses, %zu final parameters, %lld differ bitwise\n", what.c_str(),
              par.losses.size(), par.final_params.size(), static_cast<long long>(differ));
  EXPECT_EQ(differ, 0) << what;
}

inline NxDConfig sizes(int tp, int ep, bool sp = false) {
  NxDConfig c;
  c.tensor_parallel_size = tp;
  c.expert_parallel_size = ep;
  c.sequence_parallel = sp;
  return c;
}

}  // namespace nxd::testing::moe
