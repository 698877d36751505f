// Fine-tuning recipes against their plain counterparts, each run as nxd-train's loop on the sim
// backend (issue 38's bench):
//  * LoRA vs full fine-tuning of the same model at TP 1 and TP 2: host ms per step, tokens/s,
//    the allocator's device-memory peak per rank, the optimizer state per rank and the
//    activation peak. Baseline: full fine-tuning in the same run; ratio = LoRA / full.
//  * Packing vs padding of SFT examples on a log-uniform length mix (prompt and completion
//    lengths drawn log-uniformly, seeded): one epoch of the same examples each way, the real
//    (non-padding) tokens per second. Baseline: padding (one example per row) in the same run;
//    ratio = packed / padded.
// Every run is a child process of this one (`--one K`) so each starts fresh; candidates and
// baselines are interleaved round-robin `--rounds` times (default 5) and the medians printed,
// with the CPU, its ISA and the load average before and after.
//
//   nxd-bench-finetune [--threads N] [--steps S] [--rounds R] [--model default|tiny]
//                      [--examples E]
// One line per configuration:
//   case=lora|full tp=.. ms_per_step=.. tokens_per_s=.. hbm_peak_mb=.. optimizer_state_mb=..
//   activation_peak_mb=.. ratio_ms=.. ratio_peak=..
//   case=packed|padded examples=.. rows=.. real_tokens=.. seconds=.. real_tokens_per_s=.. ratio=..
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "nxd/runtime/cpu_info.h"
#include "nxd/train_app/train.h"

using namespace nxd;
using namespace nxd::trainer;
using namespace nxd::api;
using namespace nxd::train_app;
namespace fs = std::filesystem;

namespace {

enum class Kind { full, lora, padded, packed };

struct Run {
  const char* name;
  Kind kind;
  int tp;
};

const std::vector<Run>& runs() {
  static const std::vector<Run> r{{"full", Kind::full, 1},     {"lora", Kind::lora, 1},
                                  {"full", Kind::full, 2},     {"lora", Kind::lora, 2},
                                  {"padded", Kind::padded, 1}, {"packed", Kind::packed, 1}};
  return r;
}

struct Options {
  int threads = 2, steps = 8, rounds = 5, examples = 256;
  std::string model = "default";
  fs::path dir;
};

// A seeded SFT file: prompt and completion lengths log-uniform in [lo, hi] bytes, each one
// example's total at most `max_total` bytes (the sequence length: the byte tokenizer maps one
// byte to one token).
int64_t write_sft(const fs::path& file, int examples, int64_t max_total) {
  std::mt19937_64 rng(38);
  auto log_uniform = [&](double lo, double hi) {
    std::uniform_real_distribution<double> u(std::log(lo), std::log(hi));
    return static_cast<int64_t>(std::exp(u(rng)));
  };
  std::ofstream f(file);
  int64_t tokens = 0;
  for (int i = 0; i < examples; ++i) {
    const int64_t p = log_uniform(4, static_cast<double>(max_total) / 2);
    const int64_t c = std::min(log_uniform(4, static_cast<double>(max_total) / 2), max_total - p);
    std::string prompt, completion;
    for (int64_t k = 0; k < p; ++k) prompt += static_cast<char>('a' + (k * 7 + i) % 26);
    for (int64_t k = 0; k < c; ++k) completion += static_cast<char>('a' + (k * 5 + i) % 26);
    f << R"({"prompt": ")" << prompt << R"(", "completion": ")" << completion << "\"}\n";
    tokens += p + c;
  }
  return tokens;
}

