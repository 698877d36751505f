// The TP/SP mappings: forward and backward of each against the full-tensor definition, for
// TP in {1,2,4,8}; bf16 reductions exact in f32; divisibility errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nxd/layers/parallel/mappings.h"
#include "tp_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

const Shape kShape{2, 8, 16};  // [B, S, H]; S and H divide by 8

// sum over ranks r of randn(shape, base + r)
Tensor sum_over_ranks(const Shape& s, uint64_t base, int tp) {
  Tensor acc = zeros(s);
  for (int r = 0; r < tp; ++r) acc = add(acc, randn(s, base + r));
  return acc;
}

TEST(Mappings, CopyToAndReduceFrom) {
  for (int tp : kDegrees) {
    run_tp(tp, [&](Communicator& g) {
      const int r = g.rank();
      // copy_to: identity forward, backward sums every rank's upstream gradient.
      Tensor x = leaf(randn(kShape, 1));
      Tensor y = copy_to_tensor_model_parallel_region(x);
      check_close(y, x, 0, "copy_to forward");
      backward(sum(mul(y, randn(kShape, 100 + r))));
      check_close(grad_of(x), sum_over_ranks(kShape, 100, tp), 1e-6, "copy_to backward");
      // reduce_from: all-reduce forward, identity backward.
      Tensor xr = leaf(randn(kShape, 200 + r));
      Tensor z = reduce_from_tensor_model_parallel_region(xr);
      check_close(z, sum_over_ranks(kShape, 200, tp), 1e-6, "reduce_from forward");
      Tensor up = randn(kShape, 300);
      backward(sum(mul(z, up)));
      check_close(grad_of(xr), up, 0, "reduce_from backward");
    });
  }
}

TEST(Mappings, ScatterGatherLastDim) {
  for (int tp : kDegrees) {
    run_tp(tp, [&](Communicator& g) {
      const int r = g.rank();
      Tensor full = randn(kShape, 2);
      Tensor x = leaf(full);
      Tensor s = scatter_to_tensor_model_parallel_region(x);
      check_close(s, chunk_of(full, -1, r, tp), 0, "scatter_to forward");
      // Each rank's gradient lands in its chunk: the all-gather assembles them.
      Tensor up_full = randn(kShape, 3);
      backward(sum(mul(s, chunk_of(up_full, -1, r, tp))));
      check_close(grad_of(x), up_full, 0, "scatter_to backward");

      Tensor xl = leaf(chunk_of(full, -1, r, tp));
      Tensor ga = gather_from_tensor_model_parallel_region(xl);
      check_close(ga, full, 0, "gather_from forward");
      backward(sum(mul(ga, up_full)));
      check_close(grad_of(xl), chunk_of(up_full, -1, r, tp), 0, "gather_from backward");
    });
  }
}

TEST(Mappings, SequenceParallelRegions) {
  for (int tp : kDegrees) {
    run_tp(tp, [&](Communicator& g) {
      const int r = g.rank();
      const int64_t sd = 1;
      Tensor full = randn(kShape, 4);
      Tensor up_full = randn(kShape, 5);
      // scatter_to_sequence: own chunk / all-gather.
      Tensor x = leaf(full);
      Tensor s = scatter_to_sequence_parallel_region(x, sd);
      check_close(s, chunk_of(full, sd, r, tp), 0, "scatter_to_sequence forward");
      backward(sum(mul(s, chunk_of(up_full, sd, r, tp))));
      check_close(grad_of(x), up_full, 0, "scatter_to_sequence backward");
      // gather_from_sequence (to_model_parallel): all-gather / reduce-scatter.
      Tensor xl = leaf(chunk_of(full, sd, r, tp));
      Tensor ga = gather_from_sequence_parallel_region(xl, sd);
      check_close(ga, full, 0, "gather_from_sequence forward");
      backward(sum(mul(ga, randn(kShape, 500 + r))));
      check_close(grad_of(xl), chunk_of(sum_over_ranks(kShape, 500, tp), sd, r, tp), 1e-6,
                  "gather_from_sequence backward (reduce-scatter)");
      // gather_from_sequence (!to_model_parallel): all-gather / own chunk.
      Tensor xl2 = leaf(chunk_of(full, sd, r, tp));
      Tensor ga2 = gather_from_sequence_parallel_region(xl2, sd, false);
      backward(sum(mul(ga2, up_full)));
      check_close(grad_of(xl2), chunk_of(up_full, sd, r, tp), 0,
                  "gather_from_sequence backward (split)");
      // reduce_scatter_to_sequence: reduce-scatter / all-gather.
      Tensor xr = leaf(randn(kShape, 600 + r));
      Tensor rs = reduce_scatter_to_sequence_parallel_region(xr, sd);
      check_close(rs, chunk_of(sum_over_ranks(kShape, 600, tp), sd, r, tp), 1e-6,
                  "reduce_scatter_to_sequence forward");
      backward(sum(mul(rs, chunk_of(up_full, sd, r, tp))));
      check_close(grad_of(xr), up_full, 0, "reduce_scatter_to_sequence backward");
    });
  }
}

