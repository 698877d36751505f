// nxd-bench-trace: the traced decoder (trace/decoder.h) against the eager KV-cache path on one
// rank, saved-trace load time against a raw read of the same files, resident bytes with 1 and 4
// prompt buckets, and the padding waste of automatic buckets on log-uniform prompt lengths.
//   nxd-bench-trace [--layers 12] [--hidden 768] [--heads 12] [--kv-heads 12] [--ffn 2048]
//                   [--vocab 32000] [--max-len 512] [--prefill 128] [--threads 1] [--dtype f32]
//                   [--args "compiler args"]  (the traced model; a second one adds --fuse)
// Prints key=value lines: prefill and decode medians (eager, traced) and traced_vs_eager (traced
// time / eager time, < 1 is faster), load_seconds / raw_read_seconds, resident bytes, padding.
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include <unistd.h>

#include "bench_util.h"
#include "nxd/layers/models/kv_cache.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/trace/decoder.h"
#include "nxd/trace/save_load.h"

using namespace nxd;
namespace fs = std::filesystem;

namespace {

ModelConfig bench_config(const bench::Args& a) {
  ModelConfig c;
  c.arch = "llama";
  c.num_layers = a.get_int("--layers", 12);
  c.hidden_size = a.get_int("--hidden", 768);
  c.num_attention_heads = a.get_int("--heads", 12);
  c.num_kv_heads = a.get_int("--kv-heads", 12);
  c.ffn_hidden_size = a.get_int("--ffn", 2048);
  c.vocab_size = a.get_int("--vocab", 32000);
  c.max_position_embeddings = a.get_int("--max-len", 512);
  c.dtype = dtype_from_name(a.get_str("--dtype", "f32"));
  return c;
}

double raw_read_seconds(const fs::path& dir) {
  std::vector<char> buf;
  const double t0 = bench::now_seconds();
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    buf.resize(static_cast<size_t>(e.file_size()));
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  }
  return bench::now_seconds() - t0;
}

