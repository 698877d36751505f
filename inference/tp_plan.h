#pragma once
// Tensor parallelism for the engine: rank 0 of the TP group schedules and samples; before each
// model call it broadcasts the call (ids, positions, block tables) to the other ranks, which run
// the same call on their shard and their own KV cache (docs/design/inference.md).
#include <cstdint>
#include <memory>
#include <vector>

namespace nxd {
class Communicator;
}

namespace nxd::inference {

// One model call of a step: ids [B, S] right-padded, each row's start and length, its block
// table (B x MB, padded with -1).
struct ModelCall {
  int64_t B = 0, S = 0, MB = 0;
  std::vector<int64_t> ids, start, lengths, tables;
};

enum class PlanMessage : int64_t { idle = 0, call = 1, end = 2 };

// Rank 0's side: broadcasts one message over the TP group (a call's payload with `call`).
void send_plan(Communicator& tp, PlanMessage kind, const ModelCall* call = nullptr);
// A follower's side: receives the next message; fills `call` for PlanMessage::call.
PlanMessage receive_plan(Communicator& tp, ModelCall& call);

}  // namespace nxd::inference
