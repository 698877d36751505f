#include <gtest/gtest.h>

#include <cmath>

#include "nxd/autograd/ops.h"
#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/norm.h"
#include "nxd/runtime/kernels/softmax.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using autograd::gradcheck;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {}  // namespace

TEST(NnOpsSoftmax, ForwardMatchesReferenceAnyDim) {
  Tensor x = randn({3, 4, 5}, 1, DType::f32, 2.0);
  Tensor r = empty({3, 4, 5}, DType::f32);
  kernels::ref::softmax_forward(r, x, 1.0, false);
  EXPECT_CLOSE_REL(softmax(x), r, 2e-6);
  kernels::ref::log_softmax_forward(r, x);
  EXPECT_CLOSE_REL(log_softmax(x, 2), r, 2e-6);
  // along dim 1: the reference runs on the transposed copy
  Tensor xt = x.transpose(1, 2).contiguous(), rt = empty({3, 5, 4}, DType::f32);
  kernels::ref::softmax_forward(rt, xt, 1.0, false);
  Tensor y = softmax(x, 1);
  EXPECT_EQ(y.shape(), (Shape{3, 4, 5}));
  EXPECT_CLOSE_REL(y, rt.transpose(1, 2).contiguous(), 2e-6);
  // bf16 in, bf16 out, rounded once from the f32 result
  Tensor yb = softmax(x.to(DType::bf16));
  EXPECT_EQ(yb.dtype(), DType::bf16);
  EXPECT_BITWISE_EQ(yb, softmax(x.to(DType::bf16).to(DType::f32)).to(DType::bf16));
}

TEST(NnOpsSoftmax, Gradcheck) {
  Tensor x = randn({3, 5}, 2);
  for (int64_t dim : {-1, 0}) {
    check_grad([dim](const auto& in) { return std::vector<Tensor>{softmax(in[0], dim)}; }, {x},
               "softmax dim " + std::to_string(dim));
    check_grad([dim](const auto& in) { return std::vector<Tensor>{log_softmax(in[0], dim)}; }, {x},
               "log_softmax dim " + std::to_string(dim));
  }
  // non-contiguous input
  check_grad([](const auto& in) { return std::vector<Tensor>{softmax(transpose(in[0], 0, 1))}; },
             {x}, "softmax of a transpose");
}

TEST(NnOpsNorm, LayerNormForwardAndGradcheck) {
  Tensor x = randn({2, 3, 6}, 3, DType::f32, 2.0), w = randn({6}, 4, DType::f32),
         b = randn({6}, 5, DType::f32);
  Tensor r = empty_like(x), m = empty({2, 3}), rs = empty({2, 3});
  kernels::ref::layer_norm_forward(r, m, rs, x, w, b, 1e-5);
  EXPECT_CLOSE_REL(layer_norm(x, w, b, 1e-5), r, 3e-6);
  Tensor x64 = randn({2, 3, 5}, 6), w64 = randn({5}, 7), b64 = randn({5}, 8);
  check_grad([](const auto& in) { return std::vector<Tensor>{layer_norm(in[0], in[1], in[2])}; },
             {x64, w64, b64}, "layer_norm");
  check_grad([](const auto& in) { return std::vector<Tensor>{layer_norm(in[0], {}, {})}; }, {x64},
             "layer_norm without affine");
  check_grad(
      [](const auto& in) {
        return std::vector<Tensor>{layer_norm(transpose(in[0], 0, 2), in[1], in[2])};
      },
      {randn({5, 3, 4}, 9), randn({5}, 10), randn({5}, 11)}, "layer_norm of a transpose");
}

TEST(NnOpsNorm, RmsNormForwardAndGradcheck) {
  Tensor x = randn({4, 8}, 12, DType::f32, 3.0), w = randn({8}, 13, DType::f32);
  Tensor r = empty_like(x), rs = empty({4});
  kernels::ref::rms_norm_forward(r, rs, x, w, 1e-6);
  EXPECT_CLOSE_REL(rms_norm(x, w, 1e-6), r, 3e-6);
  check_grad([](const auto& in) { return std::vector<Tensor>{rms_norm(in[0], in[1], 1e-6)}; },
             {randn({3, 5}, 14), randn({5}, 15)}, "rms_norm");
  check_grad(
      [](const auto& in) { return std::vector<Tensor>{rms_norm(transpose(in[0], 0, 1), in[1])}; },
      {randn({4, 3}, 16), randn({4}, 17)}, "rms_norm of a transpose");
}

TEST(NnOpsNorm, RmsNormBf16RoundsLikeHf) {
  // HF LlamaRMSNorm: weight * (x.float() * rsqrt(mean(x^2) + eps)).to(bf16)
  Tensor x = randn({3, 16}, 18, DType::bf16, 2.0), w = randn({16}, 19, DType::bf16);
  Tensor y = rms_norm(x, w, 1e-6);
  ASSERT_EQ(y.dtype(), DType::bf16);
  auto xv = x.to_vector(), wv = w.to_vector(), yv = y.to_vector();
  for (int r = 0; r < 3; ++r) {
    float ms = 0;
    for (int j = 0; j < 16; ++j) ms += float(xv[r * 16 + j]) * float(xv[r * 16 + j]);
    float rs = 1.0f / std::sqrt(ms / 16 + 1e-6f);
    for (int j = 0; j < 16; ++j) {
      float n = float(bf16(float(xv[r * 16 + j]) * rs));
      float e = float(bf16(n * float(wv[j])));
      // the f32 row statistic may differ in its last bit from this scalar sum
      EXPECT_NEAR(yv[r * 16 + j], e, std::fabs(e) * 1e-2) << r << "," << j;
    }
  }
}

TEST(NnOpsNorm, ErrorsAndMeta) {
  try {
    layer_norm(zeros({2, 8}), zeros({7}), Tensor());
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[layer_norm] weight is f32[7], expected [8]"),
              std::string::npos)
        << e.what();
  }
  Tensor xm = empty({2, 5, 8}, DType::f32, Device::meta), wm = empty({8}, DType::f32, Device::meta);
  Tensor y = layer_norm(xm, wm, wm);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(rms_norm(xm, wm).shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(softmax(xm, 1).shape(), (Shape{2, 5, 8}));
}
