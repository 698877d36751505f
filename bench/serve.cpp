// nxd-bench-serve: nxd-serve against llama-server on the same weights (issue 36), streamed
// /v1/completions requests of token ids (bench/serve_client.h) from N concurrent clients.
//   nxd-bench-serve --hf DIR [--gguf FILE] [--nxd-serve PATH] [--llama-server PATH]
//                   [--nxd-url HOST:PORT] [--llama-url HOST:PORT] [--no-llamacpp]
//                   [--threads T] [--clients 1,4,16,64] [--requests-per-client N] [--seed S]
//                   [--cases throughput,prefix,chunked] [--work DIR] [--smoke]
// --hf DIR is the transformers folder nxd-serve loads (config.json, weights, tokenizer.json) and
// --gguf FILE its GGUF export (nxd-ckpt export-gguf --type f32) that llama-server loads; the
// requests are token ids from the model's vocabulary, so both servers see the same tokens.
// Unless given a URL, each server is started for each case (bench/serve_process.h, logs in
// --work) with --threads T compute threads (nxd-serve: NXD_NUM_THREADS; llama-server: -t/-tb),
// an f32 KV cache and room for every client's longest request; with a URL the running server is
// used as it is (then chunked prefill, which restarts nxd-serve, is skipped).
// Cases, one line each:
//   case=throughput clients=N: a closed loop of N clients over a seeded mix of N x
//     --requests-per-client requests (prompt lengths log-uniform in 16..1024 tokens, 128 new
//     tokens, greedy, ignore_eos); nxd-serve --max-num-seqs N, llama-server --parallel N
//     --kv-unified. Output tokens/s (all completion tokens over the wall time), TTFT and ITL p50
//     and p99, nxd and llama.cpp, ratio = nxd tokens/s over llama.cpp's.
//   case=prefix: a 512-token system prompt, first with a 32-token question (cold), then with
//     another (warm), for 5 different system prompts, one client: median TTFT cold and warm, and
//     nxd's prefix-cache hit rate over the case (its /metrics counters) and the warm requests'
//     cached prompt tokens (usage).
//   case=chunked_prefill: 4 streams (64-token prompts) decoding while a 4096-token prompt
//     arrives, nxd-serve with chunked prefill on (--max-num-batched-tokens 512, the default) and
//     off (the budget then has to hold the whole prompt): the streams' ITL p99 and largest gap
//     between the long request's arrival and its first token, and that request's TTFT.
// --smoke shrinks everything (clients 1,4; prompts 16..64; 8 new tokens; a 64-token system
// prompt; a 256-token long prompt) for a run of seconds. Exit 0 when every request succeeded, 1
// otherwise (the failures are printed), 2 for a usage mistake.
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "nxd/cli/exit.h"
#include "nxd/runtime/cpu_info.h"
#include "nxd/runtime/error.h"
#include "serve_bench.h"

namespace fs = std::filesystem;
using namespace nxd;
using namespace nxd::bench::serve;

namespace {

const char* kUsage =
    "usage: nxd-bench-serve --hf DIR [--gguf FILE] [--nxd-serve PATH] [--llama-server PATH]\n"
    "         [--nxd-url HOST:PORT] [--llama-url HOST:PORT] [--no-llamacpp] [--threads T]\n"
    "         [--clients 1,4,16,64] [--requests-per-client N] [--seed S]\n"
    "         [--cases throughput,prefix,chunked] [--work DIR] [--smoke]\n"
    "         [--nxd-serve-arg ARG ...]  (each appended to the nxd-serve command line)\n";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
}

int64_t to_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  NXD_CHECK(!v.empty() && *end == '\0' && x >= lo && x <= hi, "[nxd-bench-serve] ", flag, " ", v,
            ": expected an integer in [", lo, ", ", hi, "]");
  return x;
}

fs::path exe_dir() {
  return fs::canonical("/proc/self/exe").parent_path();
}

