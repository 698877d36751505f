// Pipeline parallelism on the sim backend against single-rank training with the same global batch
// and microbatches: host tokens/s of PP2 (gpipe, 1f1b, interleaved vpp 2), PP4 (1f1b) and TP2 x
// PP2 x DP2 relative to one rank (gradient accumulation over the same microbatches, measured in
// the same run, interleaved round by round; the best round of each is reported), the modeled
// step time on the sim instance (trn1.32xlarge), and the modeled bubble: the mean over ranks of
// the part of the step a rank's simulated clock spends not computing, next to the analytical
// (pp - 1) / (M + pp - 1) (divided by vpp when interleaved).
//
//   nxd-bench-pipeline [--steps S] [--rounds R] [--microbatches M]
// Activation checkpointing (model.activations_checkpoint_granularity) none / selective / full on
// one rank and on PP2 (1f1b): the host step time (ms_per_step), the modeled one and peak_mb, the
// largest rank's peak device memory (the allocator's counter); each checkpointed line also gives
// its baseline measured in the same run (vs=, the same layout without checkpointing) and
// time_ratio (host step time / baseline's) and peak_ratio (peak / baseline's).
// One line per configuration: config=... world=... ckpt=... ms_per_step=... tokens_per_s=...
// ratio=... (tokens/s / single's) sim_ms_per_step=... bubble=... bubble_analytical=... peak_mb=...
// [vs=... time_ratio=... peak_ratio=...]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/optim/optimizer.h"
#include "nxd/pipeline/pipeline_model.h"
#include "nxd/runtime/sim/clock.h"

using namespace nxd;
using namespace nxd::pipeline;

