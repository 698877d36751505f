#include "nxd/pipeline/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "nxd/runtime/error.h"

namespace nxd::pipeline {

const char* partition_balance_name(PartitionBalance b) {
  return b == PartitionBalance::modeled_cost ? "modeled_cost" : "parameters";
}

PartitionBalance parse_partition_balance(const std::string& s) {
  if (s == "parameters") return PartitionBalance::parameters;
  if (s == "modeled_cost") return PartitionBalance::modeled_cost;
  throw ConfigError(
      str("[pipeline] partition balance '", s, "' is not one of parameters, modeled_cost"));
}

namespace {

void check_stages(int64_t num_layers, int num_stages) {
  if (num_stages < 1) throw ConfigError(str("pipeline: ", num_stages, " stages"));
  if (num_layers < num_stages)
    throw ConfigError(str("pipeline: num_layers=", num_layers, " cannot be split into ", num_stages,
                          " stages (pp x vpp) of at least one layer each"));
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

// Decoder layer index of a cut name, or -1.
int64_t cut_layer(const std::string& c, const std::string& prefix) {
  if (prefix.empty() || c.rfind(prefix, 0) != 0 || c.size() == prefix.size()) return -1;
  const std::string n = c.substr(prefix.size());
  if (n.find_first_not_of("0123456789") != std::string::npos || n.size() >= 10) return -1;
  return std::stoll(n);
}

// What auto_partition compares: parameters, or modeled seconds in whole picoseconds (integers,
// so that equal layers tie exactly and ties go to the earliest cut).
int64_t weight(const PieceSize& p, PartitionBalance b) {
  return b == PartitionBalance::parameters ? p.parameters : std::llround(p.seconds * 1e12);
}

}  // namespace

std::vector<ModelPart> partition_by_cuts(const ModelPieces& pieces,
                                         const std::vector<std::string>& cuts, int num_stages) {
  const int64_t L = pieces.num_layers();
  check_stages(L, num_stages);
  if (static_cast<int>(cuts.size()) != num_stages - 1)
    throw ConfigError(str("pipeline_cuts: ", cuts.size(), " cuts for ", num_stages,
                          " stages (pp x vpp); need ", num_stages - 1));
  const std::string& prefix = pieces.layer_prefix;
  if (prefix.empty() && !cuts.empty())
    throw ConfigError(str("pipeline_cuts: '", cuts.front(),
                          "': the model's decoder layers have no parameters to name them by"));
  std::vector<int64_t> ends;
  for (const std::string& c : cuts) {
    const int64_t layer = cut_layer(c, prefix);
    if (layer < 0 || layer >= L)
      throw ConfigError(str("pipeline_cuts: '", c, "' is not a decoder layer (", prefix, "0 .. ",
                            prefix, L - 1, ")"));
    const int64_t end = layer + 1;
    if (!ends.empty() && end <= ends.back())
      throw ConfigError(str("pipeline_cuts: '", c, "' does not come after the previous cut"));
    if (end >= L)
      throw ConfigError(str("pipeline_cuts: '", c, "' leaves the last stage without layers"));
    ends.push_back(end);
  }
  ends.push_back(L);
  return parts_from_ends(ends);
}

std::vector<ModelPart> auto_partition(const ModelPieces& pieces, int num_stages,
                                      PartitionBalance balance) {
  const int64_t L = pieces.num_layers();
  check_stages(L, num_stages);
  const int S = num_stages;
  // prefix sums of the layers' weights
  std::vector<int64_t> pre(L + 1, 0);
  for (int64_t l = 0; l < L; ++l) pre[l + 1] = pre[l] + weight(pieces.layers[l], balance);
  const int64_t embedding = weight(pieces.embedding, balance), head = weight(pieces.head, balance);
  auto cost = [&](int s, int64_t begin, int64_t end) {
    int64_t c = pre[end] - pre[begin];
    if (s == 0) c += embedding;
    if (s == S - 1) c += head;
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

std::vector<ModelPart> auto_partition(const ModelConfig& cfg, int num_stages,
                                      PartitionBalance balance, const PieceOptions& opts) {
  check_stages(cfg.num_layers, num_stages);
  return auto_partition(measure_pieces(cfg, opts), num_stages, balance);
}

}  // namespace nxd::pipeline
