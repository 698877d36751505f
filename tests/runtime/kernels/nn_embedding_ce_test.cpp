#include <gtest/gtest.h>

#include <cmath>

#include "nxd/runtime/init.h"
#include "nxd/runtime/kernels/cross_entropy.h"
#include "nxd/runtime/kernels/embedding.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {
Tensor randn(const Shape& s, DType dt, uint64_t seed, double std = 1.0) {
  return nxd::testing::randn_from(s, dt, {seed, 13}, std);
}
}  // namespace

TEST(NnEmbedding, GatherAndScatterAddMatchReference) {
  for (DType idt : {DType::i32, DType::i64}) {
    for (DType dt : {DType::f32, DType::f64}) {
      Tensor w = randn({10, 6}, dt, 1);
      Tensor ids = from_doubles({3, 0, 9, 3, 3, 7}, {2, 3}, idt);
      Tensor y = empty({2, 3, 6}, dt), r = empty({2, 3, 6}, dt);
      k::embedding_forward(y, ids, w);
      k::ref::embedding_forward(r, ids, w);
      EXPECT_BITWISE_EQ(y, r);
      EXPECT_EQ(y.at({1, 0, 2}), w.at({3, 2}));
      Tensor dy = randn({2, 3, 6}, dt, 2), dw = zeros({10, 6}, dt), dwr = zeros({10, 6}, dt);
      k::embedding_backward(dw, dy, ids);
      k::ref::embedding_backward(dwr, dy, ids);
      EXPECT_CLOSE_REL(dw, dwr, 1e-6);
      // id 3 appears three times: its row is the sum
      EXPECT_NEAR(dw.at({3, 1}), dy.at({0, 0, 1}) + dy.at({1, 0, 1}) + dy.at({1, 1, 1}), 1e-5);
      EXPECT_EQ(dw.at({5, 0}), 0.0);
    }
  }
}

TEST(NnEmbedding, BadIdNamesIdAndVocab) {
  Tensor w = zeros({10, 4}), y = empty({3, 4});
  for (double bad : {10.0, -1.0}) {
    Tensor ids = from_doubles({1, bad, 2}, {3}, DType::i64);
    try {
      k::embedding_forward(y, ids, w);
      FAIL();
    } catch (const InvalidArgument& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("id " + std::to_string(int(bad)) + " at position 1"), std::string::npos)
          << m;
      EXPECT_NE(m.find("[0, 10)"), std::string::npos) << m;
    }
  }
  EXPECT_THROW(k::embedding_forward(y, zeros({3}), w), InvalidArgument);  // float ids
}

// Double-precision hand computation of PyTorch's formula.
static double ce_row(const std::vector<double>& x, int64_t t, double ls) {
  double mx = -INFINITY, s = 0, sum_neg_logp = 0;
  for (double v : x) mx = std::max(mx, v);
  for (double v : x) s += std::exp(v - mx);
  double lse = mx + std::log(s);
  for (double v : x) sum_neg_logp += lse - v;
  return (1 - ls) * (lse - x[t]) + ls * sum_neg_logp / x.size();
}

TEST(NnCrossEntropy, IgnoreIndexAndSmoothingMatchHandFormula) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (double ls : {0.0, 0.1}) {
      Tensor logits = randn({5, 7}, dt, 3, 3.0);
      Tensor before = logits.clone();
      Tensor tg = from_doubles({2, -100, 6, 0, -100}, {5}, DType::i64);
      Tensor loss = empty({5}, dt), lse = empty({5}, dt), lr = empty({5}, dt),
             lser = empty({5}, dt);
      int64_t count = k::cross_entropy_forward(loss, lse, logits, tg, -100, ls);
      EXPECT_EQ(count, 3);
      EXPECT_EQ(k::ref::cross_entropy_forward(lr, lser, logits, tg, -100, ls), 3);
      double tl = dt == DType::f64 ? 1e-13 : 2e-6;
      EXPECT_CLOSE_REL(loss, lr, tl);
      for (int64_t i = 0; i < 5; ++i) {
        int64_t t = int64_t(tg.at({i}));
        std::vector<double> row;
        for (int64_t j = 0; j < 7; ++j) row.push_back(logits.at({i, j}));
        double expect = t == -100 ? 0.0 : ce_row(row, t, ls);
        EXPECT_NEAR(loss.at({i}), expect, tl * 10) << "row " << i;
      }
      Tensor g = full({5}, 1.0 / 3, dt), dl = empty_like(logits), dlr = empty_like(logits);
      k::cross_entropy_backward(dl, g, logits, lse, tg, -100, ls);
      k::ref::cross_entropy_backward(dlr, g, logits, lse, tg, -100, ls);
      EXPECT_CLOSE_REL(dl, dlr, tl);
      EXPECT_EQ(dl.at({1, 3}), 0.0);  // ignored row
      // each non-ignored gradient row sums to 0 (softmax and smoothing both sum to 1)
      double rs = 0;
      for (int64_t j = 0; j < 7; ++j) rs += dl.at({2, j});
      EXPECT_NEAR(rs, 0.0, 1e-6);
      EXPECT_BITWISE_EQ(logits, before);  // never modified
    }
  }
}

TEST(NnCrossEntropy, BadTargetAndShapesThrow) {
  Tensor logits = zeros({2, 4}), loss = empty({2}), lse = empty({2});
  try {
    k::cross_entropy_forward(loss, lse, logits, from_doubles({1, 4}, {2}, DType::i32), -100, 0);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("target 4 at row 1 is outside [0, 4)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(k::cross_entropy_forward(loss, lse, logits, zeros({3}, DType::i64), -100, 0),
               ShapeError);
  Tensor ml = empty({2, 4}, DType::f32, Device::meta), mo = empty({2}, DType::f32, Device::meta);
  EXPECT_EQ(k::cross_entropy_forward(mo, mo, ml, empty({2}, DType::i64, Device::meta), -100, 0), 2);
}
