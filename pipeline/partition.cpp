#include "nxd/pipeline/partition.h"

#include <algorithm>
#include <limits>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/runtime/error.h"

namespace nxd::pipeline {

std::string layer_prefix(const ModelConfig& cfg) {
  return cfg.arch == "gpt_neox" ? "gpt_neox.layers." : "model.layers.";
}

namespace {

void check_stages(const ModelConfig& cfg, int num_stages) {
  if (num_stages < 1) throw ConfigError(str("pipeline: ", num_stages, " stages"));
  if (cfg.num_layers < num_stages)
    throw ConfigError(str("pipeline: num_layers=", cfg.num_layers, " cannot be split into ",
                          num_stages, " stages (pp x vpp) of at least one layer each"));
}

std::vector<ModelPart> parts_from_ends(const std::vector<int64_t>& ends) {
  std::vector<ModelPart> parts;
  int64_t begin = 0;
  for (size_t s = 0; s < ends.size(); ++s) {
    ModelPart p;
    p.layer_begin = begin;
    p.layer_end = ends[s];
    p.embedding = s == 0;
    p.head = s + 1 == ends.size();
    parts.push_back(p);
    begin = ends[s];
  }
  return parts;
}

}  // namespace

std::vector<ModelPart> partition_by_cuts(const ModelConfig& cfg,
                                         const std::vector<std::string>& cuts, int num_stages) {
  check_stages(cfg, num_stages);
  if (static_cast<int>(cuts.size()) != num_stages - 1)
    throw ConfigError(str("pipeline_cuts: ", cuts.size(), " cuts for ", num_stages,
                          " stages (pp x vpp); need ", num_stages - 1));
  const std::string prefix = layer_prefix(cfg);
  std::vector<int64_t> ends;
  for (const std::string& c : cuts) {
    int64_t layer = -1;
    if (c.rfind(prefix, 0) == 0 && c.size() > prefix.size()) {
      const std::string n = c.substr(prefix.size());
      if (n.find_first_not_of("0123456789") == std::string::npos && n.size() < 10)
        layer = std::stoll(n);
    }
    if (layer < 0 || layer >= cfg.num_layers)
      throw ConfigError(str("pipeline_cuts: '", c, "' is not a decoder layer (", prefix, "0 .. ",
                            prefix, cfg.num_layers - 1, ")"));
    const int64_t end = layer + 1;
    if ((ends.empty() && end < 1) || (!ends.empty() && end <= ends.back()))
      throw ConfigError(str("pipeline_cuts: '", c, "' does not come after the previous cut"));
    if (end >= cfg.num_layers)
      throw ConfigError(str("pipeline_cuts: '", c, "' leaves the last stage without layers"));
    ends.push_back(end);
  }
  ends.push_back(cfg.num_layers);
  return parts_from_ends(ends);
}

ParameterCounts count_parameters(const ModelConfig& cfg) {
  // shapes only (per rank at the current TP degree)
  ModelConfig meta = cfg;
  meta.device = Device::meta;
  std::shared_ptr<CausalLM> m = make_causal_lm(meta, 0);
  ParameterCounts c;
  c.layers.assign(cfg.num_layers, 0);
  const std::string prefix = layer_prefix(cfg);
  for (const auto& [name, t] : m->named_parameters()) {
    if (name.rfind(prefix, 0) == 0) {
      const int64_t l = std::stoll(name.substr(prefix.size()));
      c.layers.at(l) += t.numel();
    } else if (name.find("embed_tokens") != std::string::npos ||
               name.find("embed_in") != std::string::npos) {
      c.embedding += t.numel();
    } else {
      c.head += t.numel();
    }
  }
  return c;
}

int64_t part_parameters(const ModelConfig& cfg, const ParameterCounts& counts,
                        const ModelPart& part) {
  int64_t n = 0;
  for (int64_t l = part.layer_begin; l < part.end(cfg); ++l) n += counts.layers.at(l);
  if (part.embedding || (part.head && cfg.tie_word_embeddings)) n += counts.embedding;
  if (part.head) n += counts.head;
  return n;
}

std::vector<ModelPart> auto_partition(const ModelConfig& cfg, int num_stages) {
  check_stages(cfg, num_stages);
  const ParameterCounts counts = count_parameters(cfg);
  const int64_t L = cfg.num_layers;
  const int S = num_stages;
  // prefix sums of layer counts
  std::vector<int64_t> pre(L + 1, 0);
  for (int64_t l = 0; l < L; ++l) pre[l + 1] = pre[l] + counts.layers[l];
  const int64_t tail = counts.head + (cfg.tie_word_embeddings ? counts.embedding : 0);
  auto cost = [&](int s, int64_t begin, int64_t end) {
    int64_t c = pre[end] - pre[begin];
    if (s == 0) c += counts.embedding;
    if (s == S - 1) c += tail;
    return c;
  };
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  // best[s][e]: the smallest max cost of stages 0..s covering layers [0, e); from[s][e]: stage
  // s's begin
  std::vector<std::vector<int64_t>> best(S, std::vector<int64_t>(L + 1, kInf));
  std::vector<std::vector<int64_t>> from(S, std::vector<int64_t>(L + 1, -1));
  for (int64_t e = 1; e <= L; ++e) best[0][e] = cost(0, 0, e), from[0][e] = 0;
  for (int s = 1; s < S; ++s)
    for (int64_t e = s + 1; e <= L; ++e)
      for (int64_t b = s; b < e; ++b) {
        if (best[s - 1][b] == kInf) continue;
        const int64_t v = std::max(best[s - 1][b], cost(s, b, e));
        if (v < best[s][e]) best[s][e] = v, from[s][e] = b;
      }
  std::vector<int64_t> ends(S);
  int64_t e = L;
  for (int s = S - 1; s >= 0; --s) {
    ends[s] = e;
    e = from[s][e];
  }
  return parts_from_ends(ends);
}

}  // namespace nxd::pipeline
