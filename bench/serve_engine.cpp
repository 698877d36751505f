// nxd-bench-serve-engine: where a served request's time to first token goes, on the engine alone
// (inference/engine.h; no HTTP, no client threads), the serving bench's ~125M f32 Llama
// (llama_125m.h, random weights). Two cases:
//
//   case=prefill_chunk tokens=T: one engine step that prefills a T-token prompt (prefix caching
//     off), nxd's GEMM engine (blas::sgemm) on the linear-layer shapes of that step ([T, in] x
//     [out, in]^T for every decoder layer's projections, and the head on one row), and raw
//     cblas_sgemm on the same shapes, timed in the same run in rotating blocks (bench_util.h;
//     OpenBLAS's pool stopped after each block, as nxd-bench-matmul does):
//       case=prefill_chunk tokens=512 threads=2 step_ms=... nxd_gemm_ms=... cblas_gemm_ms=...
//             gemm_over_cblas=... step_over_cblas=... other_ms=... step_tok_s=...
//     gemm_over_cblas: nxd's GEMMs' time over cblas's (1 = as fast); step_over_cblas: the step
//     over its GEMM floor; other_ms: the step minus nxd's GEMMs (attention, norms, rotary, ...).
//   case=mix: bench/serve.cpp's throughput mix replayed on the engine: N closed-loop clients
//     (a finished request's client submits its next one after that step) over N x
//     --requests-per-client prompts log-uniform in 16..1024 tokens, --new-tokens each, greedy,
//     ignore_eos, max_num_seqs N. Each configuration (--a, --b: comma-separated engine options)
//     runs --rounds times, alternating A B A B ... (each round a fresh engine on the same model),
//     so both see the same load; per configuration the medians over rounds of
//       case=mix config=a options=... clients=16 requests=32 tok_s=... ttft_p50_ms=...
//             ttft_p99_ms=... itl_p50_ms=... itl_p99_ms=... cpu_s=... steps=... model_calls=...
//     (cpu_s: the process CPU seconds of a run, all threads: the work, which a loaded machine
//     changes less than the wall times) and a line case=mix_ratio b_over_a_tok_s=...
//     b_over_a_ttft_p50=... b_over_a_ttft_p99=... b_over_a_itl_p50=... b_over_a_cpu=...
//     Options: prefill_calls=batched|per_request, max_num_batched_tokens=N,
//     long_prefill_token_threshold=N.
// Flags: --cases prefill_chunk,mix  --tokens 64,256,512  --threads T (default 2)  --clients N
// (default 16)  --requests-per-client R (default 2)  --new-tokens K (default 128)  --rounds N
// (default 1)  --a OPTS (default "prefill_calls=batched")  --b OPTS (default
// "prefill_calls=per_request")  --seed S.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "llama_125m.h"
#include "nxd/inference/engine.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/cpu_info.h"
#include "nxd/runtime/error.h"

using namespace nxd;
using namespace nxd::inference;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, sep);)
    if (!x.empty()) out.push_back(x);
  return out;
}

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "nxd-bench-serve-engine: %s\n", what.c_str());
  std::exit(2);
}

int64_t parse_int(const std::string& key, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < 0) usage_error(key + "=" + v + ": expected an integer >= 0");
  return x;
}

// "key=value,key=value" onto the engine's options.
EngineOptions engine_options(const std::string& spec, EngineOptions o) {
  for (const auto& kv : split(spec, ',')) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) usage_error("option '" + kv + "': expected key=value");
    const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    if (k == "prefill_calls" && (v == "batched" || v == "per_request"))
      o.prefill_calls = v == "batched" ? PrefillCalls::batched : PrefillCalls::per_request;
    else if (k == "max_num_batched_tokens")
      o.max_num_batched_tokens = parse_int(k, v);
    else if (k == "long_prefill_token_threshold")
      o.long_prefill_token_threshold = parse_int(k, v);
    else
      usage_error("option '" + kv +
                  "': expected prefill_calls=batched|per_request, max_num_batched_tokens=N, "
                  "or long_prefill_token_threshold=N");
  }
  return o;
}

// ---- case=prefill_chunk --------------------------------------------------------------------

struct Shape {
  int64_t m, n, k;  // C[m, n] = A[m, k] @ W[n, k]^T
};

