#pragma once
// The ZeRO stage of a data-parallel run (DeepSpeed's zero_optimization.stage; NxD Training's
// zero1 is stage 1): what is sharded over the data-parallel ranks (docs/design/fsdp.md).
//   none   nothing: every rank holds the full parameters, gradients and optimizer state (DDP).
//   one    the optimizer state and f32 master weights (optim/zero1.h).
//   two    also the reduced gradients: each bucket is reduce-scattered straight into this rank's
//          shard and the full-size gradient is freed once its bucket has gone out.
//   three  also the parameters (FSDP's full sharding).
#include <cstdint>
#include <string>

namespace nxd::optim {

enum class ZeroStage { none = 0, one = 1, two = 2, three = 3 };

// "0", "1", "2", "3".
const char* zero_stage_name(ZeroStage s);
// 0..3; ConfigError naming `key` and the value otherwise.
ZeroStage zero_stage_from_int(int64_t v, const std::string& key);

// ZeRO-3's prefetch (optim/zero3_unit.h): next_unit: gathering a unit starts the non-blocking
// all-gather of the next one of its pass (the next layer's in forward, the previous one's in
// backward; FSDP's forward_prefetch and backward_prefetch=BACKWARD_PRE), so it runs on the comm
// stream under this unit's compute; none: each unit is gathered when it is needed, in full view.
enum class UnitPrefetch { next_unit, none };

// ZeRO-3 under pipeline parallelism: whether the stage that runs the output head shards its final
// norm and head (its root unit) over its DP group. The reduction waits for the step under a
// pipeline, so the head's full-size .grad accumulates from the first microbatch's backward on and
// every later gather of the head lies beside it: with a large vocabulary that is the stage's peak,
// 1/DP of the head above keeping it whole (docs/design/fsdp.md, "ZeRO-3 under pipeline
// parallelism"). whole (the default) keeps it; the first stage's embedding is sharded either way.
enum class PipelineHeadUnit { whole, sharded };

}  // namespace nxd::optim
