// parallel_cross_entropy against nxd::cross_entropy on the full logits: per-token loss, sum and
// mean, ignore_index and label smoothing, loss and gradient; the caller's logits are unchanged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nxd/layers/parallel/cross_entropy.h"
#include "tp_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

constexpr int64_t B = 3, S = 5, V = 32;

void run_ce(int tp, double ls, Reduction red, DType dt = DType::f32, double tol = 1e-5) {
  run_tp(tp, [&](Communicator& g) {
    const int r = g.rank();
    Tensor full = randn({B, S, V}, 1, 3.0).to(dt);
    std::vector<int64_t> tv(B * S);
    for (size_t i = 0; i < tv.size(); ++i) tv[i] = (i * 11 + 5) % V;
    tv[2] = -100;
    tv[9] = 7;
    tv[13] = -100;
    Tensor targets = from_vector<int64_t>(tv, {B, S});
    CrossEntropyOptions co;
    co.label_smoothing = ls;
    co.reduction = red;
    Tensor fl = leaf(full);
    Tensor lr = cross_entropy(fl, targets, co);
    Tensor up = red == Reduction::none ? randn({B, S}, 2).to(dt) : Tensor();
    backward(lr, up);

    Tensor local = leaf(chunk_of(full, -1, r, tp));
    Tensor before = local.detach().clone();
    ParallelCrossEntropyOptions po;
    po.label_smoothing = ls;
    po.reduction = red;
    Tensor loss = parallel_cross_entropy(local, targets, po);
    check_close(loss, lr, tol, "loss");
    backward(loss, up);
    check_close(grad_of(local), chunk_of(fl.grad(), -1, r, tp), tol, "dlogits");
    check_gathered(g, grad_of(local), -1, fl.grad(), tol, "dlogits gathered");
    EXPECT_BITWISE_EQ(local.detach(), before);  // the caller's logits are never modified
  });
}

TEST(ParallelCrossEntropy, MatchesSerialCrossEntropy) {
  for (double ls : {0.0, 0.1, 0.3})
    for (Reduction red : {Reduction::none, Reduction::sum, Reduction::mean})
      for (int tp : kDegrees) {
        SCOPED_TRACE(::testing::Message()
                     << "tp=" << tp << " label_smoothing=" << ls << " reduction=" << int(red));
        run_ce(tp, ls, red);
      }
}

TEST(ParallelCrossEntropy, Bf16AndF64Logits) {
  for (int tp : {2, 4}) {
    run_ce(tp, 0.1, Reduction::none, DType::f64, 1e-12);
    run_ce(tp, 0.1, Reduction::mean, DType::bf16, 2e-2);
  }
}

TEST(ParallelCrossEntropy, BadTargetsThrow) {
  run_tp(2, [&](Communicator&) {
    Tensor logits = randn({2, 8}, 1);
    EXPECT_THAT(
        [&] {
          parallel_cross_entropy(logits, from_vector<int64_t>({1, 16}, {2}));
        },
        ::testing::ThrowsMessage<InvalidArgument>(
            ::testing::HasSubstr("[parallel_cross_entropy] target 16 out of range [0, 16)")));
    EXPECT_THAT(
        [&] {
          parallel_cross_entropy(logits, from_vector<int64_t>({1, 2, 3}, {3}));
        },
        ::testing::ThrowsMessage<ShapeError>(::testing::HasSubstr("do not match logits")));
  });
}

}  // namespace
