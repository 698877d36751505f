#pragma once
// Thread-count invariance: what runs on the compute pool must give bitwise the same results at 1
// and 2 threads and across repeated runs.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "nxd/runtime/context.h"
#include "nxd/runtime/parallel.h"
#include "support/compare.h"

namespace nxd::testing {

// Runs f at 1 thread, then twice at 2 threads; every output must be bitwise equal.
inline void expect_thread_invariant(const std::function<std::vector<Tensor>()>& f) {
  const int old = parallel::threads();
  set_num_threads(1);
  std::vector<Tensor> a = f();
  set_num_threads(2);
  ASSERT_EQ(parallel::threads(), 2);
  std::vector<Tensor> b = f(), c = f();
  set_num_threads(old);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(str("output ", i));
    EXPECT_BITWISE_EQ(a[i], b[i]);
    EXPECT_BITWISE_EQ(b[i], c[i]);
  }
}

}  // namespace nxd::testing
