// nxd-bench-inference: generation with the KV cache on a ~125M-parameter Llama (GQA), batch 1:
// the prefill of a 128-token prompt and one decode step (at cache position 128), fp32 or bf16,
// at --threads T; the decode step against the memory roofline (the bytes a step must read —
// every weight but the embedding table, plus the K/V it attends — over the time to stream a
// buffer of that many bytes with the same threads, measured in the same run); and TP 2 on two sim
// ranks (one core each) against TP 1 on one. bench/generate_torch.py runs PyTorch on the same
// model and weights (--export) and prints the ratios.
//   nxd-bench-inference [--threads T] [--precision fp32|bf16|int8|int4|int4q8] [--prompt N] [--reps
//   N]
// int8 / int4 (group 32, symmetric): f32 activations (int4q8: int4 with int8 activations per
// 32-input block, runtime/kernels/gemv_int4.h Int4Activations), every decoder linear layer's weight
// quantized (layers/quantize.h; the embedding stays f32, the output head too unless --head int8
// or int4, layers/models/quantize_lm.h), eager only; the step's bytes count the quantized
// weights as stored.
//   nxd-bench-inference --export DIR [--max-positions N]
//                        (model.safetensors, config.json, a synthetic byte-level tokenizer.json of
//                        the model's vocabulary (synthetic_tokenizer.h), prefill_logits.f32)
//   nxd-bench-inference --logits-gguf FILE --logits-out OUT
//                        the last position's logits of the same prompt on a GGUF file's weights
//                        (read as f32), raw f32: bench/llamacpp/compare.py's agreement check
// --model bench|draft|tiny picks the model: the ~125M bench Llama (default), a ~20M draft with its
// vocabulary (speculative decoding) or a tiny one (smoke tests).
//   nxd-bench-inference --tp-compare [--precision P]
// Unless --no-traced, the same prefill and decode step also run on the traced decoder
// (trace/decoder.h, sharing the model's weights; fusion off, the default): case=traced_prefill
// and case=traced_decode print traced_vs_eager=<traced time / eager time>, timed interleaved
// with the eager path.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <vector>

#include "bench_util.h"
#include "llama_125m.h"
#include "nxd/checkpoint/gguf_llama.h"
#include "nxd/checkpoint/hf.h"
#include "nxd/checkpoint/offline.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/io/safetensors.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/models/quantize_lm.h"
#include "nxd/runtime/cpu_info.h"
#include "nxd/runtime/kernels/parallel_rows.h"
#include "nxd/trace/decoder.h"
#include "synthetic_tokenizer.h"

using namespace nxd;
namespace fs = std::filesystem;

