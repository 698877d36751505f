#pragma once
// nxd-bench-serve's client: one streamed /v1/completions request (token ids in, server-sent
// events out) timed on arrival, and the request mix and percentiles of the cases.
// The body is the same for nxd-serve and llama-server: {"prompt": [ids], "max_tokens": n,
// "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage":
// true}}. The time to first token (TTFT) is from sending the request to the first event with
// text; inter-token latencies (ITL) are the gaps between consecutive events with text, as a client
// sees them (events that arrive in one read are ~0 apart). Output tokens: the final usage chunk's
// completion_tokens when the server sends one, else the number of events with text.
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "serve_process.h"

namespace nxd::bench::serve {

struct StreamResult {
  bool ok = false;
  std::string error;                // when !ok: the status and body, or the connection error
  double sent = 0;                  // steady-clock seconds
  double ttft = 0;                  // seconds
  std::vector<double> token_times;  // arrival of each event with text (seconds, steady clock)
  int64_t tokens = 0;
  int64_t cached_tokens = -1;  // usage.prompt_tokens_details.cached_tokens, -1 if absent
};

// Optional links to a running stream: `progress` counts its events with text; once `stop` is set
// the client closes the connection (the server cancels the request) and the result stays ok.
struct StreamHooks {
  std::atomic<int64_t>* progress = nullptr;
  const std::atomic<bool>* stop = nullptr;
};

StreamResult stream_completion(const Endpoint& at, const std::vector<int64_t>& prompt,
                               int64_t max_tokens, const StreamHooks& hooks = {});

// GET path's body ("" on failure).
std::string get_text(const Endpoint& at, const std::string& path);

// A Prometheus text value (`name value` line), or -1 when absent.
double metric_value(const std::string& metrics, const std::string& name);

// Prompt lengths log-uniform in [lo, hi], ids uniform in [first_id, vocab): seeded, so both
// servers get the same requests.
std::vector<std::vector<int64_t>> request_mix(int64_t count, int64_t lo, int64_t hi,
                                              int64_t first_id, int64_t vocab, uint64_t seed);
std::vector<int64_t> random_ids(std::mt19937_64& rng, int64_t n, int64_t first_id, int64_t vocab);

using nxd::bench::percentile;  // bench_util.h

double steady_seconds();

}  // namespace nxd::bench::serve
