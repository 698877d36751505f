#pragma once
// Tensor parallelism for the engine: rank 0 of the TP group schedules and samples; before each
// call of a sharded model it broadcasts the call (which model, ids, positions, block tables) to
// the other ranks, which run the same call on their shard and their own KV cache
// (docs/design/inference.md).
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

// call: the model, the last position's logits; verify: the model, every position's (speculative
// decoding's verification); draft: the draft model at the model's TP (a draft at TP 1 runs on rank
// 0 alone and is never broadcast).
enum class PlanMessage : int64_t { idle = 0, call = 1, end = 2, verify = 3, draft = 4 };
inline bool carries_call(PlanMessage m) {
  return m == PlanMessage::call || m == PlanMessage::verify || m == PlanMessage::draft;
}

// Rank 0's side: broadcasts one message over the TP group (a call's payload when it carries one).
void send_plan(Communicator& tp, PlanMessage kind, const ModelCall* call = nullptr);
// A follower's side: receives the next message; fills `call` when it carries one.
PlanMessage receive_plan(Communicator& tp, ModelCall& call);

}  // namespace nxd::inference
