#include <gtest/gtest.h>

#include <cmath>

#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/dropout.h"
#include "nxd/runtime/kernels/rotary.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {
Tensor randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return nxd::testing::randn_from(s, dt, {seed, 15}, std);
}
}  // namespace

TEST(NnRotary, MatchesReferenceFullAndPartial) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (int64_t rd : {0, 4}) {  // Llama (whole head) and NeoX partial (4 of 8)
      for (k::RotaryDirection dir : {k::RotaryDirection::forward, k::RotaryDirection::inverse}) {
        Tensor x = randn({2, 3, 9, 8}, dt, 1), y = empty_like(x), r = empty_like(x);
        k::rotary_forward(y, x, rd, 10000.0, 3, dir);
        k::ref::rotary_forward(r, x, rd, 10000.0, 3, dir);
        EXPECT_CLOSE_REL(y, r, dt == DType::f64 ? 1e-13 : 2e-6);
        if (rd == 4) {
          EXPECT_EQ(y.at({1, 2, 5, 6}), x.at({1, 2, 5, 6}));  // passes through
        }
      }
    }
  }
}

// rope_scaling: the kernel against the reference, and closed forms of each llama3 band.
TEST(NnRotary, RopeScalingLinearAndLlama3) {
  RopeScaling lin{.kind = RopeScaling::Kind::linear, .factor = 2.0};
  RopeScaling l3{.kind = RopeScaling::Kind::llama3,
                 .factor = 8.0,
                 .low_freq_factor = 1.0,
                 .high_freq_factor = 4.0,
                 .original_max_position_embeddings = 64};
  for (DType dt : {DType::f32, DType::f64})
    for (const RopeScaling& sc : {lin, l3})
      for (k::RotaryDirection dir : {k::RotaryDirection::forward, k::RotaryDirection::inverse}) {
        Tensor x = randn({2, 3, 9, 8}, dt, 3), y = empty_like(x), r = empty_like(x);
        k::rotary_forward(y, x, 0, 500.0, 3, dir, sc);
        k::ref::rotary_forward(r, x, 0, 500.0, 3, dir, sc);
        EXPECT_CLOSE_REL(y, r, dt == DType::f64 ? 1e-13 : 2e-6);
        Tensor plain = empty_like(x);  // scaling changes the result
        k::rotary_forward(plain, x, 0, 500.0, 3, dir);
        EXPECT_GT(nxd::testing::diff(plain, y).max_abs, 1e-3);
      }
  // inv_freq of head dim 8, base 500: 1, 500^-1/4, 500^-1/2, 500^-3/4 (wavelengths 6.3, 29.7,
  // 140, 662): high frequencies (< 64/4) kept, low (> 64/1) divided by 8, the middle smoothed
  const double f1 = std::pow(500.0, -0.25), f2 = std::pow(500.0, -0.5);
  EXPECT_DOUBLE_EQ(l3.apply(1.0), 1.0);
  EXPECT_DOUBLE_EQ(l3.apply(f2), f2 / 8);
  const double s = (64 / (2 * M_PI / f1) - 1.0) / (4.0 - 1.0);
  EXPECT_NEAR(l3.apply(f1), (1 - s) * f1 / 8 + s * f1, 1e-15);
  EXPECT_DOUBLE_EQ(lin.apply(f1), f1 / 2);
}

TEST(NnRotary, ClosedFormSinglePair) {
  // head dim 6, rotary_dim 4 (half 2): the pair (1, 3) at position 5 rotates by
  // theta = 5 * 500^(-2*1/4).
  Tensor x = zeros({1, 1, 6, 6}, DType::f64);
  x.set({0, 0, 5, 1}, 0.7);
  x.set({0, 0, 5, 3}, -0.2);
  Tensor y = empty_like(x);
  k::rotary_forward(y, x, 4, 500.0, 0);
  double th = 5 * std::pow(500.0, -0.5);
  EXPECT_NEAR(y.at({0, 0, 5, 1}), 0.7 * std::cos(th) + 0.2 * std::sin(th), 1e-15);
  EXPECT_NEAR(y.at({0, 0, 5, 3}), -0.2 * std::cos(th) + 0.7 * std::sin(th), 1e-15);
  EXPECT_EQ(y.at({0, 0, 5, 0}), 0.0);
  // inverse rotation undoes it
  Tensor back = empty_like(x);
  k::rotary_forward(back, y, 4, 500.0, 0, k::RotaryDirection::inverse);
  EXPECT_CLOSE_REL(back, x, 1e-15);
}

TEST(NnRotary, StridedInputAndErrors) {
  Tensor xs = randn({2, 5, 3, 8}, DType::f32, 2), x = xs.transpose(1, 2);  // [B,H,S,D] view
  Tensor y = empty({2, 3, 5, 8}), r = empty({2, 3, 5, 8});
  k::rotary_forward(y, x, 0, 10000.0, 0);
  k::ref::rotary_forward(r, x, 0, 10000.0, 0);
  EXPECT_CLOSE_REL(y, r, 2e-6);
  // an output in [B, S, H, D] memory
  Tensor ys = empty({2, 5, 3, 8}), yv = ys.transpose(1, 2);
  k::rotary_forward(yv, x, 0, 10000.0, 0);
  EXPECT_BITWISE_EQ(yv.contiguous(), y);
  try {
    k::rotary_forward(y, x, 5, 10000.0, 0);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[rotary_forward] rotary_dim 5"), std::string::npos)
        << e.what();
  }
}

TEST(NnDropout, MaskFromStreamScaleAndDeterminism) {
  RngStream s{42, 7};
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = randn({3, 1500}, dt, 3), y = empty_like(x), y2 = empty_like(x), r = empty_like(x);
    k::dropout_apply(y, x, 0.3, s);
    k::dropout_apply(y2, x, 0.3, s);
    k::ref::dropout_apply(r, x, 0.3, s);
    EXPECT_BITWISE_EQ(y, y2);
    EXPECT_CLOSE_REL(y, r, 2.5e-7);  // x * (1/(1-p)) in f32 vs x / (1-p) in double
    int64_t zeros_n = 0;
    auto xv = x.to_vector(), yv = y.to_vector();
    for (size_t i = 0; i < yv.size(); ++i) {
      bool keep = s.uniform(i) >= 0.3f;
      if (!keep) {
        ASSERT_EQ(yv[i], 0.0) << i;
        ++zeros_n;
      } else {
        ASSERT_NEAR(yv[i], xv[i] / 0.7, 1e-6 * std::fabs(xv[i]) + 1e-12) << i;
      }
    }
    EXPECT_NEAR(double(zeros_n) / yv.size(), 0.3, 0.03);
    // another stream gives another mask; p = 0 is the identity; p = 1 zeroes everything
    Tensor y3 = empty_like(x);
    k::dropout_apply(y3, x, 0.3, RngStream{42, 8});
    EXPECT_FALSE(::nxd::testing::bitwise_equal(y3, y));
    k::dropout_apply(y3, x, 0.0, s);
    EXPECT_BITWISE_EQ(y3, x);
    k::dropout_apply(y3, x, 1.0, s);
    EXPECT_EQ(::nxd::testing::diff(y3, zeros_like(x)).max_abs, 0.0);
  }
  EXPECT_THROW(k::dropout_apply(empty({2}), zeros({2}), 1.5, s), InvalidArgument);
}
