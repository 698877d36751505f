// partition_pieces: where a PipelineSequential is cut into stages (generic_pipeline.h).
#include <algorithm>

#include "nxd/pipeline/generic_pipeline.h"
#include "nxd/pipeline/partition.h"
#include "nxd/runtime/error.h"

namespace nxd::pipeline {

namespace {

std::string piece_list(const std::vector<Piece>& pieces) {
  std::string s;
  for (const Piece& p : pieces) s += (s.empty() ? "" : ", ") + p.name + " (" + p.type + ")";
  return s;
}

int64_t parameter_elements(const Piece& p) {
  int64_t n = 0;
  if (p.module)
    for (const auto& [name, t] : p.module->named_parameters()) n += t.numel();
  return n;
}

std::vector<StagePieces> by_cuts(const std::vector<Piece>& pieces,
                                 const std::vector<std::string>& cuts, int num_stages) {
  const int64_t n = static_cast<int64_t>(pieces.size());
  if (static_cast<int>(cuts.size()) != num_stages - 1)
    throw ConfigError(str("[pipeline] ", cuts.size(), " pipeline_cuts for ", num_stages,
                          " stages: give num_stages - 1 = ", num_stages - 1));
  std::vector<StagePieces> out;
  int64_t begin = 0;
  for (const std::string& c : cuts) {
    auto it =
        std::find_if(pieces.begin(), pieces.end(), [&](const Piece& p) { return p.name == c; });
    if (it == pieces.end())
      throw ConfigError(str("[pipeline] pipeline_cuts names '", c,
                            "', which is no piece of the model; its pieces: ", piece_list(pieces)));
    const int64_t i = it - pieces.begin();
    if (i < begin)
      throw ConfigError(str("[pipeline] pipeline_cuts '", c, "' (piece ", i,
                            ") comes before the previous cut: give the cuts in model order"));
    if (i + 1 >= n)
      throw ConfigError(str("[pipeline] pipeline_cuts '", c,
                            "' is the last piece: the last stage would hold no piece"));
    out.push_back({begin, i + 1});
    begin = i + 1;
  }
  out.push_back({begin, n});
  return out;
}

}  // namespace

std::vector<StagePieces> partition_pieces(const std::vector<Piece>& pieces, int num_stages,
                                          const std::string& transformer_layer_cls,
                                          const std::vector<std::string>& pipeline_cuts) {
  const int64_t n = static_cast<int64_t>(pieces.size());
  if (n == 0) throw ConfigError("[pipeline] the model has no pieces to cut into stages");
  std::vector<int64_t> layers;  // the pieces of transformer_layer_cls
  for (int64_t i = 0; i < n; ++i)
    if (pieces[i].type == transformer_layer_cls) layers.push_back(i);
  if (!transformer_layer_cls.empty() && layers.empty())
    throw ConfigError(
        str("[pipeline] transformer_layer_cls '", transformer_layer_cls,
            "' is the class of no piece of the model; its pieces: ", piece_list(pieces)));
  if (!pipeline_cuts.empty()) return by_cuts(pieces, pipeline_cuts, num_stages);
  if (num_stages == 1) return {{0, n}};
  if (transformer_layer_cls.empty())
    throw ConfigError(str("[pipeline] ", num_stages,
                          " stages need transformer_layer_cls or pipeline_cuts to cut the model "
                          "at; its pieces: ",
                          piece_list(pieces)));
  // the pieces before the first layer are the "embedding", those after the last the "head", and
  // each layer holds the pieces up to the next one: auto_partition balances the layers
  ModelPieces mp;
  const int64_t L = static_cast<int64_t>(layers.size());
  auto size_of = [&](int64_t b, int64_t e) {
    PieceSize s;
    for (int64_t i = b; i < e; ++i) s.parameters += parameter_elements(pieces[i]);
    return s;
  };
  mp.embedding = size_of(0, layers.front());
  for (int64_t k = 0; k < L; ++k)
    mp.layers.push_back(size_of(layers[k], k + 1 < L ? layers[k + 1] : layers[k] + 1));
  mp.head = size_of(layers.back() + 1, n);
  if (L < num_stages)
    throw ConfigError(str("[pipeline] ", L, " piece(s) of transformer_layer_cls '",
                          transformer_layer_cls, "' cannot be cut into ", num_stages,
                          " stages of at least one each"));
  std::vector<StagePieces> out;
  for (const ModelPart& part : auto_partition(mp, num_stages, PartitionBalance::parameters)) {
    const int64_t end_layer = part.layer_end < 0 ? L : part.layer_end;
    out.push_back({part.layer_begin == 0 ? 0 : layers[part.layer_begin],
                   end_layer == L ? n : layers[end_layer]});
  }
  return out;
}

}  // namespace nxd::pipeline
