#pragma once
// The simulated clock of one rank. It is the Context's CostModel: every kernel advances it by its
// roofline time, max(FLOPs / core peak for the dtype, bytes / HBM bandwidth), and collectives
// (collectives/sim) bring the participants to a common finish time. Communication issued
// asynchronously runs on a separate comm stream (comm_free) and overlaps compute until wait().
#include <memory>
#include <string>

#include "nxd/runtime/context.h"
#include "nxd/runtime/sim/machine.h"
#include "nxd/runtime/sim/timeline.h"

namespace nxd::sim {

// Roofline time of a kernel on `core`: bf16 runs at the BF16 peak, everything else at FP32's.
double roofline_seconds(const CoreSpec& core, double flops, double bytes, DType dtype);

class SimClock : public CostModel {
 public:
  // `timeline` may be null (nothing recorded); it must outlive the clock's use.
  SimClock(MachineSpec machine, int rank, Timeline* timeline = nullptr);

  void charge_compute(const char* op, double flops, double bytes, DType dtype) override;

  double now() const { return now_; }
  double comm_free() const { return comm_free_; }
  const MachineSpec& machine() const { return machine_; }
  int rank() const { return rank_; }
  // Whether events go to a timeline (callers skip formatting their names and args otherwise).
  bool recording() const { return timeline_ != nullptr; }

  // Moves the compute clock to `t` (if later), recording the gap as a wait named `why`.
  void wait_until(double t, const std::string& why);
  // Records communication [start, end) on the compute stream (blocking) or comm stream (async).
  void record_comm(const std::string& name, double start, double end, bool async,
                   const std::string& args = "");
  void set_comm_free(double t) { comm_free_ = std::max(comm_free_, t); }
  // Records a span [start, end) of this rank's work on its own "phase" lane (category
  // "phase": e.g. a pipeline stage's forward of one microbatch); the clock does not move.
  void record_phase(const std::string& name, double start, double end);

  double compute_seconds() const { return compute_; }
  double comm_seconds() const { return comm_; }
  double wait_seconds() const { return wait_; }

 private:
  MachineSpec machine_;
  int rank_;
  Timeline* timeline_;
  double now_ = 0, comm_free_ = 0;
  double compute_ = 0, comm_ = 0, wait_ = 0;
};

// The current context's SimClock, or null when it runs without the sim device.
SimClock* current_sim_clock();

}  // namespace nxd::sim
