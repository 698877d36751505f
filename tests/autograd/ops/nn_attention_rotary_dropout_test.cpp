#include <gtest/gtest.h>

#include <cmath>

#include "nxd/autograd/ops.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/attention.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using autograd::gradcheck;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {}  // namespace

TEST(NnOpsAttention, ForwardMatchesNaiveGqa) {
  for (int64_t hkv : {4, 2, 1}) {
    Tensor q = randn({2, 4, 5, 8}, 1, DType::f32), k = randn({2, hkv, 5, 8}, 2, DType::f32),
           v = randn({2, hkv, 5, 8}, 3, DType::f32);
    Tensor r = empty({2, 4, 5, 8});
    kernels::ref::attention_forward(r, Tensor(), q, k, v, true, 0.0);
    Tensor y = scaled_dot_product_attention(q, k, v);
    EXPECT_EQ(y.shape(), (Shape{2, 4, 5, 8}));
    EXPECT_CLOSE_REL(y, r, 3e-6) << "Hkv=" << hkv;
    // the first query sees only the first key: its output is v[0] of its kv head
    EXPECT_NEAR(y.at({1, 3, 0, 2}), v.at({1, 3 / (4 / hkv), 0, 2}), 1e-6);
  }
}

TEST(NnOpsAttention, GradcheckGqaAndStrided) {
  for (int64_t hkv : {2, 1}) {
    Tensor q = randn({1, 4, 3, 2}, 4), k = randn({1, hkv, 3, 2}, 5), v = randn({1, hkv, 3, 2}, 6);
    check_grad(
        [](const auto& in) {
          return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2])};
        },
        {q, k, v}, "attention Hkv=" + std::to_string(hkv));
  }
  check_grad(
      [](const auto& in) {
        return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], false, 0.7)};
      },
      {randn({2, 2, 3, 2}, 7), randn({2, 1, 3, 2}, 8), randn({2, 1, 3, 2}, 9)},
      "attention non-causal, scale 0.7");
  // [B, S, H, D] projections viewed as [B, H, S, D] (no copies in the kernel)
  check_grad(
      [](const auto& in) {
        return std::vector<Tensor>{scaled_dot_product_attention(
            transpose(in[0], 1, 2), transpose(in[1], 1, 2), transpose(in[2], 1, 2))};
      },
      {randn({1, 3, 4, 2}, 10), randn({1, 3, 2, 2}, 11), randn({1, 3, 2, 2}, 12)},
      "attention of [B,S,H,D] views");
}

TEST(NnOpsAttention, ErrorsAndMeta) {
  try {
    scaled_dot_product_attention(zeros({1, 4, 3, 8}), zeros({1, 3, 3, 8}), zeros({1, 3, 3, 8}));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("kv heads 3 do not divide query heads 4"),
              std::string::npos)
        << e.what();
  }
  Tensor q = empty({2, 8, 128, 64}, DType::bf16, Device::meta),
         k = empty({2, 2, 128, 64}, DType::bf16, Device::meta);
  Tensor y = scaled_dot_product_attention(q, k, k);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.shape(), (Shape{2, 8, 128, 64}));
  EXPECT_EQ(y.dtype(), DType::bf16);
}

