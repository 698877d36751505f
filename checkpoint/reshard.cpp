#include "nxd/checkpoint/reshard.h"

#include "nxd/checkpoint/error.h"

namespace nxd::ckpt {

ShardSpec shard_spec(const ParallelAttrs& a) {
  ShardSpec s;
  if (!a.tensor_model_parallel || a.num_partitions <= 1) return s;
  s.split = true;
  s.dim = a.partition_dim;
  s.stride = a.partition_stride;
  s.parts = a.num_partitions;
  s.replicas = a.kv_replicas;
  return s;
}

nlohmann::json to_json(const ShardSpec& s) {
  return {{"dim", s.dim}, {"stride", s.stride}, {"parts", s.parts}, {"replicas", s.replicas}};
}

ShardSpec shard_spec_from_json(const nlohmann::json& j, const std::string& where) {
  ShardSpec s;
  s.split = true;
  try {
    s.dim = j.at("dim").get<int64_t>();
    s.stride = j.at("stride").get<int64_t>();
    s.parts = j.at("parts").get<int64_t>();
    s.replicas = j.at("replicas").get<int64_t>();
  } catch (const std::exception& e) {
    throw CheckpointError(
        str("[checkpoint] ", where, ": bad split description ", j.dump(), " (", e.what(), ")"));
  }
  if (s.dim < 0 || s.stride < 1 || s.parts < 1 || s.replicas < 1 || s.parts % s.replicas != 0)
    throw CheckpointError(str("[checkpoint] ", where, ": bad split description ", j.dump()));
  return s;
}

namespace {
int64_t split_axis(const ShardSpec& s) {
  return s.stride > 1 ? s.dim + 1 : s.dim;
}
}  // namespace

Shape full_shape(const Shape& local, const ShardSpec& s) {
  if (!s.split) return local;
  const auto ax = split_axis(s);
  NXD_CHECK_SHAPE(ax < static_cast<int64_t>(local.size()), "[checkpoint] shard shape ",
                  shape_str(local), " has no split dim ", ax);
  Shape f;
  for (int64_t i = 0; i < static_cast<int64_t>(local.size()); ++i) {
    if (s.stride > 1 && i == s.dim) {
      f.push_back(local[i] * local[i + 1] * s.blocks());
      ++i;
    } else {
      f.push_back(i == ax ? local[i] * s.blocks() : local[i]);
    }
  }
  if (s.stride > 1)
    NXD_CHECK_SHAPE(local[s.dim] == s.stride, "[checkpoint] strided shard ", shape_str(local),
                    " should have ", s.stride, " at dim ", s.dim);
  return f;
}

Shape local_shape(const Shape& full, const ShardSpec& s, const std::string& what) {
  if (!s.split) return full;
  NXD_CHECK_SHAPE(s.dim < static_cast<int64_t>(full.size()), "[checkpoint] ", what, ": shape ",
                  shape_str(full), " has no split dim ", s.dim);
  const int64_t n = full[s.dim];
  NXD_CHECK_SHAPE(n % (s.stride * s.blocks()) == 0, "[checkpoint] ", what, ": size ", n, " of dim ",
                  s.dim, " of ", shape_str(full), " does not split into ", s.blocks(),
                  " blocks x stride ", s.stride);
  Shape l;
  for (int64_t i = 0; i < static_cast<int64_t>(full.size()); ++i) {
    if (i != s.dim) {
      l.push_back(full[i]);
    } else if (s.stride > 1) {
      l.push_back(s.stride);
      l.push_back(n / s.stride / s.blocks());
    } else {
      l.push_back(n / s.blocks());
    }
  }
  return l;
}

Tensor shard_view(const Tensor& full, const ShardSpec& s, int64_t rank) {
  if (!s.split) return full;
  Tensor v = full;
  if (s.stride > 1) {
    Shape vs;
    for (int64_t i = 0; i < full.dim(); ++i) {
      if (i == s.dim) {
        vs.push_back(s.stride);
        vs.push_back(full.size(i) / s.stride);
      } else {
        vs.push_back(full.size(i));
      }
    }
    v = full.view(vs);
  }
  const int64_t ax = split_axis(s);
  const int64_t len = v.size(ax) / s.blocks();
  return v.narrow(ax, (rank / s.replicas) * len, len);
}

std::vector<int64_t> covering_ranks(const ShardSpec& s) {
  std::vector<int64_t> r;
  for (int64_t b = 0; b < s.blocks(); ++b) r.push_back(b * s.replicas);
  return r;
}

}  // namespace nxd::ckpt
