#pragma once
// How a tensor is split over the TP ranks, as checkpoints record it, and the arithmetic that
// turns the shards of one TP degree into those of another.
//
// A split tensor (ParallelAttrs::tensor_model_parallel) is one block of a logical full tensor F
// (what a single rank holds) along dim d:
//   - stride s > 1 (fused layouts): F is viewed as F[:d] + [s, F[d]/s] + F[d+1:] and the split is
//     along dim d+1 of that view; the shard keeps the view's rank (ColumnParallelLinear registers
//     [s, out/(s*tp), in]);
//   - kv replicas m > 1 (GQA K/V): the tp ranks hold tp/m distinct blocks, rank r block r/m.
// A tensor that is not split is the same on every rank (F itself).
#include <cstdint>
#include <nlohmann/json.hpp>

#include "nxd/layers/parallel/attributes.h"
#include "nxd/runtime/tensor.h"

namespace nxd::ckpt {

struct ShardSpec {
  bool split = false;
  int64_t dim = 0, stride = 1, parts = 1, replicas = 1;
  int64_t blocks() const { return split ? parts / replicas : 1; }
  bool operator==(const ShardSpec&) const = default;
};

ShardSpec shard_spec(const ParallelAttrs& a);
nlohmann::json to_json(const ShardSpec& s);  // {"dim", "stride", "parts", "replicas"}
// Parses to_json's form; `where` names the file and tensor in the CheckpointError.
ShardSpec shard_spec_from_json(const nlohmann::json& j, const std::string& where);

// The full shape of a tensor whose shard on one rank has `local` shape (ShapeError if the spec
// does not fit the shape).
Shape full_shape(const Shape& local, const ShardSpec& s);
// The shape of a rank's shard of a tensor of shape `full` (ShapeError naming `what` if the split
// does not divide).
Shape local_shape(const Shape& full, const ShardSpec& s, const std::string& what);
// The (strided) view of `full` (contiguous) that TP rank `rank` holds, shaped as its shard.
Tensor shard_view(const Tensor& full, const ShardSpec& s, int64_t rank);
// The TP ranks whose shards together cover the full tensor once: 0, m, 2m, ...
std::vector<int64_t> covering_ranks(const ShardSpec& s);

}  // namespace nxd::ckpt
