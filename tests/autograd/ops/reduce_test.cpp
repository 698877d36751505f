#include <gtest/gtest.h>

#include <random>

#include "nxd/autograd/ops.h"
#include "nxd/runtime/kernels/reduce.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {}  // namespace

TEST(ReduceOps, ForwardMatchesReference) {
  Tensor x = randn({3, 4, 5}, 1, DType::f32);
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}, {0, 2}})
    for (bool keep : {false, true}) {
      Tensor s = sum(x, dims, keep), m = mean(x, dims, keep);
      Tensor r = empty(s.shape(), DType::f64);
      kernels::ref::sum(r, x, dims, keep);
      EXPECT_CLOSE_REL(s, r, 1e-6);
      const double n =
          static_cast<double>(x.numel()) / static_cast<double>(std::max<int64_t>(s.numel(), 1));
      kernels::ref::sum(r, x, dims, keep, 1.0 / n);
      EXPECT_CLOSE_REL(m, r, 1e-6);
    }
  Tensor a = amax(x, 1);
  Tensor r = empty({3, 5}, DType::f64);
  kernels::ref::amax(r, Tensor(), x, 1, false);
  EXPECT_CLOSE_REL(a, r, 0.0);
  EXPECT_EQ(sum_to(x, {4, 1}).shape(), (Shape{4, 1}));
}

TEST(ReduceOps, Gradcheck) {
  std::vector<std::vector<int64_t>> dimsets = {{}, {1}, {0, 2}, {-1}};
  for (const auto& dims : dimsets)
    for (bool keep : {false, true}) {
      check_grad(
          [&](const std::vector<Tensor>& x) {
            Tensor p = permute(x[0], {2, 0, 1});  // non-contiguous input
            return std::vector<Tensor>{sum(p, dims, keep), mean(p, dims, keep)};
          },
          {randn({3, 4, 5}, 2)}, str("dims ", dims.size(), " keepdim ", keep));
    }
  for (int64_t d : {0, 1, -1})
    for (bool keep : {false, true})
      check_grad(
          [&](const std::vector<Tensor>& x) {
            return std::vector<Tensor>{amax(transpose(x[0], 0, 2), d, keep)};
          },
          {randn({3, 4, 5}, 3)}, str("amax dim ", d));
  check_grad(
      [](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{sum_to(x[0], {4, 1}), sum_to(x[0], {5}), sum_to(x[0], {})};
      },
      {randn({3, 4, 5}, 4)}, "sum_to");
}

TEST(ReduceOps, AmaxGradientGoesToFirstMax) {
  Tensor x = from_doubles({1, 3, 3, 2, 5, 5, 5, 0}, {2, 4}, DType::f64).set_requires_grad(true);
  backward(sum(amax(x, 1)));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 1, 0, 0, 1, 0, 0, 0}));
}

TEST(ReduceOps, MeanOfLargeTensorBackward) {
  Tensor x = randn({64, 33}, 5, DType::f32).set_requires_grad(true);
  backward(mean(x));
  EXPECT_CLOSE_REL(x.grad(), full({64, 33}, 1.0 / (64 * 33), DType::f64), 1e-7);
}

TEST(ReduceOps, MetaAndErrors) {
  Tensor m = empty({4, 5, 6}, DType::bf16, Device::meta).set_requires_grad(true);
  Tensor s = sum(m, {1});
  EXPECT_TRUE(s.is_meta());
  EXPECT_EQ(s.shape(), (Shape{4, 6}));
  EXPECT_EQ(mean(m, {0, 2}, true).shape(), (Shape{1, 5, 1}));
  EXPECT_EQ(amax(m, -1).shape(), (Shape{4, 5}));
  backward(s, empty({4, 6}, DType::bf16, Device::meta));
  EXPECT_TRUE(m.grad().is_meta());
  EXPECT_EQ(m.grad().shape(), (Shape{4, 5, 6}));
  try {
    sum(zeros({2, 3}), {2});
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "[sum] dim 2 out of range for a 2-d tensor");
  }
  EXPECT_THROW(sum_to(zeros({2, 3}), {4}), ShapeError);
  EXPECT_THROW(mean(arange(4)), InvalidArgument);
}
