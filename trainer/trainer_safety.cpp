// The trainer's safety checks after a step (docs/design/run_safety.md, "Run safety"): a non-finite
// step (TrainerOptions::on_nonfinite) and preemption (preempt.h).
#include "nxd/trainer/trainer.h"

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/collectives/communicator.h"
#include "nxd/runtime/error.h"
#include "nxd/trainer/preempt.h"

namespace nxd::trainer {

// Under a PreemptionGuard: whether any rank got SIGTERM/SIGINT, agreed by every rank after the
// same step (a signal reaches ranks at different moments), so all stop after this step.
void Trainer::check_preemption() {
  if (!preemption_enabled()) return;
  const int sig = agreed_preemption_signal();
  if (sig == 0 || preempt_signal_ != 0) return;
  preempt_signal_ = sig;
  request_stop(str("preempted by ", signal_name(sig), " after step ", step_));
}

// A step that was not applied (its loss or gradient norm is not finite): logged, then the run
// stops (on_nonfinite "stop": any async checkpoint completed first, so the newest finite one
// counts) or goes on.
void Trainer::on_nonfinite_step(const StepOutput& out, double sim_step_s) {
  const std::string what = str("step ", out.step, ": loss ", out.loss, ", gradient norm ",
                               out.grad_norm, " (not finite); the update was not applied");
  if (opts_.on_nonfinite == "skip") {
    message(what + ", skipped (trainer.on_nonfinite=skip)");
    return;
  }
  MetricsRow row;
  row.step = step_;
  row.loss = out.loss;
  row.lr = out.lr;
  row.grad_norm = out.grad_norm;
  if (sim_step_s >= 0) row.sim_step_s = sim_step_s;
  log_row(row);
  if (is_logging_rank())
    for (auto& l : opts_.loggers) l->finalize();
  ckpt::finalize_checkpoint();
  world().barrier();  // every rank logged before any throws (a sim rank's throw stops the rest)
  throw NonFiniteLoss(str("[trainer] ", what,
                          ": training stopped with no checkpoint from this step (the newest "
                          "saved one is the last good state; trainer.on_nonfinite=skip skips "
                          "such steps instead)"));
}

}  // namespace nxd::trainer
