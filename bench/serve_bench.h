#pragma once
// nxd-bench-serve's pieces shared by its cases (bench/serve.cpp: flags, servers, throughput;
// bench/serve_cases.cpp: prefix caching and chunked prefill).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "serve_client.h"
#include "serve_process.h"

namespace nxd::bench::serve {

namespace fs = std::filesystem;

struct Config {
  fs::path hf, gguf, nxd_serve, llama_server, work;
  std::optional<Endpoint> nxd_url, llama_url;
  bool llamacpp = true;
  int threads = 2;
  std::vector<int> clients = {1, 4, 16, 64};
  int64_t per_client = 2, min_requests = 16, prompt_lo = 16, prompt_hi = 1024, new_tokens = 128;
  int64_t system_tokens = 512, question_tokens = 32, prefix_rounds = 5;
  int64_t long_prompt = 4096, streams = 4, stream_prompt = 64;
  uint64_t seed = 1;
  std::vector<std::string> cases = {"throughput", "prefix", "chunked"};
  std::vector<std::string> nxd_serve_args;  // --nxd-serve-arg: appended to every nxd-serve started
  int64_t vocab = 0, max_positions = 0;
  int failures = 0;
};

// How a case wants nxd-serve configured.
struct NxdSetup {
  int64_t seqs = 1, kv_positions = 0, budget = 0;  // budget 0: nxd-serve's default (512)
  bool chunked = true;
};

// A server for one case: started here (and stopped at the end of the case) or the given URL.
struct Server {
  std::unique_ptr<ServerProcess> proc;
  Endpoint at;
};

// Starts nxd-serve / llama-server for a case (or returns the --nxd-url / --llama-url server).
Server start_nxd(const Config& c, const NxdSetup& s, const std::string& tag);
Server start_llama(const Config& c, int64_t slots, int64_t ctx, const std::string& tag);

// Prints the first failures (stderr) and counts them in c.failures.
void report_failures(Config& c, const std::string& where, const std::vector<StreamResult>& rs);

void case_throughput(Config& c);
void case_prefix(Config& c);
void case_chunked(Config& c);

}  // namespace nxd::bench::serve
