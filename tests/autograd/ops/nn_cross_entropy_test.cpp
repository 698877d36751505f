#include <gtest/gtest.h>

#include <cmath>

#include "nxd/autograd/ops.h"
#include "nxd/runtime/init.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
using autograd::gradcheck;
using nxd::testing::check_grad;
using nxd::testing::randn;

namespace {

// PyTorch's F.cross_entropy(logits, t, ignore_index, label_smoothing, reduction), by hand in
// double: per row (1-ls)*(-logp[t]) + ls*mean_v(-logp[v]); mean over non-ignored rows.
double torch_ce(const Tensor& logits, const std::vector<int64_t>& t, int64_t ignore, double ls,
                Reduction red, std::vector<double>* per_row = nullptr) {
  int64_t n = logits.size(0), v = logits.size(1), count = 0;
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    double row = 0;
    if (t[i] != ignore) {
      double mx = -INFINITY, s = 0;
      for (int64_t j = 0; j < v; ++j) mx = std::max(mx, logits.at({i, j}));
      for (int64_t j = 0; j < v; ++j) s += std::exp(logits.at({i, j}) - mx);
      double lse = mx + std::log(s), smooth = 0;
      for (int64_t j = 0; j < v; ++j) smooth += lse - logits.at({i, j});
      row = (1 - ls) * (lse - logits.at({i, t[i]})) + ls * smooth / v;
      ++count;
    }
    if (per_row) per_row->push_back(row);
    total += row;
  }
  return red == Reduction::mean ? total / count : total;
}
}  // namespace

TEST(NnOpsCrossEntropy, MatchesTorchFormulaAndLeavesLogits) {
  std::vector<int64_t> tv = {3, -100, 0, 6, 6, -100, 2};
  Tensor tg = from_vector<int64_t>(tv, {7});
  for (DType dt : {DType::f32, DType::f64}) {
    for (double ls : {0.0, 0.1, 0.3}) {
      Tensor logits = randn({7, 9}, 1, dt, 2.5), before = logits.clone();
      double tol = dt == DType::f64 ? 1e-13 : 2e-6;
      for (Reduction red : {Reduction::mean, Reduction::sum}) {
        CrossEntropyOptions o;
        o.label_smoothing = ls;
        o.reduction = red;
        Tensor l = cross_entropy(logits, tg, o);
        ASSERT_EQ(l.dim(), 0);
        EXPECT_NEAR(l.item(), torch_ce(logits, tv, -100, ls, red), tol * 10) << ls;
      }
      CrossEntropyOptions o;
      o.label_smoothing = ls;
      o.reduction = Reduction::none;
      std::vector<double> rows;
      torch_ce(logits, tv, -100, ls, Reduction::sum, &rows);
      EXPECT_CLOSE_REL(cross_entropy(logits, tg, o), from_doubles(rows, {7}, DType::f64), tol);
      EXPECT_BITWISE_EQ(logits, before);
    }
  }
  // a custom ignore_index, i32 targets and [B, S, V] logits
  CrossEntropyOptions o;
  o.ignore_index = 5;
  Tensor logits = randn({2, 3, 6}, 2);
  Tensor t32 = from_doubles({5, 1, 2, 5, 0, 4}, {2, 3}, DType::i32);
  EXPECT_NEAR(cross_entropy(logits, t32, o).item(),
              torch_ce(logits.reshape({6, 6}), {5, 1, 2, 5, 0, 4}, 5, 0.0, Reduction::mean), 1e-13);
}

TEST(NnOpsCrossEntropy, GradcheckWithIgnoreAndSmoothing) {
  Tensor tg = from_doubles({2, -100, 0, 4}, {4}, DType::i64);
  for (Reduction red : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (double ls : {0.0, 0.2}) {
      CrossEntropyOptions o;
      o.label_smoothing = ls;
      o.reduction = red;
      auto r = gradcheck(
          [&](const auto& in) { return std::vector<Tensor>{cross_entropy(in[0], tg, o)}; },
          {randn({4, 5}, 3)});
      EXPECT_TRUE(r.ok) << "reduction " << int(red) << " ls " << ls << ": " << r.message;
    }
  }
  // the ignored row gets exactly zero gradient; the logits leaf is not modified by backward
  Tensor x = randn({4, 5}, 4).set_requires_grad(true);
  Tensor before = x.detach().clone();
  backward(cross_entropy(x, tg));
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(x.grad().at({1, j}), 0.0);
  EXPECT_BITWISE_EQ(x.detach(), before);
  // non-contiguous logits
  auto r = gradcheck(
      [&](const auto& in) {
        return std::vector<Tensor>{cross_entropy(transpose(in[0], 0, 1), tg)};
      },
      {randn({5, 4}, 5)});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST(NnOpsCrossEntropy, AllIgnoredIsNanLikeTorchAndErrors) {
  Tensor l = cross_entropy(zeros({2, 3}), from_doubles({-100, -100}, {2}, DType::i64));
  EXPECT_TRUE(std::isnan(l.item()));
  try {
    cross_entropy(zeros({4, 3}), zeros({3}, DType::i64));
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("targets i64[3] do not match logits f32[4,3]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(cross_entropy(zeros({2, 3}), from_doubles({0, 3}, {2}, DType::i64)),
               InvalidArgument);
  Tensor m =
      cross_entropy(empty({8, 50}, DType::f32, Device::meta), empty({8}, DType::i64, Device::meta));
  EXPECT_TRUE(m.is_meta());
  EXPECT_EQ(m.dim(), 0);
  // bf16 logits give an f32 loss (the logits are upcast, as Hugging Face does) and bf16 gradients
  Tensor lb = randn({3, 4}, 6, DType::bf16).set_requires_grad(true);
  Tensor lossb = cross_entropy(lb, from_doubles({0, 1, 2}, {3}, DType::i32));
  EXPECT_EQ(lossb.dtype(), DType::f32);
  EXPECT_EQ(
      lossb.item(),
      cross_entropy(lb.detach().to(DType::f32), from_doubles({0, 1, 2}, {3}, DType::i32)).item());
  backward(lossb);
  EXPECT_EQ(lb.grad().dtype(), DType::bf16);
}