TrainConfig make(const Run& r, const Options& o) {
  Config c;
  const bool sft = r.kind == Kind::padded || r.kind == Kind::packed;
  std::vector<std::string> sets{
      "trainer.val_check_interval=0",
      "trainer.log_every_n_steps=1000000",
      "generation.max_new_tokens=0",
      "trainer.num_threads=" + std::to_string(r.tp > 1 ? 1 : o.threads),
      "backend.world_size=" + std::to_string(r.tp),
      "distributed_strategy.tensor_model_parallel_size=" + std::to_string(r.tp),
      std::string("distributed_strategy.sequence_parallel=") + (r.tp > 1 ? "true" : "false"),
      "exp_manager.exp_dir=" + (o.dir / "runs").string(),
      "data.micro_batch_size=8",
      "data.global_batch_size=8"};
  if (o.model == "tiny")
    for (const char* s : {"model.num_layers=2", "model.hidden_size=64", "data.seq_length=64"})
      sets.push_back(s);
  if (sft) {
    sets.push_back("data.train_dir=" + (o.dir / "sft.jsonl").string());
    sets.push_back("trainer.max_epochs=1");
    sets.push_back("trainer.max_steps=1000000");
    sets.push_back("data.val_fraction=0");
    sets.push_back(std::string("data.alignment_strategy.sft.packing=") +
                   (r.kind == Kind::packed ? "true" : "false"));
  } else {
    sets.push_back("data.kind=random");
    sets.push_back("data.random_num_samples=4096");
    sets.push_back("trainer.max_steps=" + std::to_string(o.steps));
    if (r.kind == Kind::lora) {
      sets.push_back("model_alignment_strategy.peft.lora_rank=8");
      sets.push_back("model_alignment_strategy.peft.lora_dropout=0");
    }
  }
  for (auto& s : sets) c.apply_override(s);
  return resolve(c);
}

struct Sample {
  double tokens_per_s = 0, seconds = 0;
  long long steps = 0, peak = 0, state = 0, act = 0;
};

// A child: one run, one line "tokens_per_s seconds steps hbm_peak optimizer_state act_peak".
int child(int k, const Options& o) {
  try {
    TrainResult res = train(make(runs().at(static_cast<size_t>(k)), o), {.quiet = true});
    std::printf("%.17g %.17g %lld %lld %lld %lld\n", res.tokens_per_s, res.seconds,
                static_cast<long long>(res.steps), static_cast<long long>(res.hbm_peak_bytes),
                static_cast<long long>(res.optimizer_state_bytes),
                static_cast<long long>(res.activation_peak_bytes));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nxd-bench-finetune: %s\n", e.what());
    return 1;
  }
}

