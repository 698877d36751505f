#pragma once
// Fault injection (backend.fail_rank, fail_at_step, fail_mode; sim, and crash/kill under mpi): one
// rank fails after a given step, so the failure paths (the job ending cleanly, naming the rank; the
// newest checkpoint staying usable; a hung rank detected by backend.collective_timeout_s) are
// tested in one process (docs/design/run_safety.md, "Run safety").
#include <cstdint>
#include <string>

#include "nxd/trainer/callbacks.h"

namespace nxd::train_app {

struct FaultOptions {
  int rank = -1;               // the world rank that fails (-1: none)
  int64_t at_step = 1;         // after this optimizer step (before the checkpoint callback's save)
  std::string mode = "crash";  // crash: throws; hang: stops answering for hang_seconds, then
                               // throws; kill: SIGKILL to this process (mpi)
  double hang_seconds = 1;
};

class FaultInjection : public trainer::Callback {
 public:
  explicit FaultInjection(FaultOptions o) : o_(std::move(o)) {}
  void on_train_batch_end(trainer::Trainer& trainer, trainer::TrainingModule& module,
                          const trainer::StepOutput& out) override;

 private:
  FaultOptions o_;
};

}  // namespace nxd::train_app