TEST(Mappings, IdentityWithOneRank) {
  run_tp(1, [&](Communicator&) {
    Tensor x = leaf(randn(kShape, 7));
    EXPECT_TRUE(copy_to_tensor_model_parallel_region(x).is_same(x));
    EXPECT_TRUE(reduce_from_tensor_model_parallel_region(x).is_same(x));
    EXPECT_TRUE(scatter_to_tensor_model_parallel_region(x).is_same(x));
    EXPECT_TRUE(gather_from_tensor_model_parallel_region(x).is_same(x));
    EXPECT_TRUE(scatter_to_sequence_parallel_region(x, 1).is_same(x));
    EXPECT_TRUE(gather_from_sequence_parallel_region(x, 1).is_same(x));
    EXPECT_TRUE(reduce_scatter_to_sequence_parallel_region(x, 1).is_same(x));
  });
}

// bf16 through the reductions: equal to summing the f32 values of the bf16 inputs and rounding
// once, bitwise, in forward and backward. The inputs are chosen so that rounding after every
// partial sum (a bf16 accumulator) gives a different answer.
TEST(Mappings, Bf16ReducesInF32) {
  for (int tp : {2, 4, 8}) {
    run_tp(tp, [&](Communicator& g) {
      const int r = g.rank();
      auto input = [](int rank) {
        // 1 + small parts: a bf16 accumulator loses the small parts one at a time.
        Tensor t = randn(kShape, 700 + rank, 1.0 / 256.0);
        return add(t, 1.0).to(DType::bf16);
      };
      Tensor ref32 = zeros(kShape), naive = zeros(kShape, DType::bf16);
      for (int k = 0; k < tp; ++k) {
        ref32 = add(ref32, input(k).to(DType::f32));
        naive = add(naive, input(k));  // rounds to bf16 after each partial sum
      }
      Tensor ref = ref32.to(DType::bf16);
      if (tp >= 4) {
        EXPECT_GT(diff(naive, ref).max_abs, 0) << "inputs do not exercise bf16 accumulation";
      }

      Tensor x = input(r).set_requires_grad(true);
      Tensor y = reduce_from_tensor_model_parallel_region(x);
      ASSERT_EQ(y.dtype(), DType::bf16);
      EXPECT_BITWISE_EQ(y.detach(), ref);
      Tensor rs = reduce_scatter_to_sequence_parallel_region(input(r), 1);
      EXPECT_BITWISE_EQ(rs, chunk_of(ref, 1, r, tp));
      // Backward of copy_to all-reduces the bf16 gradient the same way.
      Tensor c = leaf(input(0));
      Tensor cy = copy_to_tensor_model_parallel_region(c);
      backward(std::vector<Tensor>{cy}, std::vector<Tensor>{input(r)});
      EXPECT_BITWISE_EQ(c.grad(), ref);
    });
  }
}

TEST(Mappings, IndivisibleSizesThrow) {
  run_tp(4, [&](Communicator&) {
    Tensor x = leaf(randn({2, 6, 10}, 8));
    EXPECT_THAT(
        [&] { scatter_to_tensor_model_parallel_region(x); },
        ::testing::ThrowsMessage<ShapeError>(::testing::HasSubstr(
            "[scatter_to_tensor_model_parallel_region] last dim 10 is not divisible by tensor "
            "parallel size 4")));
    EXPECT_THAT([&] { scatter_to_sequence_parallel_region(x, 1); },
                ::testing::ThrowsMessage<ShapeError>(
                    ::testing::HasSubstr("sequence length 6 is not divisible by tensor parallel "
                                         "size 4")));
    EXPECT_THAT([&] { reduce_scatter_to_sequence_parallel_region(x, 1); },
                ::testing::ThrowsMessage<ShapeError>(::testing::HasSubstr(
                    "[reduce_scatter_to_sequence_parallel_region] sequence length 6")));
  });
}

}  // namespace
