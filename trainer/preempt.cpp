#include "nxd/trainer/preempt.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "nxd/collectives/communicator.h"

namespace nxd::trainer {

namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_enabled{false};

void on_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig)) {  // the second: abort at once
    signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  static const char msg[] =
      "nxd-train: signal received: finishing the current step and saving a checkpoint (a second "
      "signal aborts at once)\n";
  const ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);  // async-signal-safe
  (void)n;
}

}  // namespace

PreemptionGuard::PreemptionGuard() {
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGINT, &sa, &old_int_);
  g_enabled = true;
}

PreemptionGuard::~PreemptionGuard() {
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGINT, &old_int_, nullptr);
  g_enabled = false;
}

bool preemption_enabled() {
  return g_enabled.load();
}

int preemption_signal() {
  return g_signal.load();
}

int agreed_preemption_signal() {
  int32_t sig = preemption_signal();
  world().all_reduce(&sig, &sig, 1, DType::i32, ReduceOp::max);
  return sig;
}

std::string signal_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "signal " + std::to_string(sig);
}

}  // namespace nxd::trainer
