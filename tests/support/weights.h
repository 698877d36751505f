#pragma once
// Shared by the quantized-weight kernel tests (gemv_int8_test, gemv_int4_test): reproducible
// values in [-range, range] from a linear congruential generator, a guard that restores the
// compute pool's thread count, and the check that a kernel's bits depend on neither the thread
// count nor its operands' addresses.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
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

// v's values `off` elements into a buffer 8 longer: the same operand at another alignment.
template <class T>
std::vector<T> at_offset(const std::vector<T>& v, size_t off) {
  std::vector<T> b(v.size() + 8);
  if (!v.empty()) std::memcpy(b.data() + off, v.data(), v.size() * sizeof(T));
  return b;
}

// run(off) computes a kernel's output with every operand `off` elements into its buffer (at_offset)
// and returns it; at 1, 2, 4 and 3 threads and offsets 0, 1, 3 and 7 it must give the first
// result's bits.
inline void expect_same_bits_over_threads_and_offsets(
    const std::function<std::vector<float>(size_t off)>& run) {
  ThreadsGuard guard;
  std::vector<float> expect;
  for (int threads : {1, 2, 4, 3})
    for (size_t off : {0, 1, 3, 7}) {
      set_num_threads(threads);
      const std::vector<float> c = run(off);
      if (expect.empty()) {
        expect = c;
        continue;
      }
      ASSERT_EQ(c.size(), expect.size());
      ASSERT_EQ(std::memcmp(c.data(), expect.data(), c.size() * sizeof(float)), 0)
          << "threads=" << threads << " offset=" << off;
    }
}

}  // namespace nxd::testing
