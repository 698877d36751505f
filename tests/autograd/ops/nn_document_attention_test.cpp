// document_attention (causal attention within packed documents) and rotary_at_positions: the
// packed result equals each document run alone (values and gradients), gradcheck in f64, the two
// backward schedules agree bitwise, and bad positions are refused naming the entry.
#include <gtest/gtest.h>

#include <cstdio>

#include "nxd/autograd/ops.h"
#include "nxd/runtime/kernels/flash_attention.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {

// Positions [B, S] of rows packed with documents of the given lengths (each row the same).
Tensor positions_of(const std::vector<int64_t>& lengths, int64_t batch) {
  std::vector<int64_t> p;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t n : lengths)
      for (int64_t i = 0; i < n; ++i) p.push_back(i);
  int64_t s = 0;
  for (int64_t n : lengths) s += n;
  return from_vector(p, {batch, s});
}

struct Result {
  Tensor y, dq, dk, dv;
};

// Packed: document_attention over the whole rows. Alone: every document through causal sdpa on
// its own, concatenated. Gradients of sum(y * g).
Result run(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& g,
           const std::vector<int64_t>& lengths, bool packed) {
  Tensor q = q0.clone(), k = k0.clone(), v = v0.clone();
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  Tensor y;
  if (packed) {
    y = document_attention(q, k, v, positions_of(lengths, q.size(0)));
  } else {
    std::vector<Tensor> parts;
    int64_t s0 = 0;
    for (int64_t n : lengths) {
      parts.push_back(scaled_dot_product_attention(narrow(q, 2, s0, n), narrow(k, 2, s0, n),
                                                   narrow(v, 2, s0, n)));
      s0 += n;
    }
    y = cat(parts, 2);
  }
  backward(sum(mul(y, g)));
  return {y.detach(), q.grad(), k.grad(), v.grad()};
}

}  // namespace

TEST(NnOpsDocumentAttention, PackedEqualsEachDocumentAlone) {
  // documents across the 64-row blocks, one of a single token, GQA 2
  for (auto lengths :
       std::vector<std::vector<int64_t>>{{5}, {3, 4}, {50, 1, 79}, {64, 64, 2}, {10, 100, 20, 7}}) {
    int64_t s = 0;
    for (int64_t n : lengths) s += n;
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(str("S=", s, " docs=", lengths.size(), " ", dtype_name(dt)));
      Tensor q = randn({2, 4, s, 16}, 1, dt), k = randn({2, 2, s, 16}, 2, dt),
             v = randn({2, 2, s, 16}, 3, dt), g = randn({2, 4, s, 16}, 4, dt);
      Result a = run(q, k, v, g, lengths, /*packed=*/true);
      Result b = run(q, k, v, g, lengths, /*packed=*/false);
      const double tol = dt == DType::f64 ? 1e-12 : 1e-5;
      EXPECT_ALLCLOSE(a.y, b.y, 0, tol);
      EXPECT_ALLCLOSE(a.dq, b.dq, 0, tol);
      EXPECT_ALLCLOSE(a.dk, b.dk, 0, tol);
      EXPECT_ALLCLOSE(a.dv, b.dv, 0, tol);
    }
  }
}

TEST(NnOpsDocumentAttention, GradcheckF64) {
  // three documents across the block edge at 64 (70 rows), GQA 2
  const Tensor pos = positions_of({30, 36, 4}, 1);
  check_grad(
      [&](const auto& in) {
        return std::vector<Tensor>{document_attention(in[0], in[1], in[2], pos)};
      },
      {randn({1, 2, 70, 3}, 5, DType::f64, 0.5), randn({1, 1, 70, 3}, 6, DType::f64, 0.5),
       randn({1, 1, 70, 3}, 7)},
      "document attention, 70 rows, 3 documents, GQA 2");
  // two rows packed differently, scale 0.7
  const Tensor pos2 = from_vector<int64_t>({0, 1, 2, 0, 1, 0, 0, 1, 0, 1, 2, 3}, {2, 6});
  check_grad(
      [&](const auto& in) {
        return std::vector<Tensor>{document_attention(in[0], in[1], in[2], pos2, 0.7)};
      },
      {randn({2, 2, 6, 2}, 8), randn({2, 2, 6, 2}, 9), randn({2, 2, 6, 2}, 10)},
      "document attention, two rows, scale 0.7");
}

TEST(NnOpsDocumentAttention, NoTokenSeesAnotherDocument) {
  // changing the keys and values of document 0 leaves document 1's outputs bitwise unchanged
  const Tensor pos = positions_of({40, 40}, 1);
  Tensor q = randn({1, 2, 80, 8}, 1), k = randn({1, 2, 80, 8}, 2), v = randn({1, 2, 80, 8}, 3);
  Tensor k2 = k.clone(), v2 = v.clone();
  k2.narrow(2, 0, 40).copy_(randn({1, 2, 40, 8}, 4));
  v2.narrow(2, 0, 40).copy_(randn({1, 2, 40, 8}, 5));
  Tensor a = document_attention(q, k, v, pos), b = document_attention(q, k2, v2, pos);
  EXPECT_BITWISE_EQ(a.narrow(2, 40, 40).contiguous(), b.narrow(2, 40, 40).contiguous());
}

TEST(NnOpsDocumentAttention, BackwardSchedulesAgreeBitwise) {
  const std::vector<int64_t> lengths{70, 3, 100, 27};
  Tensor q = randn({1, 4, 200, 16}, 1, DType::f32), k = randn({1, 2, 200, 16}, 2, DType::f32),
         v = randn({1, 2, 200, 16}, 3, DType::f32), g = randn({1, 4, 200, 16}, 4, DType::f32);
  Result one = run(q, k, v, g, lengths, true);
  kernels::set_flash_backward_schedule(kernels::FlashBackwardSchedule::two_pass);
  Result two = run(q, k, v, g, lengths, true);
  kernels::set_flash_backward_schedule(kernels::FlashBackwardSchedule::one_pass);
  EXPECT_BITWISE_EQ(one.dq, two.dq);
  EXPECT_BITWISE_EQ(one.dk, two.dk);
  EXPECT_BITWISE_EQ(one.dv, two.dv);
}

TEST(NnOpsDocumentAttention, BadPositionsNameTheEntry) {
  Tensor q = randn({1, 1, 4, 2}, 1);
  try {
    document_attention(q, q, q, from_vector<int64_t>({0, 1, 3, 4}, {1, 4}));
    FAIL() << "positions 0 1 3 4 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("positions[0, 2] = 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(document_attention(q, q, q, from_vector<int64_t>({0, 1, 2}, {1, 3})), ShapeError);
}

TEST(NnOpsRotaryAtPositions, EqualsEachDocumentAloneAndGradchecks) {
  const std::vector<int64_t> lengths{3, 7, 1, 5};
  const Tensor pos = positions_of(lengths, 2);
  RotaryOptions ro{.rotary_dim = 4, .base = 500.0};
  Tensor x = randn({2, 3, 16, 6}, 1);
  Tensor packed = rotary_at_positions(x, pos, ro);
  int64_t s0 = 0;
  for (int64_t n : lengths) {
    Tensor alone = rotary(x.narrow(2, s0, n).contiguous(), ro);
    EXPECT_BITWISE_EQ(packed.narrow(2, s0, n).contiguous(), alone);
    s0 += n;
  }
  check_grad(
      [&](const auto& in) { return std::vector<Tensor>{rotary_at_positions(in[0], pos, ro)}; },
      {randn({2, 3, 16, 6}, 2)}, "rotary at per-document positions");
}
