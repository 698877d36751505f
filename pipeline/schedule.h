#pragma once
// Pipeline schedules as data: for every pipeline rank, the ordered list of actions it runs in one
// training step (NxD's Train1F1BSchedule / TrainInterleavedSchedule; docs/design/pipeline.md). The
// executor (executor.h) runs any such list over point-to-point send/recv; the lists can be checked
// without communication (simulate()).
//
// Stages. The model is cut into pp * vpp stages; stage s = pp * c + r lives on pipeline rank r as
// its chunk c (NxD's layout). Stage s receives activations from stage s - 1 and sends them to
// s + 1; gradients flow the other way. Stage 0 reads the batch, the last stage computes the loss.
//
// Schedules (M microbatches):
//   gpipe        every forward (mb 0..M-1), then every backward (mb 0..M-1).
//   1f1b         NxD's order: warmup = min(pp - r - 1, M) forwards, then M - warmup steps of one
//                forward and one backward, then warmup backwards. In the steady phase the send of
//                a forward's activation is deferred until after the next backward has received its
//                gradient (NxD does this "to avoid deadlock"), so a rendezvous send/recv pair
//                always meets. Peak stored activations: pp - r microbatches.
//   interleaved  virtual stages (vpp > 1, M % pp == 0; Megatron's order as NxD uses it): virtual
//                microbatch k runs chunk (k % (pp*vpp)) / pp forward, on microbatch
//                (k / (pp*vpp)) * pp + k % pp; backward chunks in reverse; warmup =
//                (pp - r - 1) * 2 + (vpp - 1) * pp (all steps when M == pp).
// Receives come right before the computation that needs them; sends right after the computation
// that produced them (1F1B's deferred steady-state sends excepted). The executor posts sends as
// non-blocking isends and waits for them at the end of the step, so a rank only ever blocks on a
// receive whose sender has it earlier in its own list: simulate() proves that this never
// deadlocks for a given (pp, M, vpp), under that "buffered send" model and, for gpipe and 1f1b,
// also under the stricter rendezvous model (a send waits for its receive).
#include <cstdint>
#include <string>
#include <vector>

namespace nxd::pipeline {

enum class ScheduleKind { gpipe, one_f_one_b, interleaved };
// "gpipe" | "1f1b" | "interleaved"; parse throws ConfigError naming the string.
const char* schedule_name(ScheduleKind k);
ScheduleKind parse_schedule(const std::string& s);

enum class ActionKind : uint8_t { recv_act, forward, send_act, recv_grad, backward, send_grad };
const char* action_name(ActionKind k);

struct Action {
  ActionKind kind;
  int microbatch;
  int chunk;  // the virtual stage on this rank (0 unless interleaved)
  bool operator==(const Action&) const = default;
};
std::string to_string(const Action& a);  // "F3c1", "recv_act 3c1", ...

struct ScheduleConfig {
  int pp = 1;                // pipeline ranks
  int num_microbatches = 1;  // M
  int vpp = 1;               // chunks per rank (virtual pipeline size)
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int num_stages() const { return pp * vpp; }
  // Throws ConfigError naming the numbers: pp, M, vpp < 1; vpp > 1 without interleaved or
  // interleaved with vpp == 1 or pp == 1; interleaved with M % pp != 0.
  void validate() const;
  // The config of these numbers, validated.
  static ScheduleConfig checked(int pp, int num_microbatches, int vpp, ScheduleKind kind);
};

// A training job's pipeline settings (NxDT's keys) and what they are checked against.
struct PipelineJob {
  int pipeline_model_parallel_size = 1;          // pp
  int virtual_pipeline_model_parallel_size = 1;  // vpp
  ScheduleKind pipeline_schedule = ScheduleKind::one_f_one_b;
  int data_parallel_size = 1;
  int64_t global_batch_size = 1;
  int64_t micro_batch_size = 1;
  int64_t num_layers = 1;
};
// The schedule of a job: microbatches = global_batch_size / (micro_batch_size x dp). ConfigError
// naming the numbers (and NxDT's key names) when the batch does not divide, the layers cannot be
// cut into pp x vpp stages of at least one layer, vpp > 1 without the
// interleaved schedule (or the reverse), or interleaved microbatches are not a multiple of pp.
ScheduleConfig resolve_schedule(const PipelineJob& job);

// The actions of pipeline rank `rank` (validates cfg; rank in [0, pp)).
std::vector<Action> build_schedule(const ScheduleConfig& cfg, int rank);
// Every rank's actions.
std::vector<std::vector<Action>> build_schedules(const ScheduleConfig& cfg);
// Evaluation (NxD's InferenceSchedule): forwards only, microbatch by microbatch, each through
// this rank's chunks in order (recv_act, F, send_act). cfg.kind is ignored.
std::vector<Action> build_inference_schedule(const ScheduleConfig& cfg, int rank);

// Only the computations ("F0 F1 B0 ..."): what NxD's tables show.
std::string compute_order(const std::vector<Action>& actions);

// Stage helpers.
inline int stage_of(const ScheduleConfig& c, int rank, int chunk) {
  return c.pp * chunk + rank;
}
inline bool is_first_stage(const ScheduleConfig& c, int rank, int chunk) {
  return stage_of(c, rank, chunk) == 0;
}
inline bool is_last_stage(const ScheduleConfig& c, int rank, int chunk) {
  return stage_of(c, rank, chunk) == c.num_stages() - 1;
}

// Lock-step execution of every rank's list without communication. Each round every rank runs as
// far as it can: a send completes at once (buffered) or only when its receiver has reached the
// matching receive (rendezvous); a receive completes when the matching message was sent. Messages
// between two ranks with the same (kind, chunk) are matched in order, as MPI matches a tag, and
// must carry the same microbatch; a computation must find its input received (or be stage 0), a
// backward its forward done and its gradient received (or be the last stage).
struct SimulationResult {
  bool ok = false;
  std::string error;          // what went wrong (deadlock: every rank's next action)
  int rounds = 0;             // lock-step rounds (a rough length of the schedule)
  std::vector<int> max_live;  // per rank: most forwards whose backward had not run yet
};
enum class SendModel { buffered, rendezvous };
// forward_only: the lists are inference schedules (no backward, no gradient messages).
SimulationResult simulate(const ScheduleConfig& cfg, const std::vector<std::vector<Action>>& s,
                          SendModel model = SendModel::buffered, bool forward_only = false);

// The analytical bubble fraction (pp - 1) / (M + pp - 1), divided by vpp when interleaved.
double analytical_bubble(const ScheduleConfig& cfg);

}  // namespace nxd::pipeline
