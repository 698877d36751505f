#pragma once
// Sim backend internals: sleep/wake on a 32-bit word (a futex on Linux; a short sleep elsewhere)
// and the pause of a spin-wait.
#include <atomic>
#include <cstdint>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace nxd::sim::detail {

// Sleeps while *word == seen, at most max_s seconds (clamped to [1 us, 1 s]).
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, double max_s);
// Wakes up to `count` sleepers on word.
void futex_wake(std::atomic<uint32_t>* word, int count);
void futex_wake_all(std::atomic<uint32_t>* word);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace nxd::sim::detail
