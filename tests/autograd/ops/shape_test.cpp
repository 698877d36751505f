#include <gtest/gtest.h>

#include <random>

#include "nxd/autograd/ops.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {

using Fn = std::function<Tensor(const Tensor&)>;

}  // namespace

TEST(ShapeOps, ForwardMatchesRawMethodsAndViewsShareStorage) {
  Tensor x = randn({2, 3, 4}, 1, DType::f32);
  std::vector<std::pair<const char*, std::pair<Tensor, Tensor>>> cases = {
      {"view", {view(x, {6, 4}), x.view({6, 4})}},
      {"transpose", {transpose(x, 0, 2), x.transpose(0, 2)}},
      {"permute", {permute(x, {1, 2, 0}), x.permute({1, 2, 0})}},
      {"narrow", {narrow(x, 2, 1, 2), x.narrow(2, 1, 2)}},
      {"slice", {slice(x, 2, 0, 4, 2), x.slice(2, 0, 4, 2)}},
      {"select", {select(x, 1, 2), x.select(1, 2)}},
      {"expand", {expand(x.narrow(0, 0, 1), {5, 3, 4}), x.narrow(0, 0, 1).expand({5, 3, 4})}},
      {"unsqueeze", {unsqueeze(x, 1), x.unsqueeze(1)}},
      {"squeeze", {squeeze(unsqueeze(x, 1), 1), x}},
      {"flatten", {flatten(x, 1), x.flatten(1)}}};
  for (auto& [name, p] : cases) {
    EXPECT_EQ(p.first.shape(), p.second.shape()) << name;
    EXPECT_EQ(p.first.strides(), p.second.strides()) << name;
    EXPECT_TRUE(p.first.shares_storage(x)) << name;
    EXPECT_BITWISE_EQ(p.first.contiguous(), p.second.contiguous()) << name;
  }
  Tensor r = reshape(transpose(x, 1, 2), {2, 12});  // needs a copy
  EXPECT_FALSE(r.shares_storage(x));
  EXPECT_BITWISE_EQ(r, x.transpose(1, 2).contiguous().view({2, 12}));
  EXPECT_FALSE(clone(x).shares_storage(x));
  EXPECT_TRUE(contiguous(x).shares_storage(x));
  EXPECT_EQ(to(x, DType::f64).dtype(), DType::f64);
}

TEST(ShapeOps, GradcheckViews) {
  const std::vector<std::pair<const char*, Fn>> fns = {
      {"view",
       [](const Tensor& t) {
         return view(t, {6, 4});
       }},
      {"reshape-copy",
       [](const Tensor& t) {
         return reshape(transpose(t, 1, 2), {2, 12});
       }},
      {"transpose", [](const Tensor& t) { return transpose(t, 0, 2); }},
      {"permute",
       [](const Tensor& t) {
         return permute(t, {1, 2, 0});
       }},
      {"narrow", [](const Tensor& t) { return narrow(t, 2, 1, 2); }},
      {"slice", [](const Tensor& t) { return slice(t, 2, 1, 4, 2); }},
      {"select", [](const Tensor& t) { return select(t, 1, -1); }},
      {"expand",
       [](const Tensor& t) {
         return expand(narrow(t, 1, 0, 1), {3, 2, 5, 4});
       }},
      {"squeeze", [](const Tensor& t) { return squeeze(narrow(t, 1, 1, 1), 1); }},
      {"unsqueeze", [](const Tensor& t) { return unsqueeze(t, -1); }},
      {"flatten", [](const Tensor& t) { return flatten(transpose(t, 0, 1)); }},
      {"contiguous", [](const Tensor& t) { return contiguous(transpose(t, 0, 1)); }},
      {"clone", [](const Tensor& t) { return clone(t); }}};
  for (auto& [name, f] : fns)
    check_grad([f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x[0])}; },
               {randn({2, 3, 4}, 2)}, name);
}

TEST(ShapeOps, GradcheckCatStackChunkSplit) {
  check_grad(
      [](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{cat({x[0], transpose(x[1], 0, 1)}, 1), stack({x[0], x[0]}, 0)};
      },
      {randn({3, 2}, 3), randn({4, 3}, 4)}, "cat/stack");
  check_grad(
      [](const std::vector<Tensor>& x) {
        auto c = chunk(x[0], 3, 1);  // sizes 2,2,1
        auto s = split(x[0], {1, 3}, 0);
        return std::vector<Tensor>{mul(c[0], c[1]), s[1]};  // c[2] and s[0] unused
      },
      {randn({4, 5}, 5)}, "chunk/split");
}

TEST(ShapeOps, UnusedPiecesGetZeroGradient) {
  Tensor x = randn({4, 3}, 6).set_requires_grad(true);
  auto parts = chunk(x, 2, 0);
  backward(sum(parts[1]));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1}));
}

TEST(ShapeOps, ToConvertsTheGradientBack) {
  Tensor x = randn({3, 4}, 7).set_requires_grad(true);
  Tensor y = to(x, DType::bf16);
  EXPECT_EQ(y.dtype(), DType::bf16);
  backward(sum(to(mul(y, 2.0), DType::f32)));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_CLOSE_REL(x.grad(), full({3, 4}, 2.0, DType::f64), 0.0);
}

TEST(ShapeOps, NarrowBackwardScattersIntoZeros) {
  Tensor x = randn({2, 5}, 8).set_requires_grad(true);
  backward(sum(slice(x, 1, 1, 5, 2)));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 1, 0, 1, 0, 0, 1, 0, 1, 0}));
}

TEST(ShapeOps, MetaAndErrors) {
  Tensor m = empty({2, 3, 4}, DType::f32, Device::meta).set_requires_grad(true);
  Tensor y = cat({narrow(m, 2, 0, 2), expand(narrow(m, 2, 0, 1), {2, 3, 2})}, 2);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
  backward(y, empty({2, 3, 4}, DType::f32, Device::meta));
  EXPECT_TRUE(m.grad().is_meta());
  EXPECT_THROW(view(transpose(zeros({2, 3}), 0, 1), {6}), ShapeError);
  EXPECT_THROW(narrow(zeros({2, 3}), 1, 2, 2), ShapeError);
  EXPECT_THROW(cat({zeros({2, 3}), zeros({3, 3})}, 1), ShapeError);
  EXPECT_THROW(cat({}, 0), InvalidArgument);
}
