#pragma once
// The resolver of a Config into a TrainConfig, shared by the files that resolve its sections
// (internal to train_app/: config_resolve.cpp, config_resolve_parallel.cpp).
#include <cstdint>
#include <utility>

#include "nxd/runtime/error.h"
#include "nxd/train_app/config.h"

namespace nxd::train_app::detail {

// The Config being resolved (derived values are written back into it, so config.yaml records
// them) and the checks every section uses; each failure names the key and the value.
struct Resolver {
  Config c;
  template <class... A>
  [[noreturn]] void fail(A&&... a) const {
    throw ConfigError(str("[config] ", std::forward<A>(a)...));
  }
  // Sizes and counts stay below 2^31, so that products of them (parameters, tokens) do not
  // overflow.
  static constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;
  int64_t positive(const char* k) const {
    const int64_t v = c.get_int(k);
    if (v <= 0) fail(k, " must be positive, got ", v);
    if (v > kMaxSize) fail(k, "=", v, " is too large (at most ", kMaxSize, ")");
    return v;
  }
  int64_t non_negative(const char* k) const {
    const int64_t v = c.get_int(k);
    if (v < 0) fail(k, " must be >= 0, got ", v);
    if (v > kMaxSize) fail(k, "=", v, " is too large (at most ", kMaxSize, ")");
    return v;
  }
  void derive(const char* k, const nlohmann::json& v) {
    if (c.is_null(k)) c.set(k, v, "derived");
  }
};

// distributed_strategy.* and backend.*: the parallel layout, ZeRO, the world, fault injection.
DistributedSection resolve_distributed(Resolver& r, const ModelConfig& m);

// micro_batch_size and the accumulation steps, from the global batch and the DP size.
int64_t resolve_batching(Resolver& r, DataSection& d, const DistributedSection& ds);

// The pipeline schedule against the layers, batch and data-parallel size (pipeline/schedule.h).
void check_pipeline_schedule(Resolver& r, const TrainConfig& t);

// The model's heads and sizes against the tensor-parallel degree.
void check_tensor_parallel(Resolver& r, const TrainConfig& t);

// What context parallelism needs of the rest of the config (layers/parallel/context_parallel.h).
void check_context_parallel(Resolver& r, const TrainConfig& t);

}  // namespace nxd::train_app::detail
