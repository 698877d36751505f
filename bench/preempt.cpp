// nxd-bench-preempt: what the preemption check costs (trainer/preempt.h). Under a
// PreemptionGuard the trainer all-reduces one i32 over the world after every step so that every
// rank stops after the same step. Measured two ways, each against its baseline in the same run:
//   1. the all-reduce alone on sim ranks (8, as the default nxd-train run), per call;
//   2. whole nxd-train-like runs (the default layout: sim TP2 x DP4, a one-layer model, so the
//      step is short and the check's share is as large as it gets), seconds per step with the
//      guard (the check) and without, interleaved, the median of `rounds` runs each.
// Usage: nxd-bench-preempt [--steps N] [--rounds R]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/train_app/train.h"
#include "nxd/trainer/preempt.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `calls` i32 all-reduces (or of empty loop iterations) on 8 sim ranks.
double allreduce_seconds(int calls, bool reduce) {
  double per = 0;
  sim::LaunchOptions lo;
  lo.world_size = 8;
  sim::launch(lo, [&] {
    Communicator& w = world();
    int32_t x = 0;
    w.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      x = i & 1;
      if (reduce) w.all_reduce(&x, &x, 1, DType::i32, ReduceOp::max);
    }
    w.barrier();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (w.rank() == 0) per = s / calls;
  });
  return per;
}

TrainConfig config(const std::string& out, int steps) {
  Config c;
  for (const std::string s :
       {"trainer.val_check_interval=0", "trainer.log_every_n_steps=1000000",
        "generation.max_new_tokens=0", "data.kind=random", "data.random_num_samples=4096",
        "data.seq_length=32", "model.vocab_size=256", "model.num_layers=1", "model.hidden_size=32",
        "model.num_attention_heads=2", "exp_manager.create_tensorboard_logger=false"})
    c.apply_override(s);
  c.apply_override("trainer.max_steps=" + std::to_string(steps));
  c.apply_override("exp_manager.exp_dir=" + out);
  return resolve(c);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 200, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
  }
  const int calls = 2000;
  std::vector<double> with, without;
  for (int r = 0; r < rounds; ++r) {
    without.push_back(allreduce_seconds(calls, /*reduce=*/false));
    with.push_back(allreduce_seconds(calls, /*reduce=*/true));
  }
  const double ar = median(with) - median(without);
  std::printf("allreduce_i32_8_sim_ranks_us=%.2f (loop baseline %.3f us)\n", ar * 1e6,
              median(without) * 1e6);

  const std::string out = (std::filesystem::temp_directory_path() / "nxd_bench_preempt").string();
  std::vector<double> base, guarded;
  for (int r = 0; r < rounds; ++r)
    for (bool guard : {false, true}) {
      std::filesystem::remove_all(out);
      std::optional<PreemptionGuard> g;
      if (guard) g.emplace();
      const TrainResult res = train(config(out, steps), {.quiet = true});
      (guard ? guarded : base).push_back(res.seconds / static_cast<double>(res.steps));
    }
  std::filesystem::remove_all(out);
  const double b = median(base), g = median(guarded);
  std::printf(
      "step_ms_without_check=%.3f step_ms_with_check=%.3f ratio=%.3f (sim TP2 x DP4, %d "
      "steps, median of %d)\n",
      b * 1e3, g * 1e3, g / b, steps, rounds);
}
