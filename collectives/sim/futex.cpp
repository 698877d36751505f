#include "nxd/collectives/sim/futex.h"

#include <algorithm>
#include <chrono>
#include <climits>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif

namespace nxd::sim::detail {

void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, double max_s) {
#if defined(__linux__)
  max_s = std::clamp(max_s, 1e-6, 1.0);
  timespec ts{static_cast<time_t>(max_s), static_cast<long>((max_s - double(time_t(max_s))) * 1e9)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
#else
  if (word->load() == seen) std::this_thread::sleep_for(std::chrono::microseconds(50));
#endif
}
void futex_wake(std::atomic<uint32_t>* word, int count) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr,
          0);
#else
  (void)word;
  (void)count;
#endif
}
void futex_wake_all(std::atomic<uint32_t>* word) {
  futex_wake(word, INT_MAX);
}

}  // namespace nxd::sim::detail
