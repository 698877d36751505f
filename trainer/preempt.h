#pragma once
// Graceful preemption (docs/design/run_safety.md, "Preemption"): spot and cluster schedulers send
// SIGTERM (Ctrl-C sends SIGINT) with a grace period before killing a job. While a PreemptionGuard
// lives the first SIGTERM or SIGINT only records itself; the trainer finishes the current step,
// every rank agrees on the step to stop at (a one-integer all-reduce per step, over the world), the
// checkpoint callback saves there (synchronously: a pending async save is completed first), and
// the command line exits 128 + the signal (143, 130) saying where the checkpoint is. A second
// signal takes the default action at once (the process dies by it).
#include <csignal>
#include <string>

namespace nxd::trainer {

class PreemptionGuard {
 public:
  PreemptionGuard();   // installs the handlers (one guard at a time)
  ~PreemptionGuard();  // restores the previous ones
  PreemptionGuard(const PreemptionGuard&) = delete;
  PreemptionGuard& operator=(const PreemptionGuard&) = delete;

 private:
  struct sigaction old_term_ {
  }, old_int_{};
};

// Whether a guard is installed (the trainer then checks for a signal after every step).
bool preemption_enabled();
// The first signal received under the guard (SIGTERM or SIGINT), 0 if none.
int preemption_signal();
// The largest preemption_signal() of every rank (an i32 all-reduce over the world, collective):
// what Trainer::check_preemption agrees on after every step, and nxd-plan's meta step charges.
int agreed_preemption_signal();
// "SIGTERM", "SIGINT".
std::string signal_name(int sig);

}  // namespace nxd::trainer