// The linear layers' products of a T-token prefill: every 2-D decoder weight [out, in] on T rows,
// the head on one row (the engine computes the last position's logits only).
std::vector<Shape> chunk_shapes(const CausalLM& m, int64_t T) {
  std::vector<Shape> s;
  for (const auto& [name, p] : m.named_parameters()) {
    if (p.dim() != 2) continue;
    const bool embed = name.find("embed") != std::string::npos;
    const bool head = name.find("lm_head") != std::string::npos;
    if (embed && !head) continue;
    s.push_back({head ? 1 : T, p.size(0), p.size(1)});
  }
  return s;
}

void case_prefill_chunk(const std::shared_ptr<CausalLM>& model, int64_t T, int threads) {
  EngineOptions o;
  o.prefix_caching = false;  // the same prompt every call: a cache would hit
  o.max_num_batched_tokens = std::max<int64_t>(512, T);
  o.max_num_seqs = 1;
  Engine e(model, nullptr, o);
  Request r;
  for (int64_t i = 0; i < T; ++i) r.prompt.push_back((i * 7919 + 1) % 32000);
  r.sampling.temperature = 0;
  r.stop.max_tokens = 1;
  auto step = [&] {
    e.submit(r, nullptr);
    while (e.step()) {
    }
  };
  const std::vector<Shape> shapes = chunk_shapes(*model, T);
  double flops = 0;
  int64_t head_rows = 0;
  for (const auto& s : shapes) {
    flops += 2.0 * double(s.m * s.n * s.k);
    if (s.n == model->config().vocab_size) head_rows += s.m;
  }
  std::printf("# prefill_chunk tokens=%lld: %zu linear products, %.2f GFLOP, head rows %lld\n",
              (long long)T, shapes.size(), flops / 1e9, (long long)head_rows);
  int64_t max_a = 0, max_w = 0, max_c = 0;
  for (const auto& s : shapes) {
    max_a = std::max(max_a, s.m * s.k);
    max_w = std::max(max_w, s.n * s.k);
    max_c = std::max(max_c, s.m * s.n);
  }
  // weights of their own (the model's would be cached by the step just before): one per shape
  std::vector<std::vector<float>> w;
  for (const auto& s : shapes) w.emplace_back(s.n * s.k, 0.01f);
  std::vector<float> a(max_a, 0.5f), c(max_c);
  auto nxd_gemms = [&] {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& s = shapes[i];
      blas::sgemm(false, true, s.m, s.n, s.k, 1.0f, a.data(), s.k, w[i].data(), s.k, 0.0f, c.data(),
                  s.n);
    }
  };
  auto cblas_gemms = [&] {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& s = shapes[i];
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(s.m), int(s.n), int(s.k), 1.0f,
                  a.data(), int(s.k), w[i].data(), int(s.k), 0.0f, c.data(), int(s.n));
    }
  };
  bench::TimerOptions to;
  to.min_reps = 5;
  to.max_reps = 40;
  to.min_seconds = 1.0;
  to.block_calls = 2;
  to.between_blocks = blas::stop_openblas_pool;
  const auto t = bench::time_rotation<3>({step, nxd_gemms, cblas_gemms}, to);
  const double st = t[0].median * 1e3, ng = t[1].median * 1e3, cb = t[2].median * 1e3;
  std::printf(
      "case=prefill_chunk tokens=%lld threads=%d step_ms=%.1f nxd_gemm_ms=%.1f cblas_gemm_ms=%.1f "
      "gemm_over_cblas=%.3f step_over_cblas=%.3f other_ms=%.1f step_tok_s=%.1f reps=%d\n",
      (long long)T, threads, st, ng, cb, cb > 0 ? ng / cb : 0.0, cb > 0 ? st / cb : 0.0, st - ng,
      st > 0 ? double(T) / (st / 1e3) : 0.0, t[0].reps);
  std::fflush(stdout);
}

// ---- case=mix -------------------------------------------------------------------------------

struct MixResult {
  double tok_s = 0, ttft50 = 0, ttft99 = 0, itl50 = 0, itl99 = 0;
  double cpu_s = 0;  // process CPU seconds of the run (all threads): the work, whatever the load
  int64_t steps = 0, calls = 0;
};

struct MixSetup {
  int64_t clients = 16, per_client = 2, new_tokens = 128;
  uint64_t seed = 0;
};

