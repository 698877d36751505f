#pragma once
// Tensor comparison helpers for tests: every failure prints the largest difference and where.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nxd/runtime/tensor.h"

namespace nxd::testing {

struct Diff {
  double max_abs = 0;  // max |a - b|
  double max_ref = 0;  // max |b|
  int64_t worst = -1;  // flat index of max |a - b|
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
  std::string str() const;
};

// Compares element-wise in double (any dtypes, same shape).
Diff diff(const Tensor& a, const Tensor& b);

// max|a-b| / max|b| <= tol, else a failure naming `what`, the shapes, and the largest difference.
::testing::AssertionResult close_rel(const Tensor& a, const Tensor& b, double tol,
                                     const std::string& what = "");
// max|a-b| <= atol + rtol*|b| elementwise.
::testing::AssertionResult allclose(const Tensor& a, const Tensor& b, double rtol, double atol,
                                    const std::string& what = "");
// Bitwise equality of the raw bytes (same dtype and shape).
::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b,
                                         const std::string& what = "");

// The largest relative difference |a[i] - b[i]| / |b[i]| of two series (losses, grad norms
// per step); a failure if their lengths differ.
inline double worst_rel(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double w = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    w = std::max(w, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return w;
}

}  // namespace nxd::testing

#define EXPECT_CLOSE_REL(a, b, tol) \
  EXPECT_TRUE(::nxd::testing::close_rel((a), (b), (tol), #a " vs " #b))
#define EXPECT_ALLCLOSE(a, b, rtol, atol) \
  EXPECT_TRUE(::nxd::testing::allclose((a), (b), (rtol), (atol), #a " vs " #b))
#define EXPECT_BITWISE_EQ(a, b) EXPECT_TRUE(::nxd::testing::bitwise_equal((a), (b), #a " vs " #b))