void print_case(const char* what, const std::array<bench::Timing, 3>& t) {
  std::printf(
      "case=%s eager_ms=%.3f traced_ms=%.3f traced_fused_ms=%.3f traced_vs_eager=%.3f "
      "fused_vs_eager=%.3f fused_vs_unfused=%.3f\n",
      what, t[0].median * 1e3, t[1].median * 1e3, t[2].median * 1e3, t[1].median / t[0].median,
      t[2].median / t[0].median, t[2].median / t[1].median);
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Args a(argc, argv, "the traced decoder against the eager KV-cache path on one rank",
                      {{"--layers", "N", "decoder layers"},
                       {"--hidden", "N", "hidden size"},
                       {"--heads", "N", "attention heads"},
                       {"--kv-heads", "N", "key/value heads"},
                       {"--ffn", "N", "MLP hidden size"},
                       {"--vocab", "N", "vocabulary"},
                       {"--max-len", "N", "longest sequence"},
                       {"--prefill", "N", "prompt tokens"},
                       {"--threads", "N", "compute threads"},
                       {"--dtype", "D", "weights", {"f32", "bf16", "f64"}},
                       {"--args", "ARGS", "compiler arguments of the traced model"}});
  const ModelConfig cfg = bench_config(a);
  const int threads = static_cast<int>(a.get_int("--threads", 1));
  const int64_t P = a.get_int("--prefill", 128), L = cfg.max_position_embeddings;
  set_num_threads(threads);
  auto model = make_causal_lm(cfg, 0);
  model->eval();
  std::printf("model=llama params=%lld layers=%lld hidden=%lld dtype=%s threads=%d prefill=%lld\n",
              (long long)model->num_parameters(), (long long)cfg.num_layers,
              (long long)cfg.hidden_size, dtype_name(cfg.dtype), threads, (long long)P);
  trace::CausalLMFactory same = [model] { return model; };  // the traced graphs share its weights
  trace::DecoderTraceOptions o{
      .prefill_buckets = {P}, .max_len = L, .args = a.get_str("--args", "")};
  double t0 = bench::now_seconds();
  auto traced = trace::trace_decoder(same, o);
  std::printf("trace_seconds=%.3f graphs=%zu arena_bytes=%lld\n", bench::now_seconds() - t0,
              traced->buckets().size(), (long long)traced->ranks()[0].graphs[0]->plan.arena_bytes);
  o.args += " --fuse";
  auto fused = trace::trace_decoder(same, o);

  std::printf("fused_pairs=%d\n", fused->ranks()[0].graphs[0]->fused_nodes);

  // ---- traced (without, with fusion) vs eager: prefill of P tokens, a decode step at position P
  // ----
  KVCache cache = model->make_kv_cache(1, L);
  std::vector<int64_t> ids(P);
  for (int64_t i = 0; i < P; ++i) ids[i] = (i * 7919) % cfg.vocab_size;
  const Tensor pid = from_vector<int64_t>(ids, {1, P}), did = from_vector<int64_t>({42}, {1, 1});
  const CacheStep ps = make_cache_step({0}, {0}, {P}), ds = make_cache_step({0}, {P}, {1});
  NoGradGuard ng;
  bench::TimerOptions to{.warmup = 2, .min_reps = 5, .max_reps = 50, .min_seconds = 1.0};
  auto step = [&](const Tensor& x, const CacheStep& c) {
    return std::array<std::function<void()>, 3>{
        [&, x, c] { model->forward_cached(x, c, cache); },
        [&, x, c] {
          traced->forward({x, c.seq_ids, c.start, c.lengths});
        },
        [&, x, c] {
          fused->forward({x, c.seq_ids, c.start, c.lengths});
        }};
  };
  auto pr = bench::time_rotation(step(pid, ps), to);
  print_case("prefill", pr);
  to.max_reps = 400;
  auto dr = bench::time_rotation(step(did, ds), to);
  print_case("decode", dr);

  // ---- resident bytes: one weight copy whatever the number of buckets ----
  auto four = trace::trace_decoder(
      same,
      {.prefill_buckets = {P / 4 > 0 ? P / 4 : 1, P / 2 > 0 ? P / 2 : 1, P, L}, .max_len = L});
  int64_t wbytes = 0;
  for (const auto& kv : model->named_parameters()) wbytes += kv.second.nbytes();
  std::printf("weight_bytes=%lld resident_bytes_1_bucket=%lld resident_bytes_4_buckets=%lld\n",
              (long long)wbytes, (long long)traced->resident_bytes(),
              (long long)four->resident_bytes());

  // ---- load time against a raw read of the same files ----
  const fs::path dir =
      fs::temp_directory_path() / ("nxd_bench_trace_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  trace::parallel_model_save(*traced, dir);
  std::vector<double> load, raw;
  for (int i = 0; i < 5; ++i) {
    raw.push_back(raw_read_seconds(dir));
    t0 = bench::now_seconds();
    auto l = trace::parallel_model_load(dir);
    load.push_back(bench::now_seconds() - t0);
  }
  int64_t bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) bytes += static_cast<int64_t>(e.file_size());
  const double lm = bench::median_of(load), rm = bench::median_of(raw);
  std::printf("trace_bytes=%lld load_seconds=%.4f raw_read_seconds=%.4f load_vs_raw=%.2f\n",
              (long long)bytes, lm, rm, lm / rm);
  fs::remove_all(dir);

  // ---- padding waste of automatic buckets (powers of two) on log-uniform prompt lengths ----
  const auto autob = trace::BucketConfig::automatic({.min_seq = 16, .max_seq = L}).buckets;
  std::mt19937_64 g(1);
  int64_t real = 0, padded = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = std::uniform_real_distribution<double>(0, std::log(double(L)))(g);
    const int64_t len = std::max<int64_t>(1, static_cast<int64_t>(std::exp(u)));
    int64_t best = L;
    for (const auto& b : autob)
      if (b.seq >= len) best = std::min(best, b.seq);
    real += len;
    padded += best - len;
  }
  std::printf("auto_buckets=%zu prompts=10000 log_uniform=[1,%lld] padding_waste=%.3f\n",
              autob.size(), (long long)L, double(padded) / double(real + padded));
  return 0;
}
