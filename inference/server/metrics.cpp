// Prometheus figures of the server (inference/server/metrics.h).
#include "nxd/inference/server/metrics.h"

#include <algorithm>
#include <cstdio>

#include "nxd/runtime/error.h"

namespace nxd::inference::server {
namespace {

constexpr double kWindowS = 10;  // tokens per second over this window

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void gauge(std::string& out, const char* name, const char* help, double v,
           const char* type = "gauge") {
  out +=
      str("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ", num(v), "\n");
}

std::vector<double> latency_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);
  ++counts_[static_cast<size_t>(it - bounds_.begin())];
  sum_ += v;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  out += str("# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += str(name, "_bucket{le=\"", num(bounds_[i]), "\"} ", cum, "\n");
  }
  out += str(name, "_bucket{le=\"+Inf\"} ", count_, "\n", name, "_sum ", num(sum_), "\n", name,
             "_count ", count_, "\n");
}

Metrics::Metrics() : ttft_(latency_bounds()), itl_(latency_bounds()) {}

void Metrics::time_to_first_token(double seconds) {
  std::lock_guard<std::mutex> g(mu_);
  ttft_.observe(seconds);
}

void Metrics::inter_token(double seconds, int64_t tokens) {
  std::lock_guard<std::mutex> g(mu_);
  for (int64_t i = 0; i < tokens; ++i) itl_.observe(seconds);
}

void Metrics::generated(int64_t tokens, Clock::time_point at) {
  std::lock_guard<std::mutex> g(mu_);
  recent_.emplace_back(at, tokens);
  const auto cut =
      at - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kWindowS));
  while (!recent_.empty() && recent_.front().first < cut) recent_.pop_front();
}

void Metrics::finished(const char* finish_reason) {
  std::lock_guard<std::mutex> g(mu_);
  ++finished_[finish_reason];
}

void Metrics::http_error(int status) {
  std::lock_guard<std::mutex> g(mu_);
  ++http_errors_[std::to_string(status)];
}

std::string Metrics::text(const EngineStats& s) const {
  std::lock_guard<std::mutex> g(mu_);
  const auto now = Clock::now();
  const double up = std::chrono::duration<double>(now - start_).count();
  int64_t tokens = 0;
  const auto cut =
      now - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kWindowS));
  for (const auto& [t, n] : recent_)
    if (t >= cut) tokens += n;
  const double window = std::clamp(up, 1e-3, kWindowS);
  std::string out;
  gauge(out, "nxd_serve_queue_length", "Requests waiting to be scheduled.", double(s.waiting));
  gauge(out, "nxd_serve_requests_waiting", "Requests waiting (queued or preempted).",
        double(s.waiting));
  gauge(out, "nxd_serve_requests_running", "Requests in the running batch.", double(s.running));
  gauge(out, "nxd_serve_kv_blocks_used", "KV cache blocks in use.", double(s.kv_blocks_used));
  gauge(out, "nxd_serve_kv_blocks_total", "KV cache blocks in the pool.",
        double(s.kv_blocks_total));
  gauge(out, "nxd_serve_kv_cache_usage", "Fraction of KV cache blocks in use.",
        s.kv_blocks_total > 0 ? double(s.kv_blocks_used) / double(s.kv_blocks_total) : 0.0);
  gauge(out, "nxd_serve_prefix_cache_hit_rate",
        "Prompt tokens found in the prefix cache over prompt tokens looked up.",
        s.prefix_query_tokens > 0 ? double(s.prefix_hit_tokens) / double(s.prefix_query_tokens)
                                  : 0.0);
  gauge(out, "nxd_serve_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
        double(s.prefix_query_tokens), "counter");
  gauge(out, "nxd_serve_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
        double(s.prefix_hit_tokens), "counter");
  gauge(out, "nxd_serve_prompt_tokens_total", "Prompt tokens processed.", double(s.prompt_tokens),
        "counter");
  gauge(out, "nxd_serve_generation_tokens_total", "Tokens generated.", double(s.generated_tokens),
        "counter");
  gauge(out, "nxd_serve_preemptions_total", "Requests preempted for KV blocks.",
        double(s.preemptions), "counter");
  gauge(out, "nxd_serve_engine_steps_total", "Engine scheduler steps.", double(s.steps), "counter");
  gauge(out, "nxd_serve_model_calls_total", "Model forward calls of the engine's steps.",
        double(s.model_calls), "counter");
  gauge(out, "nxd_serve_spec_proposed_tokens_total",
        "Draft tokens proposed (speculative decoding).", double(s.spec_proposed), "counter");
  gauge(out, "nxd_serve_spec_accepted_tokens_total", "Draft tokens the model accepted.",
        double(s.spec_accepted), "counter");
  gauge(out, "nxd_serve_spec_acceptance_rate", "Accepted over proposed draft tokens.",
        s.acceptance_rate());
  gauge(out, "nxd_serve_tokens_per_second", "Tokens generated per second over the last 10 s.",
        double(tokens) / window);
  out +=
      "# HELP nxd_serve_requests_finished_total Requests finished, by finish reason.\n"
      "# TYPE nxd_serve_requests_finished_total counter\n";
  for (const auto& [reason, n] : finished_)
    out += str("nxd_serve_requests_finished_total{finish_reason=\"", reason, "\"} ", n, "\n");
  out +=
      "# HELP nxd_serve_http_errors_total Error responses, by HTTP status.\n"
      "# TYPE nxd_serve_http_errors_total counter\n";
  for (const auto& [status, n] : http_errors_)
    out += str("nxd_serve_http_errors_total{status=\"", status, "\"} ", n, "\n");
  ttft_.write(out, "nxd_serve_time_to_first_token_seconds",
              "Time from a request's arrival to its first token.");
  itl_.write(out, "nxd_serve_inter_token_latency_seconds",
             "Time between consecutive tokens of a request.");
  return out;
}

}  // namespace nxd::inference::server
