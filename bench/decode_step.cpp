// nxd-bench-decode-step: one engine step of B decode rows (inference/engine.h), the step a
// serving run at B concurrent clients repeats between prefills, without a server or clients.
// B requests of P prompt tokens each (token ids, greedy, ignore_eos) are prefilled first
// (untimed), then each step decodes one token for every request; per step the wall and process
// CPU milliseconds (all threads), then the medians:
//   decode_step rows=16 context=128 threads=2 step=0 ms=... cpu_ms=...
//   decode_step rows=16 context=128 threads=2 median_ms=... median_cpu_ms=... tokens_per_s=...
// The model is the serving bench's ~125M f32 Llama (llama_125m.h), random weights. To profile a
// step: run it, then attach a sampling profiler to the process once it prints "# decoding"
// (perf record -p PID). Flags: --rows B (default 16), --context P (default 128), --steps N
// (default 10), --threads T (default 1).
#include <cstdio>
#include <set>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "llama_125m.h"
#include "nxd/inference/engine.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/cpu_info.h"

using namespace nxd;
using namespace nxd::inference;

int main(int argc, char** argv) {
  bench::Args args(argc, argv, "one engine step of B decode rows on the serving bench's model",
                   {{"--rows", "B", "running requests, one decode row each (default 16)"},
                    {"--context", "P", "prompt tokens per request (default 128)"},
                    {"--steps", "N", "timed steps (default 10)"},
                    {"--threads", "T", "compute threads (default 1)"}});
  const int64_t rows = args.get_int("--rows", 16), context = args.get_int("--context", 128);
  const int64_t steps = args.get_int("--steps", 10);
  const int threads = static_cast<int>(args.get_int("--threads", 1));
  for (auto [name, v] : {std::pair<const char*, int64_t>{"--rows", rows},
                         {"--context", context},
                         {"--steps", steps},
                         {"--threads", threads}})
    if (v < 1) {
      std::fprintf(stderr, "nxd-bench-decode-step: %s %lld: need at least 1\n", name,
                   static_cast<long long>(v));
      return 2;
    }
  set_num_threads(threads);
  std::printf("# %s\n", cpu::describe().c_str());
  auto model = make_causal_lm(bench::llama_125m(context + rows + steps + 16), 1);
  EngineOptions o;
  o.max_num_seqs = rows;
  o.max_num_batched_tokens = std::max<int64_t>(512, context);
  Engine e(model, nullptr, o);
  std::set<int64_t> started;  // requests with a first token: their prompt is in the cache
  for (int64_t b = 0; b < rows; ++b) {
    Request r;
    for (int64_t i = 0; i < context; ++i) r.prompt.push_back((i * 7919 + 13 * b + 1) % 32000);
    r.sampling.temperature = 0;
    // past the timed steps whatever the order of the prefills (each prompt fits one step's
    // budget, so the last one is done within `rows` steps of the first)
    r.stop.max_tokens = rows + steps + 8;
    r.stop.ignore_eos = true;
    e.submit(r, [&started](const Output& out) {
      if (!out.ids.empty()) started.insert(out.request_id);
    });
  }
  while (static_cast<int64_t>(started.size()) < rows) e.step();  // every prompt prefilled
  std::printf("# decoding\n");
  std::fflush(stdout);
  std::vector<double> wall, cpu;
  for (int64_t s = 0; s < steps; ++s) {
    const double w0 = bench::now_seconds(), c0 = bench::cpu_seconds();
    e.step();
    wall.push_back(bench::now_seconds() - w0);
    cpu.push_back(bench::cpu_seconds() - c0);
    std::printf("decode_step rows=%lld context=%lld threads=%d step=%lld ms=%.1f cpu_ms=%.1f\n",
                static_cast<long long>(rows), static_cast<long long>(context), threads,
                static_cast<long long>(s), wall.back() * 1e3, cpu.back() * 1e3);
    std::fflush(stdout);
  }
  const double mw = bench::median_of(wall);
  std::printf(
      "decode_step rows=%lld context=%lld threads=%d median_ms=%.1f median_cpu_ms=%.1f "
      "tokens_per_s=%.1f\n",
      static_cast<long long>(rows), static_cast<long long>(context), threads, mw * 1e3,
      bench::median_of(cpu) * 1e3, static_cast<double>(rows) / mw);
  return 0;
}