TEST(NnOpsRotary, ClosedFormAndGradcheck) {
  // Llama: rotary_dim = D = 4; x at position 3 (offset 1 + index 2), pair (0, 2)
  Tensor x = zeros({1, 1, 3, 4}, DType::f64);
  x.set({0, 0, 2, 0}, 1.5);
  x.set({0, 0, 2, 2}, 0.5);
  RotaryOptions o;
  o.position_offset = 1;
  Tensor y = rotary(x, o);
  double th = 3.0;  // inv_freq[0] = 1
  EXPECT_NEAR(y.at({0, 0, 2, 0}), 1.5 * std::cos(th) - 0.5 * std::sin(th), 1e-15);
  EXPECT_NEAR(y.at({0, 0, 2, 2}), 0.5 * std::cos(th) + 1.5 * std::sin(th), 1e-15);
  // GPT-NeoX partial rotary: rotary_pct 0.5 of D = 8 -> rotary_dim 4, pair (1, 3) rotated by
  // 5 * 10000^(-2/4); features 4..7 pass through
  Tensor z = randn({1, 2, 6, 8}, 13);
  RotaryOptions n;
  n.rotary_dim = 4;
  Tensor yz = rotary(z, n);
  double t2 = 5 * std::pow(10000.0, -0.5);
  EXPECT_NEAR(yz.at({0, 1, 5, 1}),
              z.at({0, 1, 5, 1}) * std::cos(t2) - z.at({0, 1, 5, 3}) * std::sin(t2), 1e-14);
  EXPECT_NEAR(yz.at({0, 1, 5, 3}),
              z.at({0, 1, 5, 3}) * std::cos(t2) + z.at({0, 1, 5, 1}) * std::sin(t2), 1e-14);
  EXPECT_EQ(yz.at({0, 1, 5, 6}), z.at({0, 1, 5, 6}));
  // a [B, S, H, D] view keeps its memory layout (so attention reads it without copies)
  Tensor zs = randn({1, 6, 2, 8}, 18, DType::f32);
  Tensor yl = rotary(zs.transpose(1, 2), n);
  EXPECT_TRUE(yl.transpose(1, 2).is_contiguous());
  EXPECT_BITWISE_EQ(yl.contiguous(), rotary(zs.transpose(1, 2).contiguous(), n));
  check_grad([n](const auto& in) { return std::vector<Tensor>{rotary(in[0], n)}; },
             {randn({1, 2, 3, 8}, 14)}, "rotary partial");
  check_grad([](const auto& in) { return std::vector<Tensor>{rotary(transpose(in[0], 1, 2))}; },
             {randn({2, 3, 2, 4}, 15)}, "rotary of a [B,S,H,D] view");
  // rope_scaling (Llama 3.1's llama3 bands, linear): the backward rotates by the scaled angles
  RotaryOptions l3;
  l3.base = 500.0;
  l3.position_offset = 5;
  l3.scaling = {.kind = RopeScaling::Kind::llama3,
                .factor = 8.0,
                .low_freq_factor = 1.0,
                .high_freq_factor = 4.0,
                .original_max_position_embeddings = 64};
  RotaryOptions lin = l3;
  lin.scaling = {.kind = RopeScaling::Kind::linear, .factor = 2.0};
  for (const RotaryOptions& o : {l3, lin})
    check_grad([o](const auto& in) { return std::vector<Tensor>{rotary(in[0], o)}; },
               {randn({1, 2, 3, 8}, 17)}, "rotary with rope_scaling");
}

TEST(NnOpsDropout, DeterministicScaledAndIdentities) {
  Tensor x = randn({4, 300}, 16, DType::f32);
  RngStream s{99, 3};
  Tensor a = dropout(x, 0.25, true, &s), b = dropout(x, 0.25, true, &s);
  EXPECT_BITWISE_EQ(a, b);
  auto xv = x.to_vector(), av = a.to_vector();
  int64_t dropped = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    if (av[i] == 0.0) {
      ++dropped;
      EXPECT_LT(s.uniform(i), 0.25f);
    } else {
      EXPECT_NEAR(av[i], xv[i] / 0.75, 1e-6 * std::fabs(xv[i]));
    }
  }
  EXPECT_NEAR(dropped / 1200.0, 0.25, 0.05);
  EXPECT_TRUE(dropout(x, 0.0, true, &s).is_same(x));
  EXPECT_TRUE(dropout(x, 0.5, false).is_same(x));
  // the default stream comes from the context's generator: fresh each call
  uint64_t c0 = current_context().rng().counter();
  Tensor d1 = dropout(x, 0.5), d2 = dropout(x, 0.5);
  EXPECT_EQ(current_context().rng().counter(), c0 + 2);
  EXPECT_FALSE(::nxd::testing::bitwise_equal(d1, d2));
  // backward regenerates the same mask: dx = mask / (1 - p) * dy
  Tensor xl = x.clone().set_requires_grad(true);
  Tensor y = dropout(xl, 0.25, true, &s);
  backward(y, ones({4, 300}));
  Tensor expect = dropout(ones({4, 300}), 0.25, true, &s);
  EXPECT_BITWISE_EQ(xl.grad(), expect);
  check_grad([s](const auto& in) { return std::vector<Tensor>{dropout(in[0], 0.4, true, &s)}; },
             {randn({3, 7}, 17)}, "dropout");
}
