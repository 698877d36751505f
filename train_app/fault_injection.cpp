#include "nxd/train_app/fault_injection.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "nxd/runtime/context.h"
#include "nxd/runtime/error.h"

namespace nxd::train_app {

void FaultInjection::on_train_batch_end(trainer::Trainer&, trainer::TrainingModule&,
                                        const trainer::StepOutput& out) {
  if (out.step != o_.at_step || current_context().rank() != o_.rank) return;
  if (o_.mode == "hang") {
    // a thread cannot be killed: it sleeps past the others' timeout (they abort the job, naming
    // this rank), then ends
    std::this_thread::sleep_for(std::chrono::duration<double>(o_.hang_seconds));
    throw CommError(str("[fault] rank ", o_.rank, " hung after step ", out.step,
                        " (injected: backend.fail_mode=hang)"));
  }
  if (o_.mode == "kill") {  // mpi: this process dies at once, as on a lost node (no cleanup)
    std::fprintf(stderr, "[fault] rank %d killed itself after step %lld (backend.fail_mode=kill)\n",
                 o_.rank, static_cast<long long>(out.step));
    std::fflush(stderr);
    ::raise(SIGKILL);
  }
  throw CommError(str("[fault] rank ", o_.rank, " failed after step ", out.step,
                      " (injected: backend.fail_rank)"));
}

}  // namespace nxd::train_app
