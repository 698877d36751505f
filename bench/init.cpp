// nxd-bench-init: meta-device initialization of a large model (NxD's model_init_config).
// A Llama shape (default Llama-2-7B: hidden 4096, 32 layers, ffn 11008, vocab 32000) is built on
// the meta device on every rank of a TP world (sim ranks), then one rank's shard is materialized
// in the given dtype, one tensor at a time, filled by each parameter's registered rule (Philox,
// by name: the values of a host build). Baseline in the same run: a memset of the same bytes (the
// floor of any materialization).
//
//   nxd-bench-init [--tp N] [--layers L] [--hidden H] [--ffn F] [--vocab V] [--dtype f32|bf16]
//                  [--threads T]
// The materializing rank fills its tensors over the compute pool (`--threads`, default 2); the
// memset baseline runs on one thread.
// Prints build_s (all ranks, meta), materialize_s, bytes, GB/s, memset GB/s and the ratio.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/parallel.h"

using namespace nxd;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int usage() {
  std::fprintf(stderr,
               "usage: nxd-bench-init [--tp N] [--layers L] [--hidden H] [--ffn F] [--vocab V] "
               "[--dtype f32|bf16] [--threads T]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int tp = 8, threads = 2;
  ModelConfig c = ModelConfig::llama2_7b();
  c.dtype = DType::bf16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (a == "--tp")
      tp = std::atoi(v.c_str());
    else if (a == "--layers")
      c.num_layers = std::atoll(v.c_str());
    else if (a == "--hidden")
      c.hidden_size = std::atoll(v.c_str());
    else if (a == "--ffn")
      c.ffn_hidden_size = std::atoll(v.c_str());
    else if (a == "--vocab")
      c.vocab_size = std::atoll(v.c_str());
    else if (a == "--threads")
      threads = std::atoi(v.c_str());
    else if (a == "--dtype" && (v == "f32" || v == "bf16"))
      c.dtype = dtype_from_name(v);
    else
      return usage();
  }
  if (tp < 1 || threads < 1) return usage();
  c.num_kv_heads = c.num_attention_heads;
  c.kv_size_multiplier = std::max<int64_t>(1, tp / c.kv_heads());
  c.device = Device::meta;
  std::vector<double> build(static_cast<size_t>(tp));
  double mat_s = 0, memset_s = 0;
  int64_t bytes = 0, params = 0;
  try {
    sim::LaunchOptions lo;
    lo.world_size = tp;
    sim::launch(lo, [&] {
      parallel_state::initialize_model_parallel(tp);
      const int r = current_context().rank();
      const double t0 = now();
      std::shared_ptr<CausalLM> lm = make_causal_lm(c, 1);
      build[static_cast<size_t>(r)] = now() - t0;
      world().barrier();
      if (r != 0) return;  // one rank's shard: materialization is local
      for (const auto& [n, t] : lm->named_parameters()) params += t.numel();
      set_num_threads(threads);  // the other ranks are idle
      const double t1 = now();
      bytes = lm->materialize(1);
      mat_s = now() - t1;
      std::vector<char> raw(static_cast<size_t>(bytes));
      const double t2 = now();
      std::memset(raw.data(), 1, raw.size());
      memset_s = now() - t2;
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nxd-bench-init: %s\n", e.what());
    return 1;
  }
  double slowest = 0;
  for (double b : build) slowest = std::max(slowest, b);
  std::printf(
      "# nxd-bench-init: llama %lld layers, hidden %lld, ffn %lld, vocab %lld at TP %d, %s, %d "
      "thread(s)\n",
      static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
      static_cast<long long>(c.ffn_hidden_size), static_cast<long long>(c.vocab_size), tp,
      dtype_name(c.dtype), threads);
  std::printf(
      "meta_build_s=%.3f (slowest of %d ranks) rank0_params=%lld materialize_s=%.3f bytes=%lld "
      "GBps=%.2f memset_GBps=%.2f ratio_to_memset=%.3f\n",
      slowest, tp, static_cast<long long>(params), mat_s, static_cast<long long>(bytes),
      bytes / mat_s / 1e9, bytes / memset_s / 1e9, memset_s / mat_s);
  return 0;
}