std::vector<std::vector<int64_t>> request_mix(const MixSetup& m) {
  std::mt19937_64 rng(m.seed + m.clients);
  std::uniform_real_distribution<double> u(std::log(16.0), std::log(1024.0));
  std::uniform_int_distribution<int64_t> id(256, 31999);
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < m.clients * m.per_client; ++i) {
    const auto n = std::clamp<int64_t>(std::llround(std::exp(u(rng))), 16, 1024);
    std::vector<int64_t> p;
    for (int64_t j = 0; j < n; ++j) p.push_back(id(rng));
    out.push_back(std::move(p));
  }
  return out;
}

MixResult run_mix(const std::shared_ptr<CausalLM>& model, const EngineOptions& base,
                  const MixSetup& m, const std::vector<std::vector<int64_t>>& reqs) {
  EngineOptions o = base;
  o.max_num_seqs = m.clients;
  o.kv_blocks = m.clients * ((1024 + m.new_tokens) / o.block_size + 2) + 16;
  Engine e(model, nullptr, o);
  const size_t count = reqs.size();
  std::vector<double> sent(count), first(count, -1);
  std::vector<std::vector<double>> times(count);
  size_t next = 0, finished = 0, done_now = 0;  // done_now: requests finished in this step
  int64_t tokens = 0;
  auto submit = [&] {
    const size_t i = next++;
    Request r;
    r.prompt = reqs[i];
    r.sampling.temperature = 0;
    r.stop.max_tokens = m.new_tokens;
    r.stop.ignore_eos = true;
    sent[i] = bench::now_seconds();
    e.submit(r, [&, i](const Output& out) {
      const double now = bench::now_seconds();
      for (size_t k = 0; k < out.ids.size(); ++k) times[i].push_back(now);
      tokens += static_cast<int64_t>(out.ids.size());
      if (first[i] < 0 && !out.ids.empty()) first[i] = now;
      if (out.finish != FinishReason::none) ++done_now;
    });
  };
  const double start = bench::now_seconds(), cpu0 = bench::cpu_seconds();
  for (int64_t c = 0; c < m.clients && next < count; ++c) submit();
  while (finished < count) {
    NXD_CHECK(e.step(), "[nxd-bench-serve-engine] the engine idled with ", count - finished,
              " requests unfinished");
    for (; done_now > 0; --done_now) {
      ++finished;
      if (next < count) submit();  // that client's next request
    }
  }
  const double wall = bench::now_seconds() - start, cpu = bench::cpu_seconds() - cpu0;
  std::vector<double> ttft, itl;
  for (size_t i = 0; i < count; ++i) {
    ttft.push_back(first[i] - sent[i]);
    for (size_t k = 1; k < times[i].size(); ++k) itl.push_back(times[i][k] - times[i][k - 1]);
  }
  const EngineStats s = e.stats();
  return {double(tokens) / wall,
          bench::percentile(ttft, 0.5) * 1e3,
          bench::percentile(ttft, 0.99) * 1e3,
          bench::percentile(itl, 0.5) * 1e3,
          bench::percentile(itl, 0.99) * 1e3,
          cpu,
          s.steps,
          s.model_calls};
}

MixResult median_result(const std::vector<MixResult>& rs) {
  auto med = [&](auto field) {
    std::vector<double> v;
    for (const auto& r : rs) v.push_back(double(r.*field));
    return bench::median_of(v);
  };
  MixResult m;
  m.tok_s = med(&MixResult::tok_s);
  m.ttft50 = med(&MixResult::ttft50);
  m.ttft99 = med(&MixResult::ttft99);
  m.itl50 = med(&MixResult::itl50);
  m.itl99 = med(&MixResult::itl99);
  m.cpu_s = med(&MixResult::cpu_s);
  m.steps = static_cast<int64_t>(med(&MixResult::steps));
  m.calls = static_cast<int64_t>(med(&MixResult::calls));
  return m;
}