// --smoke: every case shrunk to seconds.
void shrink_for_smoke(Config& c) {
  c.clients = {1, 4};
  c.min_requests = 4;
  c.prompt_lo = 16;
  c.prompt_hi = 64;
  c.new_tokens = 8;
  c.system_tokens = 64;
  c.question_tokens = 16;
  c.prefix_rounds = 2;
  c.long_prompt = 256;
  c.streams = 2;
  c.stream_prompt = 16;
}

// The vocabulary and context of --hf's config.json; the context must hold every case's longest
// sequence.
void read_model_limits(Config& c) {
  const auto cfg = nlohmann::json::parse(std::ifstream(c.hf / "config.json"), nullptr, false);
  NXD_CHECK(!cfg.is_discarded() && cfg.contains("vocab_size"), "[nxd-bench-serve] --hf ",
            c.hf.string(), ": no readable config.json");
  c.vocab = cfg["vocab_size"].get<int64_t>();
  c.max_positions = cfg.value("max_position_embeddings", int64_t{0});
  const int64_t longest = std::max(
      {c.prompt_hi + c.new_tokens, c.long_prompt + 8, c.system_tokens + c.question_tokens + 8});
  NXD_CHECK(longest <= c.max_positions, "[nxd-bench-serve] --hf ", c.hf.string(),
            ": max_position_embeddings ", c.max_positions, " < ", longest,
            " positions the cases need (export with nxd-bench-inference --max-positions)");
}

// nxd-serve (beside this benchmark unless given) and, unless --no-llamacpp, llama-server and the
// GGUF file it loads.
void find_servers(Config& c) {
  if (c.nxd_serve.empty() && !c.nxd_url) c.nxd_serve = exe_dir().parent_path() / "tools/nxd-serve";
  if (c.llamacpp && !c.llama_url) {
    if (c.llama_server.empty())
      if (const char* b = std::getenv("NXD_LLAMACPP_BUILD"))
        c.llama_server = fs::path(b) / "bin" / "llama-server";
    NXD_CHECK(!c.llama_server.empty() && fs::is_regular_file(c.llama_server),
              "[nxd-bench-serve] llama-server: give --llama-server PATH, set NXD_LLAMACPP_BUILD, "
              "or --no-llamacpp (got '",
              c.llama_server.string(), "')");
    NXD_CHECK(!c.gguf.empty() && fs::is_regular_file(c.gguf),
              "[nxd-bench-serve] --gguf FILE (the model's GGUF export) is required for "
              "llama-server (got '",
              c.gguf.string(), "')");
  }
}

Config parse(int argc, char** argv) {
  Config c;
  bool smoke = false;
  std::string clients;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      smoke = true;
      continue;
    }
    if (a == "--no-llamacpp") {
      c.llamacpp = false;
      continue;
    }
    NXD_CHECK(i + 1 < argc, "[nxd-bench-serve] ", a, " needs a value\n", kUsage);
    const std::string v = argv[++i];
    if (a == "--hf")
      c.hf = v;
    else if (a == "--gguf")
      c.gguf = v;
    else if (a == "--nxd-serve")
      c.nxd_serve = v;
    else if (a == "--llama-server")
      c.llama_server = v;
    else if (a == "--nxd-url")
      c.nxd_url = parse_endpoint(a, v);
    else if (a == "--llama-url")
      c.llama_url = parse_endpoint(a, v);
    else if (a == "--threads")
      c.threads = static_cast<int>(to_int(a, v, 1, 1024));
    else if (a == "--clients")
      clients = v;
    else if (a == "--requests-per-client")
      c.per_client = to_int(a, v, 1, 1000);
    else if (a == "--seed")
      c.seed = static_cast<uint64_t>(to_int(a, v, 0, INT64_MAX));
    else if (a == "--cases")
      c.cases = split(v);
    else if (a == "--work")
      c.work = v;
    else if (a == "--nxd-serve-arg")
      c.nxd_serve_args.push_back(v);
    else
      throw InvalidArgument(str("[nxd-bench-serve] unknown flag '", a, "'\n", kUsage));
  }
  if (smoke) shrink_for_smoke(c);
  if (!clients.empty()) {
    c.clients.clear();
    for (const auto& x : split(clients))
      c.clients.push_back(static_cast<int>(to_int("--clients", x, 1, 4096)));
  }
  for (const auto& k : c.cases)
    NXD_CHECK(k == "throughput" || k == "prefix" || k == "chunked", "[nxd-bench-serve] --cases ", k,
              ": expected throughput, prefix or chunked");
  NXD_CHECK(!c.hf.empty(), "[nxd-bench-serve] --hf DIR is required (the model nxd-serve loads)\n",
            kUsage);
  read_model_limits(c);
  find_servers(c);
  if (c.work.empty())
    c.work = fs::temp_directory_path() / ("nxd_bench_serve_" + std::to_string(getpid()));
  fs::create_directories(c.work);
  return c;
}

}  // namespace