namespace {

constexpr int64_t kBatch = 16, kSeq = 64;

ModelConfig model(CheckpointGranularity g) {
  ModelConfig c;
  c.activations_checkpoint_granularity = g;
  c.vocab_size = 512;
  c.num_layers = 8;
  c.hidden_size = 128;
  c.num_attention_heads = 4;
  c.max_position_embeddings = kSeq;
  return c;
}

struct Par {
  std::string name;
  int tp = 1, pp = 1, dp = 1, vpp = 1;
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  CheckpointGranularity ckpt = CheckpointGranularity::none;
};

struct Result {
  double tokens_per_s = 0, sim_step_s = 0, bubble = 0;
  int64_t peak_bytes = 0;  // the largest rank's peak device memory
};

Tensor ids_of(int64_t B, int64_t S, uint64_t seed) {
  RngStream s{seed, 3};
  std::vector<int64_t> v(B * S);
  for (int64_t i = 0; i < B * S; ++i) v[i] = static_cast<int64_t>(s.uniform_f64(i) * 512);
  return from_vector<int64_t>(v, {B, S});
}

// steps + 1 training steps (the first untimed) of one configuration; M microbatches per DP rank.
Result run(const Par& p, int steps, int M) {
  Result res;
  std::vector<double> sim_step(p.tp * p.pp * p.dp), busy(p.tp * p.pp * p.dp);
  double wall = 0;
  sim::LaunchResult lr = sim::launch(p.tp * p.pp * p.dp, [&] {
    const bool single = p.pp == 1;
    std::shared_ptr<CausalLM> plain;
    std::unique_ptr<PipelineModel> pm;
    std::vector<optim::NamedParam> params;
    if (single) {
      plain = make_causal_lm(model(p.ckpt), 1);
      for (auto& [n, t] : plain->named_parameters()) params.push_back({n, t});
    } else {
      parallel_state::initialize_model_parallel(p.tp, p.pp);
      PipelineOptions o;
      o.num_microbatches = M;
      o.schedule = p.kind;
      o.virtual_pipeline_size = p.vpp;
      pm = std::make_unique<PipelineModel>(model(p.ckpt), 1, o);
      params = pm->local_named_parameters();
    }
    optim::AdamW opt({optim::ParamGroup{"all", params, 1e-3}});
    const int64_t rows = kBatch / p.dp;
    const int64_t d = single ? 0 : parallel_state::get_data_parallel_rank();
    sim::SimClock* clock = sim::current_sim_clock();
    double t0 = 0, c0 = 0, w0 = 0;
    for (int s = 0; s <= steps; ++s) {
      if (s == 1) {
        world().barrier();
        t0 = clock->now(), c0 = clock->compute_seconds(), w0 = bench::now_seconds();
      }
      Tensor ids = ids_of(kBatch, kSeq, s).narrow(0, d * rows, rows).contiguous();
      Tensor tg = ids_of(kBatch, kSeq, 100 + s).narrow(0, d * rows, rows).contiguous();
      if (single) {
        plain->zero_grad();
        const int64_t r = rows / M;
        for (int i = 0; i < M; ++i)
          backward(mul(plain->loss(ids.narrow(0, i * r, r).contiguous(),
                                   tg.narrow(0, i * r, r).contiguous()),
                       1.0 / M));
      } else {
        pm->zero_grad();
        pm->run_train(ids, tg);
      }
      opt.step();
    }
    world().barrier();
    const int r = world().rank();
    sim_step[r] = (clock->now() - t0) / steps;
    busy[r] = (clock->compute_seconds() - c0) / steps;
    if (r == 0) wall = (bench::now_seconds() - w0) / steps;
  });
  res.tokens_per_s = kBatch * kSeq / wall;
  res.sim_step_s = *std::max_element(sim_step.begin(), sim_step.end());
  double idle = 0;
  for (double b : busy) idle += 1.0 - b / res.sim_step_s;
  res.bubble = idle / busy.size();
  for (const auto& r : lr.ranks) res.peak_bytes = std::max(res.peak_bytes, r.peak_bytes);
  return res;
}

// The configuration with k's layout and no activation checkpointing (k itself without one).
size_t baseline_of(const std::vector<Par>& pars, size_t k) {
  const Par& p = pars[k];
  for (size_t b = 0; b < pars.size(); ++b) {
    const Par& q = pars[b];
    if (q.ckpt == CheckpointGranularity::none && q.tp == p.tp && q.pp == p.pp && q.dp == p.dp &&
        q.vpp == p.vpp && q.kind == p.kind)
      return b;
  }
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 4, rounds = 3, M = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--steps") {
      steps = std::atoi(argv[++i]);
    } else if (i + 1 < argc && a == "--rounds") {
      rounds = std::atoi(argv[++i]);
    } else if (i + 1 < argc && a == "--microbatches") {
      M = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: nxd-bench-pipeline [--steps S] [--rounds R] [--microbatches M]\n");
      return 2;
    }
  }
  if (steps < 1 || rounds < 1 || M < 1 || kBatch % (2 * M) != 0) {
    std::fprintf(stderr, "nxd-bench-pipeline: need steps, rounds >= 1 and M dividing %lld / 2\n",
                 static_cast<long long>(kBatch));
    return 2;
  }
  const std::vector<Par> pars{
      {.name = "single"},
      {.name = "pp2-gpipe", .pp = 2, .kind = ScheduleKind::gpipe},
      {.name = "pp2-1f1b", .pp = 2},
      {.name = "pp2-interleaved-vpp2", .pp = 2, .vpp = 2, .kind = ScheduleKind::interleaved},
      {.name = "pp4-1f1b", .pp = 4},
      {.name = "tp2xpp2xdp2-1f1b", .tp = 2, .pp = 2, .dp = 2},
      {.name = "single-ckpt-selective", .ckpt = CheckpointGranularity::selective},
      {.name = "single-ckpt-full", .ckpt = CheckpointGranularity::full},
      {.name = "pp2-1f1b-ckpt-selective", .pp = 2, .ckpt = CheckpointGranularity::selective},
      {.name = "pp2-1f1b-ckpt-full", .pp = 2, .ckpt = CheckpointGranularity::full},
  };
  std::vector<Result> best(pars.size());
  try {
    for (int r = 0; r < rounds; ++r)
      for (size_t k = 0; k < pars.size(); ++k) {
        // DP ranks split the batch: M / dp microbatches each keep the microbatch size
        const int m = std::max(1, M / pars[k].dp);
        Result res = run(pars[k], steps, m);
        if (res.tokens_per_s > best[k].tokens_per_s) best[k] = res;
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nxd-bench-pipeline: %s\n", e.what());
    return 1;
  }
  std::printf(
      "# model=llama 8x128 vocab=512 batch=%lld seq=%lld microbatches=%d steps=%d "
      "rounds=%d (best round); sim instance trn1.32xlarge\n",
      static_cast<long long>(kBatch), static_cast<long long>(kSeq), M, steps, rounds);
  for (size_t k = 0; k < pars.size(); ++k) {
    const Par& p = pars[k];
    ScheduleConfig sc;
    sc.pp = p.pp;
    sc.vpp = p.vpp;
    sc.kind = p.kind;
    sc.num_microbatches = std::max(1, M / p.dp);
    std::printf(
        "config=%s world=%d ckpt=%s ms_per_step=%.2f tokens_per_s=%.0f ratio=%.2f "
        "sim_ms_per_step=%.3f bubble=%.3f bubble_analytical=%.3f peak_mb=%.2f",
        p.name.c_str(), p.tp * p.pp * p.dp,
        p.ckpt == CheckpointGranularity::none ? "none" : checkpoint_granularity_name(p.ckpt),
        1e3 * kBatch * kSeq / best[k].tokens_per_s, best[k].tokens_per_s,
        best[k].tokens_per_s / best[0].tokens_per_s, best[k].sim_step_s * 1e3, best[k].bubble,
        p.pp > 1 ? analytical_bubble(sc) : 0.0,
        static_cast<double>(best[k].peak_bytes) / (1 << 20));
    const size_t b = baseline_of(pars, k);
    if (b != k)
      std::printf(" vs=%s time_ratio=%.2f peak_ratio=%.2f", pars[b].name.c_str(),
                  best[b].tokens_per_s / best[k].tokens_per_s,
                  static_cast<double>(best[k].peak_bytes) / best[b].peak_bytes);
    std::printf("\n");
  }
  return 0;
}