void case_mix(const std::shared_ptr<CausalLM>& model, const MixSetup& m, int64_t rounds,
              const std::string& a, const std::string& b) {
  const auto reqs = request_mix(m);
  const EngineOptions oa = engine_options(a, {}), ob = engine_options(b, {});
  std::vector<MixResult> ra, rb;
  for (int64_t r = 0; r < rounds; ++r) {
    ra.push_back(run_mix(model, oa, m, reqs));
    rb.push_back(run_mix(model, ob, m, reqs));
  }
  const MixResult ma = median_result(ra), mb = median_result(rb);
  for (const auto& [name, opts, x] : {std::tuple{"a", a, ma}, std::tuple{"b", b, mb}})
    std::printf(
        "case=mix config=%s options=%s clients=%lld requests=%zu new_tokens=%lld rounds=%lld "
        "tok_s=%.1f ttft_p50_ms=%.1f ttft_p99_ms=%.1f itl_p50_ms=%.2f itl_p99_ms=%.2f cpu_s=%.1f "
        "steps=%lld model_calls=%lld\n",
        name, opts.c_str(), (long long)m.clients, reqs.size(), (long long)m.new_tokens,
        (long long)rounds, x.tok_s, x.ttft50, x.ttft99, x.itl50, x.itl99, x.cpu_s,
        (long long)x.steps, (long long)x.calls);
  auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
  std::printf(
      "case=mix_ratio b_over_a_tok_s=%.3f b_over_a_ttft_p50=%.3f b_over_a_ttft_p99=%.3f "
      "b_over_a_itl_p50=%.3f b_over_a_cpu=%.3f\n",
      ratio(mb.tok_s, ma.tok_s), ratio(mb.ttft50, ma.ttft50), ratio(mb.ttft99, ma.ttft99),
      ratio(mb.itl50, ma.itl50), ratio(mb.cpu_s, ma.cpu_s));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args(argc, argv,
                   "where a served request's TTFT goes, on the engine alone (the serving model)",
                   {{"--cases", "LIST", "prefill_chunk,mix (default both)"},
                    {"--tokens", "LIST", "prefill_chunk's prompt lengths (default 64,256,512)"},
                    {"--threads", "T", "compute threads (default 2)"},
                    {"--clients", "N", "mix: concurrent clients (default 16)"},
                    {"--requests-per-client", "R", "mix: requests per client (default 2)"},
                    {"--new-tokens", "K", "mix: tokens per request (default 128)"},
                    {"--rounds", "N", "mix: runs of each configuration, alternating (default 1)"},
                    {"--a", "OPTS", "mix: configuration a (default prefill_calls=batched)"},
                    {"--b", "OPTS", "mix: configuration b (default prefill_calls=per_request)"},
                    {"--seed", "S", "mix: the prompts' seed (default 0)"}});
  const int threads = static_cast<int>(args.get_int("--threads", 2));
  MixSetup m;
  m.clients = args.get_int("--clients", 16);
  m.per_client = args.get_int("--requests-per-client", 2);
  m.new_tokens = args.get_int("--new-tokens", 128);
  m.seed = static_cast<uint64_t>(args.get_int("--seed", 0));
  const int64_t rounds = args.get_int("--rounds", 1);
  for (auto [name, v] : {std::pair<const char*, int64_t>{"--threads", threads},
                         {"--clients", m.clients},
                         {"--requests-per-client", m.per_client},
                         {"--new-tokens", m.new_tokens},
                         {"--rounds", rounds}})
    if (v < 1) usage_error(std::string(name) + " " + std::to_string(v) + ": need at least 1");
  std::vector<int64_t> tokens;
  for (const auto& t : split(args.get_str("--tokens", "64,256,512"), ','))
    tokens.push_back(parse_int("--tokens", t));
  for (int64_t t : tokens)
    if (t < 1 || t > 4096) usage_error("--tokens " + std::to_string(t) + ": need 1..4096");
  const auto cases = split(args.get_str("--cases", "prefill_chunk,mix"), ',');
  for (const auto& c : cases)
    if (c != "prefill_chunk" && c != "mix")
      usage_error("--cases " + c + ": expected prefill_chunk or mix");
  const std::string a = args.get_str("--a", "prefill_calls=batched");
  const std::string b = args.get_str("--b", "prefill_calls=per_request");
  engine_options(a, {}), engine_options(b, {});  // usage mistakes before the model is built
  set_num_threads(threads);
  std::printf("# %s\n", cpu::describe().c_str());
  auto model = make_causal_lm(bench::llama_125m(4096 + m.new_tokens + 16), 1);
  for (const auto& c : cases) {
    if (c == "prefill_chunk")
      for (int64_t t : tokens) case_prefill_chunk(model, t, threads);
    if (c == "mix") case_mix(model, m, rounds, a, b);
  }
  return 0;
}
