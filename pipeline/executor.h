#pragma once
// Runs a schedule's actions (schedule.h) on one pipeline rank over the collectives layer's
// point-to-point calls, on either backend.
//
// Messages. An activation (or its gradient) bound for stage s travels from rank (s-1) % pp (or
// (s+1) % pp) of the pipeline group with tag 3s (gradient: 3s+1). Between two ranks, messages of
// one tag are matched in order (MPI's rule; the sim backend keeps it too) and every schedule
// sends and receives a stage's microbatches in the same order, which simulate() checks.
//
// Shapes. Stage inputs are not known before the previous stage ran: the first time a stage's
// activation is sent for a given microbatch shape (the [b, S] of the ids slice, which every rank
// knows), the sender first sends its shape and dtype (tag 3s+2, ten i64); both ends cache it, so
// later steps send only the data. A gradient has its activation's shape.
//
// Deadlock. Sends are isends, waited for at the end of the step (their buffers are kept alive
// until then); receives block. A rank therefore only waits for a message that its sender
// produces earlier in its own list, which simulate() proves terminates for the schedule's
// (pp, M, vpp). A rank that throws propagates the failure through the backend (the sim world
// aborts its peers; under MPI the tools abort the job), so no rank is left waiting forever.
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/pipeline/schedule.h"
#include "nxd/runtime/tensor.h"

namespace nxd::pipeline {

// What one rank's stages compute.
class StageRunner {
 public:
  virtual ~StageRunner() = default;
  // Forward of microbatch `mb` through this rank's chunk `chunk`. `input` is the received
  // activation (requires grad when training), undefined on the first stage. Returns the
  // activation to send, or on the last stage the scalar to backpropagate (the microbatch's loss
  // divided by the number of microbatches).
  virtual Tensor forward(int chunk, int mb, const Tensor& input) = 0;
};

// A training step (forwards and backwards, gradients accumulated) or an evaluation (forwards).
enum class StepKind { train, eval };

struct StepResult {
  std::vector<Tensor> losses;  // last stage: each microbatch's returned scalar (detached)
  // On the sim clock (0 without one): the schedule's span on this rank, and the part of it spent
  // inside forwards and backwards (the rest is the bubble: waiting for peers).
  double span_seconds = 0, phase_seconds = 0;
};

class Executor {
 public:
  // `group`: the pipeline group, ordered by pipeline rank (parallel_state's PP group).
  Executor(std::shared_ptr<Communicator> group, ScheduleConfig cfg);
  const ScheduleConfig& config() const { return cfg_; }
  int rank() const { return rank_; }
  // Runs the training schedule (StepKind::train) or the inference schedule (StepKind::eval:
  // forwards only, no graph) for microbatches whose ids slices are [mb_rows, seq_len]. Collective
  // over the pipeline group.
  StepResult run(StageRunner& runner, StepKind kind, int64_t mb_rows, int64_t seq_len);

 private:
  struct Meta {
    Shape shape;
    DType dtype = DType::f32;
    bool meta = false;  // a meta activation (shapes only)
  };
  using Key = std::tuple<int, int64_t, int64_t>;  // receiving stage, rows, seq
  // isends an activation to `to_stage` (its shape and dtype first, the first time for `key`)
  void send_activation(const Tensor& t, int to_stage, const Key& key);
  void send_gradient(const Tensor& t, int to_stage);  // the shape is the activation's
  Tensor recv_activation(int stage, const Key& key);

  std::shared_ptr<Communicator> group_;
  ScheduleConfig cfg_;
  int rank_ = 0;
  std::map<Key, Meta> shapes_;  // activation shapes received or sent, by receiving stage
  std::vector<std::pair<Work, Tensor>> pending_;  // isends in flight and their buffers
};

}  // namespace nxd::pipeline