namespace nxd::bench::serve {

Server start_nxd(const Config& c, const NxdSetup& s, const std::string& tag) {
  if (c.nxd_url) return {nullptr, *c.nxd_url};
  Endpoint at{.port = free_port()};
  const int64_t blocks = (s.kv_positions + 15) / 16 + 2 * s.seqs + 16;
  StartOptions o{.argv = {c.nxd_serve.string(), "--hf", c.hf.string(), "--host", at.host, "--port",
                          std::to_string(at.port), "--max-num-seqs", std::to_string(s.seqs),
                          "--kv-blocks", std::to_string(blocks), "--served-model-name", "bench",
                          "--chunked-prefill", s.chunked ? "on" : "off"},
                 .env = {{"NXD_NUM_THREADS", std::to_string(c.threads)}},
                 .log = c.work / ("nxd-serve-" + tag + ".log"),
                 .at = at};
  if (s.budget > 0) {
    o.argv.push_back("--max-num-batched-tokens");
    o.argv.push_back(std::to_string(s.budget));
  }
  o.argv.insert(o.argv.end(), c.nxd_serve_args.begin(), c.nxd_serve_args.end());
  return {std::make_unique<ServerProcess>(o), at};
}

Server start_llama(const Config& c, int64_t slots, int64_t ctx, const std::string& tag) {
  if (c.llama_url) return {nullptr, *c.llama_url};
  Endpoint at{.port = free_port()};
  const std::string t = std::to_string(c.threads);
  StartOptions o{.argv = {c.llama_server.string(),
                          "-m",
                          c.gguf.string(),
                          "--host",
                          at.host,
                          "--port",
                          std::to_string(at.port),
                          "-t",
                          t,
                          "-tb",
                          t,
                          "-np",
                          std::to_string(slots),
                          "-c",
                          std::to_string(ctx),
                          "-kvu",
                          "-ctk",
                          "f32",
                          "-ctv",
                          "f32",
                          "--no-webui"},
                 .log = c.work / ("llama-server-" + tag + ".log"),
                 .at = at};
  return {std::make_unique<ServerProcess>(o), at};
}

void report_failures(Config& c, const std::string& where, const std::vector<StreamResult>& rs) {
  for (const auto& r : rs)
    if (!r.ok) {
      if (c.failures++ < 5)
        std::fprintf(stderr, "nxd-bench-serve: %s: request failed: %s\n", where.c_str(),
                     r.error.c_str());
    }
}

namespace {

struct MixStats {
  double tok_s = 0, ttft50 = 0, ttft99 = 0, itl50 = 0, itl99 = 0;
  int errors = 0;
};

MixStats run_mix(Config& c, const Endpoint& at, const std::vector<std::vector<int64_t>>& reqs,
                 int clients, const std::string& where) {
  stream_completion(at, reqs[0], 2);  // warm-up: the first request's one-off costs
  std::vector<StreamResult> rs(reqs.size());
  std::atomic<size_t> next{0};
  const double start = steady_seconds();
  std::vector<std::thread> ts;
  for (int k = 0; k < clients; ++k)
    ts.emplace_back([&] {
      for (size_t i; (i = next++) < reqs.size();)
        rs[i] = stream_completion(at, reqs[i], c.new_tokens);
    });
  for (auto& t : ts) t.join();
  MixStats m;
  double end = start;
  int64_t tokens = 0;
  std::vector<double> ttft, itl;
  for (const auto& r : rs) {
    if (!r.ok) {
      ++m.errors;
      continue;
    }
    tokens += r.tokens;
    ttft.push_back(r.ttft);
    end = std::max(end, r.token_times.back());
    for (size_t i = 1; i < r.token_times.size(); ++i)
      itl.push_back(r.token_times[i] - r.token_times[i - 1]);
  }
  report_failures(c, where, rs);
  m.tok_s = end > start ? double(tokens) / (end - start) : 0;
  m.ttft50 = percentile(ttft, 0.5) * 1e3;
  m.ttft99 = percentile(ttft, 0.99) * 1e3;
  m.itl50 = percentile(itl, 0.5) * 1e3;
  m.itl99 = percentile(itl, 0.99) * 1e3;
  return m;
}

std::string mix_fields(const char* who, const MixStats& m) {
  char b[256];
  std::snprintf(b, sizeof(b),
                "%s_tok_s=%.1f %s_ttft_p50_ms=%.1f %s_ttft_p99_ms=%.1f %s_itl_p50_ms=%.2f "
                "%s_itl_p99_ms=%.2f %s_errors=%d",
                who, m.tok_s, who, m.ttft50, who, m.ttft99, who, m.itl50, who, m.itl99, who,
                m.errors);
  return b;
}

}  // namespace

void case_throughput(Config& c) {
  for (int n : c.clients) {
    const int64_t count = std::max<int64_t>(c.min_requests, c.per_client * n);
    const auto reqs = request_mix(count, c.prompt_lo, c.prompt_hi,
                                  std::min<int64_t>(256, c.vocab / 2), c.vocab, c.seed + n);
    const int64_t positions = n * (c.prompt_hi + c.new_tokens + 16);
    MixStats nx, ll;
    {
      Server s = start_nxd(c, {.seqs = n, .kv_positions = positions}, str("c", n));
      nx = run_mix(c, s.at, reqs, n, str("nxd-serve clients=", n));
    }
    std::string line = str("case=throughput clients=", n, " requests=", count,
                           " threads=", c.threads, " ", mix_fields("nxd", nx));
    if (c.llamacpp) {
      Server s = start_llama(c, n, positions, str("c", n));
      ll = run_mix(c, s.at, reqs, n, str("llama-server clients=", n));
      char r[64];
      std::snprintf(r, sizeof(r), " ratio=%.3f", ll.tok_s > 0 ? nx.tok_s / ll.tok_s : 0.0);
      line += str(" ", mix_fields("llamacpp", ll), r);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

}  // namespace nxd::bench::serve

namespace {

// "# load_average_<label>=1m,5m,15m" and, at the start, the CPU model.
void machine(const char* label) {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  std::printf("# load_average_%s=%s,%s,%s\n", label, a.c_str(), b.c_str(), c.c_str());
}

int run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
  std::signal(SIGPIPE, SIG_IGN);
  Config c = parse(argc, argv);
  std::printf("# nxd-bench-serve model=%s vocab=%lld threads=%d llamacpp=%s work=%s\n",
              c.hf.string().c_str(), (long long)c.vocab, c.threads,
              c.llamacpp ? c.gguf.string().c_str() : "off", c.work.string().c_str());
  std::printf("# %s\n", cpu::describe().c_str());
  machine("start");
  for (const auto& k : c.cases) {
    if (k == "throughput") case_throughput(c);
    if (k == "prefix") case_prefix(c);
    if (k == "chunked") case_chunked(c);
  }
  machine("end");
  if (c.failures > 0) {
    std::fprintf(stderr, "nxd-bench-serve: %d request(s) failed\n", c.failures);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::run_main("nxd-bench-serve", [&] { return run(argc, argv); });
}
