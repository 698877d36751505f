// nxd-bench-serve's prefix-caching and chunked-prefill cases (method: bench/serve.cpp's header).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <thread>

#include "nxd/runtime/error.h"
#include "serve_bench.h"

namespace nxd::bench::serve {

namespace {

struct PrefixStats {
  double cold = 0, warm = 0, hit_rate = -1, warm_cached = 0;
};

PrefixStats run_prefix(Config& c, const Endpoint& at, bool nxd, const std::string& where) {
  std::mt19937_64 rng(c.seed + 1000);
  const int64_t first = std::min<int64_t>(256, c.vocab / 2);
  const auto counters = [&] {
    const std::string m = get_text(at, "/metrics");
    return std::pair{metric_value(m, "nxd_serve_prefix_cache_hits_total"),
                     metric_value(m, "nxd_serve_prefix_cache_queries_total")};
  };
  const auto before = nxd ? counters() : std::pair{0.0, 0.0};
  std::vector<double> cold, warm, cached;
  std::vector<StreamResult> all;
  for (int64_t i = 0; i < c.prefix_rounds; ++i) {
    const auto sys = random_ids(rng, c.system_tokens, first, c.vocab);
    for (int k = 0; k < 2; ++k) {
      auto p = sys;
      const auto q = random_ids(rng, c.question_tokens, first, c.vocab);
      p.insert(p.end(), q.begin(), q.end());
      StreamResult r = stream_completion(at, p, 8);
      if (r.ok) (k == 0 ? cold : warm).push_back(r.ttft);
      if (r.ok && k == 1 && r.cached_tokens >= 0) cached.push_back(double(r.cached_tokens));
      all.push_back(std::move(r));
    }
  }
  report_failures(c, where, all);
  PrefixStats s{percentile(cold, 0.5) * 1e3, percentile(warm, 0.5) * 1e3, -1,
                percentile(cached, 0.5)};
  if (nxd) {
    const auto after = counters();
    const double q = after.second - before.second;
    if (before.second >= 0 && q > 0) s.hit_rate = (after.first - before.first) / q;
  }
  return s;
}

}  // namespace

void case_prefix(Config& c) {
  const int64_t positions = 4 * (c.system_tokens + c.question_tokens + 32);
  PrefixStats nx, ll;
  {
    Server s = start_nxd(c, {.seqs = 4, .kv_positions = positions}, "prefix");
    nx = run_prefix(c, s.at, true, "nxd-serve prefix");
  }
  std::printf(
      "case=prefix system_tokens=%lld question_tokens=%lld rounds=%lld nxd_ttft_cold_ms=%.1f "
      "nxd_ttft_warm_ms=%.1f nxd_warm_over_cold=%.3f nxd_hit_rate=%.3f nxd_warm_cached_tokens=%.0f",
      (long long)c.system_tokens, (long long)c.question_tokens, (long long)c.prefix_rounds, nx.cold,
      nx.warm, nx.cold > 0 ? nx.warm / nx.cold : 0.0, nx.hit_rate, nx.warm_cached);
  if (c.llamacpp) {
    Server s = start_llama(c, 1, positions, "prefix");
    ll = run_prefix(c, s.at, false, "llama-server prefix");
    std::printf(
        " llamacpp_ttft_cold_ms=%.1f llamacpp_ttft_warm_ms=%.1f "
        "llamacpp_warm_over_cold=%.3f llamacpp_warm_cached_tokens=%.0f",
        ll.cold, ll.warm, ll.cold > 0 ? ll.warm / ll.cold : 0.0, ll.warm_cached);
  }
  std::printf("\n");
  std::fflush(stdout);
}

namespace {

// The streams' max_tokens: enough to outlive the long prompt's prefill (they are closed then).
int64_t stream_max_tokens(const Config& c) {
  return std::min<int64_t>(c.max_positions - c.stream_prompt - 1, 1024);
}

struct ChunkStats {
  double itl99 = 0, itl_max = 0, long_ttft = 0, itl50_outside = 0;
};

// `streams` requests decoding; once each has a few tokens the long prompt arrives; the streams
// are closed when it has its first token.
ChunkStats run_chunked(Config& c, const Endpoint& at, const std::string& where) {
  std::mt19937_64 rng(c.seed + 2000);
  const int64_t first = std::min<int64_t>(256, c.vocab / 2);
  const int64_t stream_tokens = stream_max_tokens(c);
  std::atomic<bool> stop{false};
  std::vector<std::atomic<int64_t>> progress(static_cast<size_t>(c.streams));
  std::vector<StreamResult> rs(static_cast<size_t>(c.streams));
  std::vector<std::thread> ts;
  for (int64_t i = 0; i < c.streams; ++i) {
    auto p = random_ids(rng, c.stream_prompt, first, c.vocab);
    ts.emplace_back([&, i, p] {
      rs[i] = stream_completion(at, p, stream_tokens, {.progress = &progress[i], .stop = &stop});
    });
  }
  const double wait_end = steady_seconds() + 120;
  while (steady_seconds() < wait_end &&
         std::any_of(progress.begin(), progress.end(), [](const auto& p) { return p.load() < 4; }))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto long_prompt = random_ids(rng, c.long_prompt, first, c.vocab);
  StreamResult lr = stream_completion(at, long_prompt, 4);
  const double window_end = lr.ok ? lr.token_times.front() : steady_seconds();
  stop = true;
  for (auto& t : ts) t.join();
  rs.push_back(lr);
  report_failures(c, where, rs);
  std::vector<double> inside, outside;
  for (int64_t i = 0; i < c.streams; ++i)
    for (size_t k = 1; k < rs[i].token_times.size(); ++k) {
      const double t1 = rs[i].token_times[k], gap = t1 - rs[i].token_times[k - 1];
      (t1 >= lr.sent && rs[i].token_times[k - 1] <= window_end ? inside : outside).push_back(gap);
    }
  ChunkStats s;
  s.itl99 = percentile(inside, 0.99) * 1e3;
  s.itl_max = inside.empty() ? 0 : *std::max_element(inside.begin(), inside.end()) * 1e3;
  s.itl50_outside = percentile(outside, 0.5) * 1e3;
  s.long_ttft = lr.ttft * 1e3;
  return s;
}

}  // namespace

void case_chunked(Config& c) {
  if (c.nxd_url) {
    std::printf("case=chunked_prefill skipped=1 reason=needs_to_restart_nxd-serve\n");
    return;
  }
  const int64_t positions =
      c.long_prompt + 16 + c.streams * (c.stream_prompt + stream_max_tokens(c) + 16);
  ChunkStats on, off;
  {
    Server s = start_nxd(c, {.seqs = c.streams + 1, .kv_positions = positions}, "chunked-on");
    on = run_chunked(c, s.at, "nxd-serve chunked on");
  }
  {
    Server s = start_nxd(c,
                         {.seqs = c.streams + 1,
                          .kv_positions = positions,
                          .budget = c.long_prompt + c.streams + 64,
                          .chunked = false},
                         "chunked-off");
    off = run_chunked(c, s.at, "nxd-serve chunked off");
  }
  for (const auto& [name, s] : {std::pair{"on", on}, std::pair{"off", off}})
    std::printf(
        "case=chunked_prefill chunked=%s streams=%lld long_prompt=%lld nxd_itl_p99_ms=%.2f "
        "nxd_itl_max_ms=%.2f nxd_itl_p50_outside_ms=%.2f nxd_long_ttft_ms=%.1f\n",
        name, (long long)c.streams, (long long)c.long_prompt, s.itl99, s.itl_max, s.itl50_outside,
        s.long_ttft);
  std::printf("case=chunked_prefill_ratio itl_p99_off_over_on=%.3f long_ttft_on_over_off=%.3f\n",
              on.itl99 > 0 ? off.itl99 / on.itl99 : 0.0,
              off.long_ttft > 0 ? on.long_ttft / off.long_ttft : 0.0);
  std::fflush(stdout);
}

}  // namespace nxd::bench::serve
