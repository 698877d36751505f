#include <gtest/gtest.h>

#include "nxd/autograd/ops.h"
#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/activation.h"
#include "nxd/runtime/kernels/embedding.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using autograd::gradcheck;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {}  // namespace

TEST(NnOpsActivation, ForwardMatchesReference) {
  Tensor x = randn({4, 7}, 1, DType::f32, 2.0), u = randn({4, 7}, 2, DType::f32);
  Tensor r = empty_like(x);
  kernels::ref::gelu_forward(r, x, true);
  EXPECT_CLOSE_REL(gelu(x), r, 1e-6);
  kernels::ref::gelu_forward(r, x, false);
  EXPECT_CLOSE_REL(gelu(x, GeluApprox::none), r, 1e-6);
  kernels::ref::silu_forward(r, x);
  EXPECT_CLOSE_REL(silu(x), r, 1e-6);
  kernels::ref::swiglu_forward(r, x, u);
  EXPECT_CLOSE_REL(swiglu(x, u), r, 1e-6);
  EXPECT_EQ(gelu(x.to(DType::bf16)).dtype(), DType::bf16);
}

TEST(NnOpsActivation, Gradcheck) {
  Tensor x = randn({3, 4}, 3, DType::f64, 2.0), u = randn({3, 4}, 4);
  check_grad([](const auto& in) { return std::vector<Tensor>{gelu(in[0])}; }, {x}, "gelu tanh");
  check_grad([](const auto& in) { return std::vector<Tensor>{gelu(in[0], GeluApprox::none)}; }, {x},
             "gelu erf");
  check_grad([](const auto& in) { return std::vector<Tensor>{silu(in[0])}; }, {x}, "silu");
  check_grad([](const auto& in) { return std::vector<Tensor>{swiglu(in[0], in[1])}; }, {x, u},
             "swiglu");
  check_grad(
      [](const auto& in) {
        return std::vector<Tensor>{swiglu(transpose(in[0], 0, 1), transpose(in[1], 0, 1))};
      },
      {x, u}, "swiglu of transposes");
  try {
    swiglu(zeros({3, 4}), zeros({4, 3}));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("gate=f32[3,4] up=f32[4,3]"), std::string::npos)
        << e.what();
  }
}

TEST(NnOpsEmbedding, ForwardAndGradcheck) {
  Tensor w = randn({6, 3}, 5);
  Tensor ids = from_doubles({1, 4, 1, 0, 5, 1}, {2, 3}, DType::i32);
  Tensor y = embedding(ids, w.to(DType::f32));
  Tensor r = empty({2, 3, 3});
  kernels::ref::embedding_forward(r, ids, w.to(DType::f32));
  EXPECT_BITWISE_EQ(y, r);
  check_grad([ids](const auto& in) { return std::vector<Tensor>{embedding(ids, in[0])}; }, {w},
             "embedding");
  // repeated id 1: its gradient row is the sum of three output rows
  Tensor wl = w.clone().set_requires_grad(true);
  Tensor out = embedding(ids, wl);
  Tensor g = randn({2, 3, 3}, 6);
  backward(out, g);
  EXPECT_NEAR(wl.grad().at({1, 2}), g.at({0, 0, 2}) + g.at({0, 2, 2}) + g.at({1, 2, 2}), 1e-12);
  EXPECT_EQ(wl.grad().at({2, 0}), 0.0);
  // bf16 weights are gathered exactly
  Tensor wb = w.to(DType::bf16);
  EXPECT_BITWISE_EQ(embedding(ids, wb), embedding(ids, wb.to(DType::f32)).to(DType::bf16));
}

TEST(NnOpsEmbedding, BadIdAndMeta) {
  try {
    embedding(from_doubles({0, 7}, {2}, DType::i64), zeros({5, 2}));
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("id 7 at position 1 is outside the vocabulary [0, 5)"),
              std::string::npos)
        << e.what();
  }
  Tensor y = embedding(empty({4, 9}, DType::i64, Device::meta),
                       empty({100, 16}, DType::f32, Device::meta));
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.shape(), (Shape{4, 9, 16}));
}
