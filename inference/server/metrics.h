#pragma once
// The server's figures for GET /metrics, in Prometheus' text format (version 0.0.4): the
// engine's gauges (waiting and running requests, KV blocks, prefix-cache hit rate), counters of
// tokens, requests by finish reason and HTTP errors by status, the generated tokens per second
// over the last 10 s, and histograms of the time to first token and the inter-token latency.
// Observations come from the engine thread's callbacks and the HTTP threads; one mutex.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "nxd/inference/engine.h"

namespace nxd::inference::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // `name`_bucket{le="..."}, _sum, _count lines
  void write(std::string& out, const std::string& name, const std::string& help) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  using Clock = std::chrono::steady_clock;
  Metrics();
  void time_to_first_token(double seconds);
  void inter_token(double seconds, int64_t tokens);  // `tokens` each `seconds` apart
  void generated(int64_t tokens, Clock::time_point at);
  void finished(const char* finish_reason);
  void http_error(int status);
  // The whole /metrics page with the engine's current figures.
  std::string text(const EngineStats& s) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_;
  std::deque<std::pair<Clock::time_point, int64_t>> recent_;  // generated tokens, last 10 s
  std::map<std::string, int64_t> finished_, http_errors_;
  Clock::time_point start_ = Clock::now();
};

}  // namespace nxd::inference::server