namespace {

enum class BenchModel { bench, draft, tiny };

BenchModel g_model = BenchModel::bench;  // --model

ModelConfig bench_model(DType dt) {
  ModelConfig c = bench::llama_125m(512);
  c.dtype = dt;
  if (g_model == BenchModel::draft) {
    c.hidden_size = 256;
    c.num_layers = 4;
    c.num_attention_heads = 4;
    c.num_kv_heads = 2;
    c.ffn_hidden_size = 768;
  } else if (g_model == BenchModel::tiny) {
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.num_layers = 2;
    c.num_attention_heads = 4;
    c.num_kv_heads = 2;
    c.ffn_hidden_size = 128;
  }
  return c;
}

std::vector<int64_t> prompt_ids(int64_t n, int64_t vocab) {
  std::vector<int64_t> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = (i * 7919 + 13) % vocab;
  return v;
}

// Bytes one decode step at cache length `len` must read on this rank: every parameter but the
// input embedding table (one row of it), and the K/V of `len` positions.
int64_t decode_bytes(CausalLM& m, const KVCache& cache, int64_t len) {
  int64_t b = 0;
  std::set<const void*> quantized;  // parameters replaced by their quantized form
  for (auto& [name, mod] : m.named_modules())
    if (auto* q = dynamic_cast<QuantizableLinear*>(mod); q && q->quantized()) {
      b += q->int8_weight() ? q->int8_weight()->bytes() : q->int4_weight()->bytes();
      for (auto& [n, t] : mod->named_parameters(/*recurse=*/false))
        if (n == "weight" && !t.is_meta()) quantized.insert(t.raw_data());
    }
  for (const auto& [name, q] : m.owned_quantized())  // a tied head's quantized copy
    b += q->int8_weight() ? q->int8_weight()->bytes() : q->int4_weight()->bytes();
  for (const auto& [name, t] : m.named_parameters())
    // a quantized layer's own weight is freed (meta); a tied one keeps its data
    if (name.find("embed_tokens") == std::string::npos && !t.is_meta() &&
        !quantized.count(t.raw_data()))
      b += t.nbytes();
  for (const auto& t : cache.k) b += 2 * t.nbytes() / t.size(2) * len;  // K and V
  return b;
}

// Seconds to read `bytes` once with the compute pool's threads (a vectorized sum), median.
double stream_seconds(int64_t bytes) {
  const int64_t n = bytes / 4;
  std::vector<float> buf(n, 1.0f);
  std::vector<double> t;
  volatile float sink = 0;
  for (int r = 0; r < 12; ++r) {
    const double s = bench::now_seconds();
    std::vector<float> part(256, 0.0f);
    const int64_t block = (n + 255) / 256;
    kernels::for_rows(256, block, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        float acc[16] = {};
        const int64_t e = std::min(n, (b + 1) * block);
        int64_t i = b * block;
        for (; i + 16 <= e; i += 16)
          for (int j = 0; j < 16; ++j) acc[j] += buf[i + j];
        for (; i < e; ++i) acc[0] += buf[i];
        float s2 = 0;
        for (float a : acc) s2 += a;
        part[b] = s2;
      }
    });
    float total = 0;
    for (float p : part) total += p;
    sink = sink + total;
    if (r >= 2) t.push_back(bench::now_seconds() - s);
  }
  return bench::median_of(t);
}

struct Timed {
  double prefill = 0, decode = 0;  // seconds, medians
  int64_t bytes = 0;
};

// Prefill of `P` tokens and decode steps at position P (the same slot every time), `reps` each
// (a fixed count: ranks run in lockstep), medians.
Timed time_model(CausalLM& m, int64_t P, int reps) {
  const auto ids = prompt_ids(P, m.config().vocab_size);
  KVCache cache = m.make_kv_cache(1, P + 1);
  Tensor pid = from_vector<int64_t>(ids, {1, P});
  CacheStep pre = make_cache_step({0}, {0}, {P});
  Tensor tok = from_vector<int64_t>({ids[0]}, {1, 1});
  CacheStep dec = make_cache_step({0}, {P}, {1});
  std::vector<double> tp, td;
  for (int r = 0; r < reps + 2; ++r) {
    double s = bench::now_seconds();
    m.forward_cached(pid, pre, cache);
    if (r >= 2) tp.push_back(bench::now_seconds() - s);
  }
  for (int r = 0; r < 4 * reps + 3; ++r) {
    double s = bench::now_seconds();
    m.forward_cached(tok, dec, cache);
    if (r >= 3) td.push_back(bench::now_seconds() - s);
  }
  return {bench::median_of(tp), bench::median_of(td), decode_bytes(m, cache, P + 1)};
}

// Eager forward_cached against the traced decoder on the same weights, interleaved blocks.
void run_traced(const std::shared_ptr<CausalLM>& m, const std::string& prec, int threads,
                int64_t P) {
  const double t0 = bench::now_seconds();
  auto traced = trace::trace_decoder([m] { return m; }, {.prefill_buckets = {P}, .max_len = P + 1});
  const double trace_s = bench::now_seconds() - t0;
  const auto ids = prompt_ids(P, m->config().vocab_size);
  KVCache cache = m->make_kv_cache(1, P + 1);
  const Tensor pid = from_vector<int64_t>(ids, {1, P}),
               tok = from_vector<int64_t>({ids[0]}, {1, 1});
  const CacheStep pre = make_cache_step({0}, {0}, {P}), dec = make_cache_step({0}, {P}, {1});
  NoGradGuard ng;
  bench::TimerOptions o{.warmup = 1, .min_reps = 3, .max_reps = 30, .min_seconds = 0.5};
  for (const char* c : {"prefill", "decode"}) {
    const bool is_pre = c[0] == 'p';
    const Tensor& x = is_pre ? pid : tok;
    const CacheStep& st = is_pre ? pre : dec;
    if (!is_pre) o.max_reps = 200;
    auto [e, t] = bench::time_pair([&] { m->forward_cached(x, st, cache); },
                                   [&] {
                                     traced->forward({x, st.seq_ids, st.start, st.lengths});
                                   },
                                   o);
    std::printf(
        "case=traced_%s threads=%d precision=%s eager_ms=%.3f traced_ms=%.3f traced_vs_eager=%.3f "
        "trace_seconds=%.2f\n",
        c, threads, prec.c_str(), e.median * 1e3, t.median * 1e3, t.median / e.median, trace_s);
  }
}

