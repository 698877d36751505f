#include "nxd/runtime/kernels/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "support/compare.h"

using namespace nxd;

namespace {
Tensor randn(const Shape& s, DType dt, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> nd;
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  for (double& x : v) x = nd(g);
  return from_doubles(v, s, dt);
}
}  // namespace

TEST(ReduceKernel, SumAlongDimsMatchesReference) {
  const std::vector<std::vector<int64_t>> dimsets = {{},   {0},    {1},    {2},
                                                     {-1}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (DType dt : {DType::f32, DType::f64})
    for (bool strided : {false, true})
      for (const auto& dims : dimsets)
        for (bool keep : {false, true}) {
          Tensor x = strided ? randn({6, 5, 7}, dt, 1).permute({2, 0, 1}) : randn({7, 6, 5}, dt, 1);
          Tensor out = empty(kernels::reduced_shape(x.shape(), dims, keep, "sum"), dt);
          Tensor r = empty(out.shape(), DType::f64);
          kernels::sum(out, x, dims, keep, 0.5);
          kernels::ref::sum(r, x.to(DType::f64), dims, keep, 0.5);
          EXPECT_CLOSE_REL(out, r, dt == DType::f32 ? 1e-6 : 1e-14)
              << shape_str(Shape(dims.begin(), dims.end())) << " keepdim " << keep << " strided "
              << strided;
        }
  // the reference on a hand example
  Tensor x = from_doubles({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64);
  Tensor r = empty({3}, DType::f64);
  kernels::ref::sum(r, x, {0}, false);
  EXPECT_EQ(r.to_vector(), (std::vector<double>{5, 7, 9}));
}

TEST(ReduceKernel, LongRowsAndColumns) {
  Tensor x = randn({64, 1000}, DType::f32, 2);
  for (int64_t d : {0, 1}) {
    Tensor out = empty(kernels::reduced_shape(x.shape(), {d}, false, "sum"));
    Tensor r = empty(out.shape(), DType::f64);
    kernels::sum(out, x, {d}, false);
    kernels::ref::sum(r, x, {d}, false);
    EXPECT_CLOSE_REL(out, r, 1e-5) << "dim " << d;
  }
}

TEST(ReduceKernel, Mean) {
  Tensor x = randn({4, 3, 5}, DType::f64, 3);
  Tensor out = empty({3});
  kernels::mean(out, x.to(DType::f32), {0, 2}, false);
  Tensor r = empty({3}, DType::f64);
  kernels::ref::sum(r, x, {0, 2}, false, 1.0 / 20);
  EXPECT_CLOSE_REL(out, r, 1e-6);
  Tensor all = empty({1, 1, 1}, DType::f64);
  kernels::mean(all, x, {}, true);
  double s = 0;
  for (double v : x.to_vector()) s += v;
  EXPECT_NEAR(all.item(), s / 60, 1e-14);
}

TEST(ReduceKernel, SumToBroadcastShape) {
  struct Case {
    Shape out, x;
  };
  std::vector<Case> cases = {{{5}, {3, 4, 5}}, {{4, 1}, {3, 4, 5}}, {{1, 4, 1}, {3, 4, 5}},
                             {{}, {3, 4}},     {{3, 4}, {3, 4}},    {{1}, {7}}};
  for (DType dt : {DType::f32, DType::f64})
    for (const Case& cs : cases) {
      Tensor x = randn(cs.x, dt, 4);
      Tensor o0 = randn(cs.out, dt, 5);
      Tensor o = o0.clone(), r = o0.to(DType::f64);
      kernels::sum_to(o, x, 2.0, 0.5);
      kernels::ref::sum_to(r, x.to(DType::f64), 2.0, 0.5);
      EXPECT_CLOSE_REL(o, r, dt == DType::f32 ? 1e-6 : 1e-14)
          << shape_str(cs.x) << " -> " << shape_str(cs.out);
    }
  // into a strided output (a column of a matrix)
  Tensor base = zeros({5, 2});
  Tensor col = base.select(1, 1);
  Tensor x = randn({3, 5}, DType::f32, 6);
  kernels::sum_to(col, x);
  Tensor r = empty({5}, DType::f64);
  kernels::ref::sum_to(r, x);
  EXPECT_CLOSE_REL(col, r, 1e-6);
  EXPECT_EQ(base.select(1, 0).to_vector(), std::vector<double>(5, 0.0));
}

TEST(ReduceKernel, AmaxWithIndicesTiesAndNaN) {
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t dim : {0, 1, 2, -1})
      for (bool keep : {false, true}) {
        Tensor x = randn({4, 6, 5}, dt, 7);
        Shape s = kernels::reduced_shape(x.shape(), {dim}, keep, "amax");
        Tensor out = empty(s, dt), idx = empty(s, DType::i64);
        Tensor r = empty(s, DType::f64), ridx = empty(s, DType::i64);
        kernels::amax(out, idx, x, dim, keep);
        kernels::ref::amax(r, ridx, x, dim, keep);
        EXPECT_CLOSE_REL(out, r, 0.0);
        EXPECT_BITWISE_EQ(idx, ridx);
      }
  Tensor t = from_doubles({1, 3, 3, 2, std::nan(""), 5}, {2, 3}, DType::f32);
  Tensor out = empty({2}), idx = empty({2}, DType::i64);
  kernels::amax(out, idx, t, 1, false);
  EXPECT_EQ(idx.to_vector(), (std::vector<double>{1, 1}));  // first of the tie; the NaN
  EXPECT_EQ(out.at({0}), 3.0);
  EXPECT_TRUE(std::isnan(out.at({1})));
}

TEST(ReduceKernel, Bf16AccumulatesInF32) {
  Tensor x = randn({8, 300}, DType::bf16, 8);
  Tensor out = empty({8}, DType::bf16), f = empty({8});
  kernels::sum(out, x, {1}, false);
  kernels::sum(f, x.to(DType::f32), {1}, false);
  EXPECT_BITWISE_EQ(out, f.to(DType::bf16));
}

TEST(ReduceKernel, MetaAndErrors) {
  Tensor m = empty({4, 5}, DType::f32, Device::meta);
  kernels::sum(empty({5}, DType::f32, Device::meta), m, {0}, false);
  kernels::amax(empty({4, 1}, DType::f32, Device::meta), Tensor(), m, 1, true);
  EXPECT_THROW(kernels::sum(empty({5}), m, {0}, false), InvalidArgument);
  try {
    kernels::sum_to(empty({3}), empty({4, 5}));
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "[sum_to] cannot sum f32[4,5] down to f32[3]");
  }
  EXPECT_THROW(kernels::sum(empty({4}), empty({4, 5}), {1, -1}, false), ShapeError);
  EXPECT_THROW(kernels::sum(empty({4}), empty({4, 5}), {2}, false), ShapeError);
  EXPECT_THROW(kernels::sum(empty({5}), empty({4, 5}), {1}, false), ShapeError);
  EXPECT_THROW(kernels::amax(empty({4}), Tensor(), empty({4, 0}), 1, false), ShapeError);
}
