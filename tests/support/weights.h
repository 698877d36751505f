#pragma once
// Shared by the quantized-weight kernel tests (gemv_int8_test, gemv_int4_test): reproducible
// values in [-range, range] from a linear congruential generator, and a guard that restores the
// compute pool's thread count.
#include <cstdint>
#include <vector>

#include "nxd/runtime/context.h"

namespace nxd::testing {

inline std::vector<float> lcg_values(size_t n, uint32_t seed, float range = 1.5f) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = range * static_cast<float>(static_cast<int32_t>(s >> 8) % 2001 - 1000) / 1000.0f;
  }
  return v;
}

struct ThreadsGuard {
  int prev = num_threads();
  ~ThreadsGuard() { set_num_threads(prev); }
};

}  // namespace nxd::testing
