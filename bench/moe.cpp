// Mixture of experts on the sim backend (issue 28): an 8-expert top-2 Llama (every layer MoE,
// dropless) at expert parallelism 1, 2 and 4 over 4 data-parallel ranks (trn1.32xlarge), against
// the dense Llama of equal active parameters (ffn = 2 x the expert's, so each token's MLP GEMMs
// are the same size), trained with NxD's wrappers (initialize_parallel_model/optimizer, AdamW).
// Per configuration, over `--steps` steps after one warm-up step: host tokens/s (4 rank threads,
// one BLAS thread each: the host's speed of the simulation, not of a NeuronCore), the modeled
// step time of rank 0 and its ratio to the dense model's, and the all-to-all's share of the
// modeled step (moe_all_to_all_seconds: the dispatch and combine exchanges, forward and
// backward). Baseline (dense) and candidates run in the same process, interleaved over
// `--rounds` rounds; the best host round and the (deterministic) modeled time are printed.
//
//   nxd-bench-moe [--steps S] [--rounds R] [--rows N] [--seq L]   (N x L tokens per rank)
//                 [--timeline DIR]   (DIR/<config>.json: rank timelines, Chrome trace format)
// One line per configuration: config=... tokens_per_s=... ratio=... sim_ms_per_step=...
// sim_ratio_vs_dense=... a2a_share=...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "nxd/api/nxd_api.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/moe/dispatch.h"
#include "nxd/runtime/sim/clock.h"

using namespace nxd;
using namespace nxd::api;

namespace {

struct Case {
  std::string name;
  int ep;  // 0: the dense model
};

constexpr int kWorld = 4, kVocab = 1024;
int kRows = 2, kSeq = 128;   // per rank (--rows, --seq)
std::string g_timeline_dir;  // --timeline DIR: each configuration's Chrome trace (last round)

ModelConfig model(bool moe) {
  ModelConfig c;
  c.vocab_size = kVocab;
  c.num_layers = 4;
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.max_position_embeddings = kSeq;
  c.init_method = InitMethod::normal;
  c.ffn_hidden_size = moe ? 256 : 512;  // top-2 of 256-wide experts = one 512-wide MLP per token
  if (moe) {
    c.moe.num_experts = 8;
    c.moe.top_k = 2;
    c.moe.dropless = true;
  }
  return c;
}

Tensor batch(int rank, int step) {
  std::vector<int64_t> v(kRows * kSeq);
  RngStream s{1234u + static_cast<uint64_t>(step), static_cast<uint64_t>(rank)};
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * kVocab);
  return from_vector<int64_t>(v, {kRows, kSeq});
}

struct Result {
  double wall_per_step = 0, sim_per_step = 0, a2a_per_step = 0;
  double compute_share = 0, comm_share = 0;  // of rank 0's whole modeled run (setup included)
};

Result run(const Case& k, int steps) {
  Result r;
  sim::LaunchOptions o;
  o.world_size = kWorld;
  o.instance = "trn1.32xlarge";
  if (!g_timeline_dir.empty()) o.timeline_path = g_timeline_dir + "/" + k.name + ".json";
  const sim::LaunchResult lr = sim::launch(o, [&] {
    NxDConfig want;
    want.expert_parallel_size = std::max(1, k.ep);
    const NxDConfig cfg = neuronx_distributed_config(want);
    auto m = initialize_parallel_model(cfg, model(k.ep > 0), 7);
    auto opt = initialize_parallel_optimizer(
        cfg, *m, optim::default_param_groups(m->local_named_parameters(), 1e-3, 0.1),
        optim::AdamWOptions{});
    auto* clock = dynamic_cast<sim::SimClock*>(current_context().cost_model());
    const int d = parallel_state::get_data_parallel_rank();
    double wall = 0, sim0 = 0, a0 = 0;
    for (int step = 0; step <= steps; ++step) {
      if (step == 1) {  // after the warm-up step
        sim0 = clock->now();
        a0 = moe_all_to_all_seconds();
      }
      const auto t0 = std::chrono::steady_clock::now();
      Tensor ids = batch(d, step);
      m->run_train(ids, ids);
      opt->step();
      opt->zero_grad();
      if (step >= 1)
        wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (current_context().rank() == 0) {
      r.wall_per_step = wall / steps;
      r.sim_per_step = (clock->now() - sim0) / steps;
      r.a2a_per_step = (moe_all_to_all_seconds() - a0) / steps;
    }
  });
  const auto& r0 = lr.ranks.at(0);
  r.compute_share = r0.sim_seconds > 0 ? r0.compute_seconds / r0.sim_seconds : 0;
  r.comm_share = r0.sim_seconds > 0 ? r0.comm_seconds / r0.sim_seconds : 0;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 3, rounds = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--steps" || a == "--rounds" || a == "--rows" || a == "--seq") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      (a == "--steps" ? steps : a == "--rounds" ? rounds : a == "--rows" ? kRows : kSeq) = v;
    } else if (a == "--timeline" && i + 1 < argc) {
      g_timeline_dir = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: nxd-bench-moe [--steps S] [--rounds R] [--rows N] [--seq L] "
                   "[--timeline DIR]\n");
      return 2;
    }
  }
  set_num_threads(1);
  const std::vector<Case> cases{{"dense", 0}, {"moe_ep1", 1}, {"moe_ep2", 2}, {"moe_ep4", 4}};
  std::vector<Result> best(cases.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t k = 0; k < cases.size(); ++k) {
      const Result x = run(cases[k], steps);
      if (r == 0 || x.wall_per_step < best[k].wall_per_step) best[k] = x;
    }
  const double tokens = double(kWorld) * kRows * kSeq;
  std::printf(
      "# 4 layers, hidden 256, 8 experts top-2 (expert ffn 256) vs dense ffn 512; DP %d, "
      "%d x %d tokens per rank, trn1.32xlarge; steps=%d rounds=%d (best host round)\n",
      kWorld, kRows, kSeq, steps, rounds);
  for (size_t k = 0; k < cases.size(); ++k) {
    const Result& b = best[k];
    std::printf(
        "config=%s tokens_per_s=%.0f ratio=%.2f sim_ms_per_step=%.3f sim_ratio_vs_dense=%.2f "
        "a2a_share=%.3f compute_share=%.2f comm_share=%.2f\n",
        cases[k].name.c_str(), tokens / b.wall_per_step, best[0].wall_per_step / b.wall_per_step,
        b.sim_per_step * 1e3, b.sim_per_step / best[0].sim_per_step,
        b.sim_per_step > 0 ? b.a2a_per_step / b.sim_per_step : 0.0, b.compute_share, b.comm_share);
  }
  return 0;
}