// The last position's logits of the P-token prompt, raw f32.
void write_prompt_logits(CausalLM& m, int64_t P, const fs::path& out) {
  NoGradGuard ng;
  KVCache cache = m.make_kv_cache(1, P);
  Tensor l = m.forward_cached(from_vector<int64_t>(prompt_ids(P, m.config().vocab_size), {1, P}),
                              make_cache_step({0}, {0}, {P}), cache)
                 .contiguous();
  std::ofstream(out, std::ios::binary)
      .write(reinterpret_cast<const char*>(l.data<float>()), l.numel() * 4);
}

int run_export(const fs::path& dir, int64_t max_positions, int64_t P) {
  ModelConfig c = bench_model(DType::f32);
  c.max_position_embeddings = max_positions;
  auto m = make_causal_lm(c, 1);
  fs::create_directories(dir);
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& [n, t] : m->state_dict()) ts.push_back({n, t.detach()});
  io::write_safetensors(dir / "model.safetensors", ts);
  std::ofstream(dir / "config.json") << ckpt::hf_config_json(m->config()).dump(2) << "\n";
  std::ofstream(dir / "tokenizer.json") << bench::synthetic_tokenizer_json(c.vocab_size).dump();
  write_prompt_logits(*m, P, dir / "prefill_logits.f32");
  std::printf("exported %s (%lld parameters)\n", dir.string().c_str(),
              static_cast<long long>(m->num_parameters()));
  return 0;
}

// The prompt's logits on a GGUF file's weights (dequantized to f32), for the llama.cpp check.
int run_gguf_logits(const fs::path& gguf, const fs::path& out, int64_t P) {
  ckpt::GgufModel g = ckpt::read_gguf_model(gguf);
  g.cfg.dtype = DType::f32;
  auto m = make_causal_lm(g.cfg, 1);
  ckpt::load_full_tensors({m.get()}, g.full, gguf.string());
  write_prompt_logits(*m, P, out);
  std::printf("logits of %s (%s) -> %s\n", gguf.string().c_str(), g.description.c_str(),
              out.string().c_str());
  return 0;
}

