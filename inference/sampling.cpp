// Per-request sampling (sampling.h).
#include "nxd/inference/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace nxd::inference {

void check_sampling(const SamplingParams& p, int64_t vocab) {
  auto bad = [](const char* field, auto value, const char* want) {
    throw InvalidArgument(str("[inference] sampling.", field, "=", value, " must be ", want));
  };
  if (!(std::isfinite(p.temperature) && p.temperature >= 0))
    bad("temperature", p.temperature, "finite and >= 0");
  if (p.top_k < 0) bad("top_k", p.top_k, ">= 0 (0: off)");
  if (!(p.top_p > 0 && p.top_p <= 1)) bad("top_p", p.top_p, "in (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) bad("min_p", p.min_p, "in [0, 1]");
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0))
    bad("repetition_penalty", p.repetition_penalty, "finite and > 0");
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
    bad("presence_penalty", p.presence_penalty, "in [-2, 2]");
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
    bad("frequency_penalty", p.frequency_penalty, "in [-2, 2]");
  if (p.logprobs > 20 || p.logprobs > vocab) bad("logprobs", p.logprobs, "at most 20 (< 0: none)");
}

namespace {

// Ids in decreasing value, ties by lower id; only the first k are sorted.
std::vector<int64_t> best_ids(const std::vector<double>& v, int64_t k) {
  std::vector<int64_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int64_t a, int64_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
  k = std::min<int64_t>(k, static_cast<int64_t>(v.size()));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(k);
  return idx;
}

std::vector<double> log_softmax(const std::vector<double>& x) {
  const double mx = *std::max_element(x.begin(), x.end());
  double z = 0;
  for (double v : x) z += std::exp(v - mx);
  const double lz = mx + std::log(z);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - lz;
  return out;
}

void apply_penalties(std::vector<double>& l, const SamplingParams& p, const TokenCounts& c) {
  const int64_t V = static_cast<int64_t>(l.size());
  if (p.repetition_penalty != 1.0) {
    auto rep = [&](int64_t id) {
      if (id < 0 || id >= V) return;
      l[id] = l[id] > 0 ? l[id] / p.repetition_penalty : l[id] * p.repetition_penalty;
    };
    for (const auto& [id, n] : c.prompt) rep(id);
    for (const auto& [id, n] : c.generated)
      if (!c.prompt.count(id)) rep(id);
  }
  if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0)
    for (const auto& [id, n] : c.generated)
      if (id >= 0 && id < V)
        l[id] -= p.frequency_penalty * double(n) + (n > 0 ? p.presence_penalty : 0.0);
}

}  // namespace

TokenDistribution next_distribution(const std::vector<double>& logits, const SamplingParams& p,
                                    const TokenCounts& counts) {
  const int64_t V = static_cast<int64_t>(logits.size());
  NXD_CHECK(V > 0, "[sample_next] empty logits");
  std::vector<double> l = logits;
  apply_penalties(l, p, counts);
  TokenDistribution d;
  if (p.temperature == 0.0) {
    d.ids = {std::max_element(l.begin(), l.end()) - l.begin()};  // first max
    d.w = {1.0};
    d.z = 1.0;
    return d;
  }
  const bool filter = p.top_p < 1.0 || p.min_p > 0.0;
  const int64_t k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  std::vector<int64_t> idx = (k < V || filter) ? best_ids(l, k) : std::vector<int64_t>(V);
  if (!(k < V || filter)) std::iota(idx.begin(), idx.end(), 0);
  double mx = -INFINITY;
  for (int64_t i : idx) mx = std::max(mx, l[i]);
  std::vector<double> w(idx.size());
  double z = 0;
  for (size_t j = 0; j < idx.size(); ++j) z += w[j] = std::exp((l[idx[j]] - mx) / p.temperature);
  size_t keep = idx.size();
  if (p.top_p < 1.0) {  // idx is in decreasing probability: keep the nucleus
    double c = 0;
    for (size_t j = 0; j < keep; ++j) {
      c += w[j] / z;
      if (c >= p.top_p) {
        keep = j + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0) {  // w[0] is the largest weight (exp(0) = 1)
    size_t j = 1;
    while (j < keep && w[j] / z >= p.min_p * (w[0] / z)) ++j;
    keep = j;
  }
  idx.resize(keep), w.resize(keep);
  z = 0;
  for (double x : w) z += x;
  d.ids = std::move(idx);
  d.w = std::move(w);
  d.z = z;
  return d;
}

void add_logprobs(Sample& s, const std::vector<double>& logits, int64_t n) {
  if (n < 0) return;
  const std::vector<double> lp = log_softmax(logits);
  s.chosen = {s.id, lp[s.id]};
  for (int64_t i : best_ids(lp, n)) s.top.push_back({i, lp[i]});
}

Sample sample_next(const std::vector<double>& logits, const SamplingParams& p,
                   const TokenCounts& counts, double u) {
  Sample s;
  s.id = next_distribution(logits, p, counts).draw(u);
  add_logprobs(s, logits, p.logprobs);
  return s;
}

}  // namespace nxd::inference
