#pragma once
// Shared helpers of the op tests: seeded random tensors and a gradcheck assertion.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nxd/autograd/function.h"
#include "nxd/runtime/init.h"

namespace nxd::testing {

// Normal(0, std^2) values, generated in f64 from `seed` (counter-based), converted to `dt`.
inline Tensor randn(const Shape& s, uint64_t seed, DType dt = DType::f64, double std = 1.0) {
  Tensor t = empty(s, DType::f64);
  init::normal(t, RngStream{seed, 20}, 0.0, std);
  return t.to(dt);
}

// The same drawn from an explicit stream (a test file keeps its own stream number so its values
// stay apart from other files'), converted to `dt`.
inline Tensor randn_from(const Shape& s, DType dt, RngStream stream, double std = 1.0) {
  Tensor t = empty(s, DType::f64);
  init::normal(t, stream, 0.0, std);
  return t.to(dt);
}

// gradcheck in f64, failing with `what` and the first mismatching element.
inline void check_grad(const autograd::ForwardFn& fn, const std::vector<Tensor>& inputs,
                       const std::string& what = "") {
  auto r = autograd::gradcheck(fn, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

}  // namespace nxd::testing