bool run_child(const char* self, int k, const Options& o, Sample& s) {
  const std::string cmd = std::string(self) + " --one " + std::to_string(k) + " --threads " +
                          std::to_string(o.threads) + " --steps " + std::to_string(o.steps) +
                          " --model " + o.model + " --dir " + o.dir.string();
  FILE* p = popen(cmd.c_str(), "r");
  const bool ok = p && std::fscanf(p, "%lf %lf %lld %lld %lld %lld", &s.tokens_per_s, &s.seconds,
                                   &s.steps, &s.peak, &s.state, &s.act) == 6;
  const int rc = p ? pclose(p) : -1;
  if (!ok || rc != 0) std::fprintf(stderr, "nxd-bench-finetune: run '%s' failed\n", cmd.c_str());
  return ok && rc == 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double mb(long long b) {
  return static_cast<double>(b) / (1 << 20);
}

Options parse(int argc, char** argv, int& one) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "nxd-bench-finetune: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads")
      o.threads = std::atoi(next().c_str());
    else if (a == "--steps")
      o.steps = std::atoi(next().c_str());
    else if (a == "--rounds")
      o.rounds = std::atoi(next().c_str());
    else if (a == "--examples")
      o.examples = std::atoi(next().c_str());
    else if (a == "--model")
      o.model = next();
    else if (a == "--dir")
      o.dir = next();
    else if (a == "--one")
      one = std::atoi(next().c_str());
    else {
      std::fprintf(stderr,
                   "usage: nxd-bench-finetune [--threads N] [--steps S] [--rounds R] "
                   "[--examples E] [--model default|tiny]\n");
      std::exit(2);
    }
  }
  if (o.threads < 1 || o.steps < 1 || o.rounds < 1 || o.examples < 1 ||
      (o.model != "default" && o.model != "tiny")) {
    std::fprintf(stderr,
                 "nxd-bench-finetune: bad option value (threads %d, steps %d, rounds %d, "
                 "examples %d, model '%s')\n",
                 o.threads, o.steps, o.rounds, o.examples, o.model.c_str());
    std::exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  int one = -1;
  Options o = parse(argc, argv, one);
  if (one >= 0) return child(one, o);

  o.dir = fs::temp_directory_path() / ("nxd_bench_finetune_" + std::to_string(::getpid()));
  fs::create_directories(o.dir);
  const int64_t seq = make(runs()[0], o).data.seq_length;
  const int64_t real_tokens = write_sft(o.dir / "sft.jsonl", o.examples, seq);
  std::printf("# %s\n", cpu::describe().c_str());

  std::vector<std::vector<Sample>> got(runs().size());
  for (int r = 0; r < o.rounds; ++r)
    for (size_t k = 0; k < runs().size(); ++k) {
      Sample s;
      if (!run_child(argv[0], static_cast<int>(k), o, s)) return 1;
      got[k].push_back(s);
    }
  auto med = [&](size_t k, auto field) {
    std::vector<double> v;
    for (const Sample& s : got[k]) v.push_back(static_cast<double>(field(s)));
    return median(v);
  };
  const double tokens_per_step = 8.0 * static_cast<double>(seq);
  std::printf(
      "# model=%s seq=%lld batch=8 steps=%d rounds=%d (medians) threads=%d at TP 1, 1 "
      "per sim rank at TP 2\n",
      o.model.c_str(), static_cast<long long>(seq), o.steps, o.rounds, o.threads);
  for (size_t k = 0; k < 4; ++k) {
    const size_t base = k & ~size_t{1};  // the full fine-tuning run at the same TP
    const double tps = med(k, [](const Sample& s) { return s.tokens_per_s; });
    const double base_tps = med(base, [](const Sample& s) { return s.tokens_per_s; });
    const double peak = med(k, [](const Sample& s) { return s.peak; });
    const double base_peak = med(base, [](const Sample& s) { return s.peak; });
    // One rank runs without the sim device, so it has no allocator peak to read: n/a there.
    char peak_mb[32] = "n/a", peak_ratio[32] = "n/a";
    if (peak > 0) std::snprintf(peak_mb, sizeof peak_mb, "%.2f", peak / (1 << 20));
    if (peak > 0 && base_peak > 0)
      std::snprintf(peak_ratio, sizeof peak_ratio, "%.3f", peak / base_peak);
    std::printf(
        "case=%s tp=%d ms_per_step=%.1f tokens_per_s=%.0f hbm_peak_mb=%s "
        "optimizer_state_mb=%.2f activation_peak_mb=%.2f ratio_ms=%.3f ratio_peak=%s\n",
        runs()[k].name, runs()[k].tp, 1e3 * tokens_per_step / tps, tps, peak_mb,
        mb(med(k, [](const Sample& s) { return s.state; })),
        mb(med(k, [](const Sample& s) { return s.act; })), base_tps / tps, peak_ratio);
  }
  const double padded_s = med(4, [](const Sample& s) { return s.seconds; });
  for (size_t k = 4; k < 6; ++k) {
    const double secs = med(k, [](const Sample& s) { return s.seconds; });
    std::printf(
        "case=%s examples=%d rows=%lld real_tokens=%lld seconds=%.3f "
        "real_tokens_per_s=%.0f ratio=%.3f\n",
        runs()[k].name, o.examples, 8LL * got[k][0].steps, static_cast<long long>(real_tokens),
        secs, static_cast<double>(real_tokens) / secs, padded_s / secs);
  }
  std::printf("# after: load average %.2f\n", cpu::load_average());
  std::error_code ec;
  fs::remove_all(o.dir, ec);
  return 0;
}
