#include <gtest/gtest.h>

#include <random>

#include "nxd/autograd/ops.h"
#include "nxd/runtime/kernels/matmul.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {

// torch.matmul through the batched reference: 1-D operands unsqueezed and squeezed back.
Tensor ref_matmul(const Tensor& a, const Tensor& b) {
  Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  Shape f = broadcast_shapes(Shape(a2.shape().begin(), a2.shape().end() - 2),
                             Shape(b2.shape().begin(), b2.shape().end() - 2), "ref");
  f.push_back(a2.size(-2));
  f.push_back(b2.size(-1));
  Tensor c = empty(f, DType::f64);
  kernels::ref::bmm(c, a2, b2);
  return c.reshape(kernels::matmul_shape(a.shape(), b.shape()));
}

const std::vector<std::pair<Shape, Shape>> kShapes = {
    {{3, 4}, {4, 5}}, {{2, 3, 4}, {4, 5}},       {{4}, {4, 5}},    {{3, 4}, {4}},
    {{4}, {4}},       {{2, 1, 3, 4}, {3, 4, 2}}, {{4}, {2, 4, 3}}, {{2, 3, 4}, {4}}};

}  // namespace

TEST(MatmulOps, ForwardMatchesReference) {
  for (const auto& [sa, sb] : kShapes) {
    Tensor a = randn(sa, 1, DType::f32), b = randn(sb, 2, DType::f32);
    Tensor y = matmul(a, b);
    EXPECT_EQ(y.shape(), kernels::matmul_shape(sa, sb));
    EXPECT_CLOSE_REL(y, ref_matmul(a, b), 1e-5) << shape_str(sa) << " @ " << shape_str(sb);
  }
}

TEST(MatmulOps, Gradcheck) {
  for (const auto& [sa, sb] : kShapes)
    check_grad([](const std::vector<Tensor>& x) { return std::vector<Tensor>{matmul(x[0], x[1])}; },
               {randn(sa, 3), randn(sb, 4)}, shape_str(sa) + " @ " + shape_str(sb));
  // transposed and sliced operands go to BLAS as views
  check_grad(
      [](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{matmul(transpose(x[0], 0, 1), narrow(x[1], 1, 1, 3)),
                                   matmul(transpose(x[1], -1, -2), x[0])};
      },
      {randn({4, 3}, 5), randn({4, 5}, 6)}, "views");
}

TEST(MatmulOps, LinearMatchesReferenceAndGradcheck) {
  Tensor x = randn({2, 3, 4}, 7, DType::f32), w = randn({5, 4}, 8, DType::f32),
         b = randn({5}, 9, DType::f32);
  Tensor y = linear(x, w, b);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
  Tensor want = ref_matmul(x, w.t());
  std::vector<double> wv = want.to_vector(), bv = b.to_vector();
  for (size_t i = 0; i < wv.size(); ++i) wv[i] += bv[i % 5];
  EXPECT_CLOSE_REL(y, from_doubles(wv, {2, 3, 5}, DType::f64), 1e-5);
  EXPECT_CLOSE_REL(linear(x, w), want, 1e-5);
  EXPECT_EQ(linear(randn({4}, 1, DType::f32), w).shape(), (Shape{5}));

  check_grad(
      [](const std::vector<Tensor>& t) { return std::vector<Tensor>{linear(t[0], t[1], t[2])}; },
      {randn({2, 3, 4}, 10), randn({5, 4}, 11), randn({5}, 12)}, "linear 3-D");
  check_grad([](const std::vector<Tensor>& t) { return std::vector<Tensor>{linear(t[0], t[1])}; },
             {randn({4}, 13), randn({5, 4}, 14)}, "linear 1-D");
  check_grad(
      [](const std::vector<Tensor>& t) {
        // a permuted (non-foldable) x and a transposed weight view
        return std::vector<Tensor>{linear(transpose(t[0], 0, 1), transpose(t[1], 0, 1), t[2])};
      },
      {randn({3, 2, 4}, 15), randn({4, 5}, 16), randn({5}, 17)}, "linear views");
}

TEST(MatmulOps, LinearDoesNotCopyTheWeight) {
  Tensor x = randn({64, 32}, 1, DType::f32), w = randn({48, 32}, 2, DType::f32);
  MemoryCounter& host = device_memory(Device::host);
  const int64_t live = host.live();
  host.reset_peak();
  Tensor y = linear(x, w);
  EXPECT_EQ(host.peak(), live + 64 * 48 * 4) << "linear allocated more than its output";
  // backward: dx, dw and nothing else besides the seed
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor y2 = linear(x, w);
  Tensor seed = ones({64, 48});
  const int64_t before = host.live();
  host.reset_peak();
  backward(y2, seed);
  EXPECT_LE(host.peak(), before + (64 * 32 + 48 * 32) * 4);
  Tensor rdw = empty({48, 32}, DType::f64), rdx = empty({64, 32}, DType::f64);
  kernels::ref::gemm(rdw, seed.t(), x.detach());
  kernels::ref::gemm(rdx, seed, w.detach());
  EXPECT_CLOSE_REL(w.grad(), rdw, 1e-5);
  EXPECT_CLOSE_REL(x.grad(), rdx, 1e-5);
}

TEST(MatmulOps, MetaShapes) {
  Tensor x = empty({8, 512, 768}, DType::bf16, Device::meta).set_requires_grad(true);
  Tensor w = empty({2304, 768}, DType::bf16, Device::meta).set_requires_grad(true);
  Tensor y = linear(x, w, empty({2304}, DType::bf16, Device::meta));
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.shape(), (Shape{8, 512, 2304}));
  Tensor z = matmul(y, w);
  EXPECT_EQ(z.shape(), (Shape{8, 512, 768}));
  backward(z, empty({8, 512, 768}, DType::bf16, Device::meta));
  EXPECT_TRUE(w.grad().is_meta());
  EXPECT_EQ(w.grad().shape(), (Shape{2304, 768}));
}

TEST(MatmulOps, Errors) {
  try {
    matmul(zeros({8, 64}), zeros({32, 16}));
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "[matmul] inner dims differ: a=f32[8,64] b=f32[32,16]");
  }
  try {
    linear(zeros({3, 4}), zeros({5, 6}));
    FAIL() << "no throw";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(),
                 "[linear] x f32[3,4] does not match weight f32[5,6] (expected x[..., "
                 "in] and w[out, in])");
  }
  EXPECT_THROW(linear(zeros({3, 4}), zeros({5, 4}), zeros({4})), ShapeError);
  EXPECT_THROW(matmul(zeros({3, 4}), zeros({4, 5}, DType::f64)), InvalidArgument);
  EXPECT_THROW(matmul(zeros({2, 3, 4}), zeros({3, 4, 5})), ShapeError);
}