// TP 1 on one sim rank vs TP 2 on two (each rank one BLAS thread: one core each).
int run_tp_compare(DType dt, int64_t P, int reps) {
  double step[3] = {};
  for (int tp : {1, 2}) {
    std::mutex mu;
    sim::launch(tp, [&] {
      parallel_state::initialize_model_parallel(tp);
      auto m = make_causal_lm(bench_model(dt), 1);
      Timed t = time_model(*m, P, reps);
      std::lock_guard g(mu);
      if (current_context().rank() == 0) step[tp] = t.decode;
    });
  }
  std::printf("case=decode_tp precision=%s tp1_tok_s=%.1f tp2_tok_s=%.1f tp2_over_tp1=%.3f\n",
              dt == DType::bf16 ? "bf16" : "fp32", 1 / step[1], 1 / step[2], step[1] / step[2]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args a(argc, argv,
                "generation with the KV cache on a ~125M Llama: prefill, decode against the memory "
                "roofline, traced against eager",
                {{"--threads", "T", "compute threads"},
                 {"--precision",
                  "P",
                  "weights and activations (int8/int4: weights only; int4q8: int8 activations)",
                  {"fp32", "bf16", "int8", "int4", "int4q8"}},
                 {"--prompt", "N", "prompt tokens"},
                 {"--reps", "N", "repetitions (medians)"},
                 {"--model", "M", "the model", {"bench", "draft", "tiny"}},
                 {"--export", "DIR", "write the model, a tokenizer and reference logits"},
                 {"--max-positions", "N", "--export: the model's max_position_embeddings"},
                 {"--logits-gguf", "FILE", "the prompt's logits on a GGUF file's weights"},
                 {"--logits-out", "FILE", "where --logits-gguf writes them (raw f32)"},
                 {"--head",
                  "H",
                  "int8/int4: the output head's format (default none: f32)",
                  {"none", "int8", "int4"}},
                 {"--tp-compare", "", "TP 2 on two sim ranks against TP 1"},
                 {"--no-traced", "", "skip the traced decoder"}});
  const std::string prec = a.get_str("--precision", "fp32");
  const DType dt = prec == "bf16" ? DType::bf16 : DType::f32;
  const int64_t P = a.get_int("--prompt", 128);
  const int reps = static_cast<int>(a.get_int("--reps", 5));
  const bool quantized = prec == "int8" || prec == "int4" || prec == "int4q8";
  if (quantized && (a.has("--export") || a.has("--tp-compare"))) {
    std::fprintf(stderr, "nxd-bench-inference: --precision %s runs the single-rank case only\n",
                 prec.c_str());
    return 2;
  }
  const std::string model = a.get_str("--model", "bench");
  g_model = model == "draft"  ? BenchModel::draft
            : model == "tiny" ? BenchModel::tiny
                              : BenchModel::bench;
  if (a.has("--export"))
    return run_export(a.get_str("--export", "."), a.get_int("--max-positions", 512), P);
  if (a.has("--logits-gguf") != a.has("--logits-out")) {
    std::fprintf(stderr,
                 "nxd-bench-inference: --logits-gguf FILE and --logits-out FILE go together\n");
    return 2;
  }
  if (a.has("--logits-gguf"))
    return run_gguf_logits(a.get_str("--logits-gguf", ""), a.get_str("--logits-out", ""), P);
  if (a.has("--tp-compare")) return run_tp_compare(dt, P, reps);
  const int threads = static_cast<int>(a.get_int("--threads", 1));
  if (threads < 1 || P < 1 || reps < 1) {
    std::fprintf(stderr, "nxd-bench-inference: --threads, --prompt and --reps must be >= 1\n");
    return 2;
  }
  set_num_threads(threads);
  std::printf("# %s\n", cpu::describe().c_str());
  auto m = make_causal_lm(bench_model(dt), 1);
  const std::string head = a.get_str("--head", "none");
  if (head != "none" && !quantized) {
    std::fprintf(stderr, "nxd-bench-inference: --head %s needs --precision int8, int4 or int4q8\n",
                 head.c_str());
    return 2;
  }
  if (quantized) {
    const std::string spec = prec == "int4q8" ? "int4:q8" : prec;
    quantize_causal_lm(*m, {}, parse_weight_quant(head == "none" ? spec : spec + ":head=" + head));
  }
  Timed t = time_model(*m, P, reps);
  const double stream = stream_seconds(t.bytes);
  std::printf("model: llama %lld parameters, %s, threads %d\n",
              static_cast<long long>(m->num_parameters()), prec.c_str(), threads);
  std::printf("case=prefill threads=%d precision=%s tokens=%lld nxd_ms=%.3f nxd_tok_s=%.1f\n",
              threads, prec.c_str(), static_cast<long long>(P), t.prefill * 1e3, P / t.prefill);
  std::printf(
      "case=decode threads=%d precision=%s nxd_ms=%.3f nxd_tok_s=%.1f step_bytes=%lld "
      "stream_ms=%.3f roofline_fraction=%.3f\n",
      threads, prec.c_str(), t.decode * 1e3, 1 / t.decode, static_cast<long long>(t.bytes),
      stream * 1e3, stream / t.decode);
  if (!a.has("--no-traced") && !quantized) run_traced(m, prec, threads, P);
  return 0;
}
