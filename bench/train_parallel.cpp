// Distributed training on the sim backend against single-rank training with the same global
// batch (issue 5): host tokens/s of TP=2, DP=2, TP=2 x DP=2 and TP=2 x DP=4 (the default) runs of
// nxd-train's loop (ranks are threads of one process, BLAS single-threaded per rank) relative to
// one rank with `--threads` BLAS threads, and the modeled step time per configuration on the sim
// instance (trn1.32xlarge).
// Baseline and candidates are interleaved (round-robin, `--rounds` times) and the best round of
// each is reported, so both see the same machine load. Each run is a child process of this one
// (`--one K`), so every configuration starts from a fresh process (thread pools, allocator).
//
//   nxd-bench-train-parallel [--threads N] [--steps S] [--rounds R] [--model default|tiny]
// One line per configuration: config=... world=... tokens_per_s=... ratio=... sim_ms_per_step=...
// sim_tokens_per_s=... hbm_peak_mb=...
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "nxd/train_app/train.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;

namespace {

struct Par {
  std::string name;
  int tp, dp;
};

TrainConfig make(const Par& p, int threads, int steps, const std::string& model,
                 const std::string& out) {
  Config c;
  std::vector<std::string> sets{
      "data.kind=random",
      "data.random_num_samples=4096",
      "data.micro_batch_size=" + std::to_string(16 / p.dp),
      "data.global_batch_size=16",
      "trainer.val_check_interval=0",
      "trainer.log_every_n_steps=1000000",
      "generation.max_new_tokens=0",
      "trainer.max_steps=" + std::to_string(steps),
      "trainer.num_threads=" + std::to_string(threads),
      "backend.world_size=" + std::to_string(p.tp * p.dp),
      "distributed_strategy.tensor_model_parallel_size=" + std::to_string(p.tp),
      std::string("distributed_strategy.sequence_parallel=") + (p.tp > 1 ? "true" : "false"),
      "exp_manager.exp_dir=" + out};
  if (model == "tiny")
    for (const char* s : {"model.num_layers=2", "model.hidden_size=64", "data.seq_length=64"})
      sets.push_back(s);
  for (auto& s : sets) c.apply_override(s);
  return resolve(c);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, steps = 6, rounds = 2, one = -1;
  std::string model = "default";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "nxd-bench-train-parallel: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads")
      threads = std::atoi(next().c_str());
    else if (a == "--steps")
      steps = std::atoi(next().c_str());
    else if (a == "--rounds")
      rounds = std::atoi(next().c_str());
    else if (a == "--model")
      model = next();
    else if (a == "--one")
      one = std::atoi(next().c_str());
    else {
      std::fprintf(stderr,
                   "usage: nxd-bench-train-parallel [--threads N] [--steps S] [--rounds R] "
                   "[--model default|tiny]\n");
      return 2;
    }
  }
  const std::string out =
      (std::filesystem::temp_directory_path() / "nxd_bench_train_parallel").string();
  const std::vector<Par> pars{
      {"single", 1, 1}, {"tp2", 2, 1}, {"dp2", 1, 2}, {"tp2xdp2", 2, 2}, {"tp2xdp4", 2, 4}};
  if (one >= 0) {  // a child: one run, one line "tokens_per_s sim_step_s hbm_peak_bytes"
    try {
      TrainResult res = train(make(pars.at(one), threads, steps, model, out), {.quiet = true});
      std::printf("%.17g %.17g %lld\n", res.tokens_per_s, res.sim_step_seconds,
                  static_cast<long long>(res.hbm_peak_bytes));
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nxd-bench-train-parallel: %s\n", e.what());
      return 1;
    }
  }
  std::vector<TrainResult> best(pars.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t k = 0; k < pars.size(); ++k) {
      const std::string cmd = std::string(argv[0]) + " --one " + std::to_string(k) + " --threads " +
                              std::to_string(threads) + " --steps " + std::to_string(steps) +
                              " --model " + model;
      FILE* p = popen(cmd.c_str(), "r");
      TrainResult res;
      long long peak = 0;
      if (!p ||
          std::fscanf(p, "%lf %lf %lld", &res.tokens_per_s, &res.sim_step_seconds, &peak) != 3) {
        std::fprintf(stderr, "nxd-bench-train-parallel: run '%s' failed\n", cmd.c_str());
        if (p) pclose(p);
        return 1;
      }
      if (pclose(p) != 0) return 1;
      res.hbm_peak_bytes = peak;
      if (res.tokens_per_s > best[k].tokens_per_s) best[k] = res;
    }
  std::printf("# model=%s global_batch=16 steps=%d rounds=%d single-rank threads=%d\n",
              model.c_str(), steps, rounds, threads);
  const TrainConfig ref = make(pars[0], threads, steps, model, out);
  const double tokens_per_step = 16.0 * static_cast<double>(ref.data.seq_length);
  for (size_t k = 0; k < pars.size(); ++k) {
    const auto& b = best[k];
    std::printf(
        "config=%s world=%d tokens_per_s=%.0f ratio=%.2f sim_ms_per_step=%.3f "
        "sim_tokens_per_s=%.0f hbm_peak_mb=%.1f\n",
        pars[k].name.c_str(), pars[k].tp * pars[k].dp, b.tokens_per_s,
        b.tokens_per_s / best[0].tokens_per_s, b.sim_step_seconds * 1e3,
        b.sim_step_seconds > 0 ? tokens_per_step / b.sim_step_seconds : 0.0,
        static_cast<double>(b.hbm_peak_bytes) / (1 << 20));
  }
  return 0;
}
