// Column/Row parallel linear, ParallelEmbedding and the SP norms against the plain layers of
// layers/basic.h (same names, same seed) for TP in {1,2,4,8}, SP on and off: outputs and every
// gathered gradient within 1e-5; shards equal slices of the full init; uneven sizes throw.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nxd/collectives/parallel_state.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/layers/basic.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/mappings.h"
#include "tp_util.h"

using namespace nxd;
using namespace nxd::testing;

namespace {

constexpr int64_t B = 2, S = 8, IN = 16, OUT = 16;
constexpr uint64_t kSeed = 11;
constexpr double kTol = 1e-5;

// The unsharded reference of a parallel linear: a Linear with the same parameter names and seed
// and a non-zero bias, run forward on xf = randn(seed x_seed) and backward from sum(y * up).
struct LinearRef {
  Linear lin;
  Tensor xf, x, y, up;  // input, its leaf (x.grad() is dX), output, upstream gradient
  LinearRef(int64_t in, int64_t out, bool bias, uint64_t x_seed, uint64_t up_seed)
      : lin(in, out, options(bias)) {
    lin.init_parameters(kSeed);
    xf = randn({B, S, in}, x_seed);
    x = leaf(xf);
    y = lin.forward(x);
    up = randn({B, S, out}, up_seed);
    backward(sum(mul(y, up)));
  }
  static LinearOptions options(bool bias) {
    LinearOptions lo;
    lo.bias = bias;
    lo.bias_init = ParamInit::normal(0.5);  // non-zero so the bias path is tested
    return lo;
  }
  const Tensor& weight() const { return lin.weight(); }
  const Tensor& bias() const { return lin.bias(); }
};

struct ColumnCase {
  bool gather_output, sp, bias, skip_bias_add;
  int64_t stride;
};

void run_column(int tp, const ColumnCase& c) {
  run_tp(tp, [&](Communicator& g) {
    const int r = g.rank();
    const LinearRef ref(IN, OUT, c.bias, 1, 2);

    ColumnParallelLinearOptions o;
    o.bias = c.bias;
    o.bias_init = ParamInit::normal(0.5);
    o.gather_output = c.gather_output;
    o.sequence_parallel_enabled = c.sp;
    o.skip_bias_add = c.skip_bias_add;
    o.stride = c.stride;
    ColumnParallelLinear col(IN, OUT, o);
    col.init_parameters(kSeed);
    std::vector<std::string> names;
    for (auto& [n, t] : col.named_parameters()) names.push_back(n);
    EXPECT_EQ(names, (c.bias ? std::vector<std::string>{"weight", "bias"}
                             : std::vector<std::string>{"weight"}));
    // Rows of the full layer that this rank holds, in its local order.
    const int64_t per = OUT / tp, cs = per / c.stride;
    auto local_rows = [&](const Tensor& full, int64_t dim) {
      std::vector<Tensor> ps;
      for (int64_t b = 0; b < c.stride; ++b)
        ps.push_back(full.detach().narrow(dim, (b * tp + r) * cs, cs));
      return cat_raw(ps, dim);
    };
    Tensor w2 = col.weight().detach().reshape({per, IN});
    EXPECT_BITWISE_EQ(w2, local_rows(ref.weight(), 0));

    Tensor x = leaf(c.sp ? chunk_of(ref.xf, 1, r, tp) : ref.xf);
    auto [y, skipped] = col.forward_and_bias(x);
    if (c.skip_bias_add && c.bias) {
      ASSERT_TRUE(skipped.defined());
      y = add(y, skipped);
    }
    // Full output (gather_output) or this rank's columns.
    Tensor y_expect = c.gather_output ? ref.y : local_rows(ref.y, 2);
    check_close(y, y_expect, kTol, "column output");
    Tensor up_local = c.gather_output ? ref.up : local_rows(ref.up, 2);
    // With gather_output every rank holds the whole output and back-propagates the whole `up`;
    // the gather's backward keeps each rank's columns and copy_to's all-reduce sums dX.
    backward(sum(mul(y, up_local)));
    Tensor dx_expect = c.sp ? chunk_of(ref.x.grad(), 1, r, tp) : ref.x.grad();
    check_close(grad_of(x), dx_expect, kTol, "column dX");
    Tensor dw = grad_of(col.weight()).reshape({per, IN});
    check_close(dw, local_rows(ref.weight().grad(), 0), kTol, "column dW");
    if (c.stride == 1) check_gathered(g, dw, 0, ref.weight().grad(), kTol, "column dW gathered");
    if (c.bias) {
      Tensor db = grad_of(col.bias()).reshape({-1});
      if (c.gather_output) {
        check_close(db, ref.bias().grad(), kTol, "column db (full bias)");
      } else {
        check_close(db, local_rows(ref.bias().grad(), 0), kTol, "column db");
        if (c.stride == 1) check_gathered(g, db, 0, ref.bias().grad(), kTol, "column db gathered");
      }
    }
  });
}

TEST(ColumnParallelLinear, MatchesLinear) {
  const ColumnCase cases[] = {
      {true, false, true, false, 1},   // gather_output
      {false, false, true, false, 1},  // local output, sharded bias
      {false, true, true, false, 1},   // sequence parallel
      {false, false, true, true, 1},   // skip_bias_add
      {true, false, false, false, 1},  // no bias
      {false, false, true, false, 2},  // fused layout, local output
      {true, false, true, false, 2},   // fused layout, gathered
  };
  for (const auto& c : cases)
    for (int tp : kDegrees) {
      SCOPED_TRACE(::testing::Message() << "tp=" << tp << " gather=" << c.gather_output
                                        << " sp=" << c.sp << " stride=" << c.stride);
      run_column(tp, c);
    }
}

struct RowCase {
  bool input_is_parallel, sp, bias;
};

void run_row(int tp, const RowCase& c) {
  const int64_t out = 12;
  run_tp(tp, [&](Communicator& g) {
    const int r = g.rank();
    const LinearRef ref(IN, out, c.bias, 3, 4);

    RowParallelLinearOptions o;
    o.bias = c.bias;
    o.bias_init = ParamInit::normal(0.5);
    o.input_is_parallel = c.input_is_parallel;
    o.sequence_parallel_enabled = c.sp;
    RowParallelLinear row(IN, out, o);
    row.init_parameters(kSeed);
    EXPECT_BITWISE_EQ(row.weight().detach(), chunk_of(ref.weight(), 1, r, tp));
    if (c.bias) {
      EXPECT_BITWISE_EQ(row.bias().detach(), ref.bias().detach());
    }

    Tensor x = leaf(c.input_is_parallel ? chunk_of(ref.xf, -1, r, tp) : ref.xf);
    Tensor y = row.forward(x);
    Tensor y_expect = c.sp ? chunk_of(ref.y, 1, r, tp) : ref.y;
    check_close(y, y_expect, kTol, "row output");
    // Each rank back-propagates its own view of the output's gradient: the full `up` (no SP:
    // every rank holds the whole output) or its sequence chunk (SP).
    backward(sum(mul(y, c.sp ? chunk_of(ref.up, 1, r, tp) : ref.up)));
    if (c.sp) allreduce_sequence_parallel_gradients(row);
    Tensor dx_expect = c.input_is_parallel ? chunk_of(ref.x.grad(), -1, r, tp) : ref.x.grad();
    check_close(grad_of(x), dx_expect, kTol, "row dX");
    check_gathered(g, grad_of(row.weight()), 1, ref.weight().grad(), kTol, "row dW gathered");
    if (c.bias) check_close(grad_of(row.bias()), ref.bias().grad(), kTol, "row db");
  });
}

TEST(RowParallelLinear, MatchesLinear) {
  const RowCase cases[] = {
      {false, false, true}, {true, false, true}, {true, true, true}, {true, true, false}};
  for (const auto& c : cases)
    for (int tp : kDegrees) {
      SCOPED_TRACE(::testing::Message()
                   << "tp=" << tp << " parallel_input=" << c.input_is_parallel << " sp=" << c.sp);
      run_row(tp, c);
    }
}

// Column -> Row MLP block under SP: x [B,S/tp,H] -> gather -> column -> gelu -> row -> reduce-
// scatter, exactly the NxD SP block, against the plain two-layer MLP.
TEST(ParallelLinear, SequenceParallelMlpBlock) {
  for (int tp : kDegrees) {
    run_tp(tp, [&](Communicator& g) {
      const int r = g.rank();
      LinearOptions lo;
      lo.bias_init = ParamInit::normal(0.5);
      Linear fc1(IN, 32, lo), fc2(32, IN, lo);
      fc1.init_parameters(kSeed, "fc1.");
      fc2.init_parameters(kSeed, "fc2.");
      Tensor xf = randn({B, S, IN}, 5), up = randn({B, S, IN}, 6);
      Tensor xr = leaf(xf);
      backward(sum(mul(fc2.forward(gelu(fc1.forward(xr))), up)));

      ColumnParallelLinearOptions co;
      co.bias_init = ParamInit::normal(0.5);
      co.gather_output = false;
      co.sequence_parallel_enabled = true;
      RowParallelLinearOptions ro;
      ro.bias_init = ParamInit::normal(0.5);
      ro.input_is_parallel = true;
      ro.sequence_parallel_enabled = true;
      Module block;
      auto c1 = block.register_module("fc1", std::make_shared<ColumnParallelLinear>(IN, 32, co));
      auto c2 = block.register_module("fc2", std::make_shared<RowParallelLinear>(32, IN, ro));
      block.init_parameters(kSeed);
      Tensor x = leaf(chunk_of(xf, 1, r, tp));
      Tensor y = c2->forward(gelu(c1->forward(x)));
      backward(sum(mul(y, chunk_of(up, 1, r, tp))));
      allreduce_sequence_parallel_gradients(block);
      check_close(grad_of(x), chunk_of(xr.grad(), 1, r, tp), kTol, "mlp dX");
      check_gathered(g, grad_of(c1->weight()), 0, fc1.weight().grad(), kTol, "fc1 dW");
      check_gathered(g, grad_of(c1->bias()), 0, fc1.bias().grad(), kTol, "fc1 db");
      check_gathered(g, grad_of(c2->weight()), 1, fc2.weight().grad(), kTol, "fc2 dW");
      check_close(grad_of(c2->bias()), fc2.bias().grad(), kTol, "fc2 db");
      // The attributes the grad-norm code reads.
      auto pp = parallel_parameters(block);
      ASSERT_EQ(pp.size(), 4u);
      EXPECT_EQ(pp[0].name, "fc1.weight");
      EXPECT_EQ(pp[0].attrs.tensor_model_parallel, tp > 1);
      EXPECT_EQ(pp[0].attrs.partition_dim, 0);
      EXPECT_EQ(pp[1].attrs.tensor_model_parallel, tp > 1);  // sharded column bias
      EXPECT_EQ(pp[2].attrs.partition_dim, 1);
      EXPECT_FALSE(pp[3].attrs.tensor_model_parallel);     // row bias: duplicated ...
      EXPECT_TRUE(pp[3].attrs.sequence_parallel_enabled);  // ... and summed over TP under SP
    });
  }
}

// bf16 parameters and activations: the row-parallel output is the f32 sum of the per-rank bf16
// partial products rounded once (NxD's reduce_dtype), bitwise, and SP's reduce-scatter likewise.
TEST(RowParallelLinear, Bf16ReducesInF32) {
  for (int tp : {2, 4, 8}) {
    for (bool sp : {false, true}) {
      run_tp(tp, [&](Communicator& g) {
        const int r = g.rank();
        LinearOptions lo;
        lo.bias = false;
        lo.weight_init = ParamInit::normal(0.5);
        lo.param.dtype = DType::bf16;
        Linear ref(IN, OUT, lo);
        ref.init_parameters(kSeed);
        Tensor xf = randn({B, S, IN}, 12).to(DType::bf16);
        Tensor acc = zeros({B, S, OUT});
        for (int k = 0; k < tp; ++k)
          acc =
              add(acc,
                  linear(chunk_of(xf, -1, k, tp), chunk_of(ref.weight(), 1, k, tp)).to(DType::f32));
        Tensor want = acc.to(DType::bf16);
        RowParallelLinearOptions o;
        o.bias = false;
        o.input_is_parallel = true;
        o.sequence_parallel_enabled = sp;
        o.weight_init = ParamInit::normal(0.5);
        o.param.dtype = DType::bf16;
        RowParallelLinear row(IN, OUT, o);
        row.init_parameters(kSeed);
        Tensor y = row.forward(chunk_of(xf, -1, r, tp));
        ASSERT_EQ(y.dtype(), DType::bf16);
        EXPECT_BITWISE_EQ(y.detach(), sp ? chunk_of(want, 1, r, tp) : want);
      });
    }
  }
}

struct EmbCase {
  bool shard_dim, sp;
};

TEST(ParallelEmbedding, MatchesEmbedding) {
  const int64_t V = 16, D = 8;
  const EmbCase cases[] = {{false, false}, {false, true}, {true, false}, {true, true}};
  for (const auto& c : cases)
    for (int tp : kDegrees) {
      SCOPED_TRACE(::testing::Message()
                   << "tp=" << tp << " shard_dim=" << c.shard_dim << " sp=" << c.sp);
      run_tp(tp, [&](Communicator& g) {
        const int r = g.rank();
        Embedding ref(V, D);
        ref.init_parameters(kSeed);
        std::vector<int64_t> idv(B * S);
        for (size_t i = 0; i < idv.size(); ++i) idv[i] = (i * 7 + 3) % V;
        Tensor ids = from_vector<int64_t>(idv, {B, S});
        Tensor yr = ref.forward(ids);
        Tensor up = randn({B, S, D}, 7);
        backward(sum(mul(yr, up)));

        ParallelEmbeddingOptions o;
        o.shard_across_embedding = c.shard_dim;
        o.sequence_parallel_enabled = c.sp;
        ParallelEmbedding emb(V, D, o);
        emb.init_parameters(kSeed);
        EXPECT_BITWISE_EQ(emb.weight().detach(),
                          chunk_of(ref.weight(), c.shard_dim ? 1 : 0, r, tp));
        Tensor y = emb.forward(ids);
        check_close(y, c.sp ? chunk_of(yr, 1, r, tp) : yr, kTol, "embedding output");
        // Without SP every rank holds the whole output; with a vocabulary shard the output's
        // gradient reaches each rank unchanged (reduce_from backward), so each rank's dW rows
        // are the reference's.
        Tensor upl = c.sp ? chunk_of(up, 1, r, tp) : up;
        backward(sum(mul(y, upl)));
        check_gathered(g, grad_of(emb.weight()), c.shard_dim ? 1 : 0, ref.weight().grad(), kTol,
                       "embedding dW gathered");
      });
    }
}

TEST(ParallelEmbedding, IdOutOfRangeThrows) {
  run_tp(2, [&](Communicator&) {
    ParallelEmbedding emb(16, 4);
    Tensor ids = from_vector<int64_t>({1, 16}, {2});
    EXPECT_THAT([&] { emb.forward(ids); },
                ::testing::ThrowsMessage<InvalidArgument>(
                    ::testing::HasSubstr("[ParallelEmbedding] id 16 out of range [0, 16)")));
  });
}

// A world of two ranks that never initialized parallel_state (data parallelism only): each rank
// builds its parallel layers over a group of itself, and they are the plain layers bit for bit
// (the same values, outputs and gradients), without initializing parallel_state.
TEST(ParallelLayers, WithoutParallelStateEachRankIsItsOwnGroupAndThePlainLayerBitwise) {
  sim::launch(2, [&] {
    const LinearRef ref(IN, 12, true, 3, 4);
    ColumnParallelLinearOptions co;
    co.bias_init = ParamInit::normal(0.5);
    RowParallelLinearOptions ro;
    ro.bias_init = ParamInit::normal(0.5);
    auto column = std::make_shared<ColumnParallelLinear>(IN, 12, co);
    auto row = std::make_shared<RowParallelLinear>(IN, 12, ro);
    for (const std::shared_ptr<ParallelLinearBase>& layer :
         std::vector<std::shared_ptr<ParallelLinearBase>>{column, row}) {
      EXPECT_EQ(layer->tp_size(), 1);
      layer->init_parameters(kSeed);
      EXPECT_BITWISE_EQ(layer->weight().detach(), ref.weight().detach());
      EXPECT_BITWISE_EQ(layer->bias().detach(), ref.bias().detach());
      Tensor x = leaf(ref.xf);
      Tensor y = layer == column ? column->forward(x) : row->forward(x);
      EXPECT_BITWISE_EQ(y.detach(), ref.y.detach());
      backward(sum(mul(y, ref.up)));
      EXPECT_BITWISE_EQ(x.grad(), ref.x.grad());
      EXPECT_BITWISE_EQ(layer->weight().grad(), ref.weight().grad());
      EXPECT_BITWISE_EQ(layer->bias().grad(), ref.bias().grad());
    }
    ParallelEmbedding emb(16, 4);
    Embedding plain(16, 4);
    emb.init_parameters(kSeed);
    plain.init_parameters(kSeed);
    EXPECT_EQ(emb.tp_size(), 1);
    EXPECT_BITWISE_EQ(emb.weight().detach(), plain.weight().detach());
    EXPECT_FALSE(parallel_state::model_parallel_is_initialized());
  });
}

template <class Par, class Ref>
void run_norm(int tp, bool sp, const std::function<std::shared_ptr<Par>()>& make_par,
              const std::function<std::shared_ptr<Ref>()>& make_ref) {
  run_tp(tp, [&](Communicator& g) {
    const int r = g.rank();
    auto ref = make_ref();
    ref->init_parameters(kSeed);
    // Non-trivial affine parameters, the same on every rank.
    for (auto& [n, t] : ref->named_parameters()) {
      NoGradGuard ng;
      t.copy_(randn(t.shape(), 20 + n.size()));
    }
    Tensor xf = randn({B, S, IN}, 8), up = randn({B, S, IN}, 9);
    Tensor xr = leaf(xf);
    Tensor yr = ref->forward(xr);
    backward(sum(mul(yr, up)));

    auto par = make_par();
    par->init_parameters(kSeed);
    par->load_state_dict(ref->state_dict());
    Tensor x = leaf(sp ? chunk_of(xf, 1, r, tp) : xf);
    Tensor y = par->forward(x);
    check_close(y, sp ? chunk_of(yr, 1, r, tp) : yr, kTol, "norm output");
    backward(sum(mul(y, sp ? chunk_of(up, 1, r, tp) : up)));
    allreduce_sequence_parallel_gradients(*par);  // sums only when SP tagged them
    check_close(grad_of(x), sp ? chunk_of(xr.grad(), 1, r, tp) : xr.grad(), kTol, "norm dX");
    auto rp = ref->named_parameters();
    auto pp = par->named_parameters();
    ASSERT_EQ(rp.size(), pp.size());
    for (size_t i = 0; i < rp.size(); ++i) {
      EXPECT_EQ(pp[i].first, rp[i].first);
      check_close(grad_of(pp[i].second), rp[i].second.grad(), kTol, "norm d" + pp[i].first);
    }
    for (auto& p : parallel_parameters(*par)) EXPECT_EQ(p.attrs.sequence_parallel_enabled, sp);
  });
}

TEST(ParallelNorms, LayerNormAndRMSNormWithSequenceParallel) {
  for (bool sp : {false, true})
    for (int tp : kDegrees) {
      SCOPED_TRACE(::testing::Message() << "tp=" << tp << " sp=" << sp);
      run_norm<LayerNorm, LayerNorm>(
          tp, sp,
          [&] {
            return std::make_shared<LayerNorm>(IN,
                                               LayerNormOptions{.sequence_parallel_enabled = sp});
          },
          [] { return std::make_shared<LayerNorm>(IN); });
      run_norm<RMSNorm, RMSNorm>(
          tp, sp,
          [&] {
            return std::make_shared<RMSNorm>(IN, RMSNormOptions{.sequence_parallel_enabled = sp});
          },
          [] { return std::make_shared<RMSNorm>(IN); });
    }
}

TEST(ParallelLayers, IndivisibleSizesThrow) {
  run_tp(4, [&](Communicator&) {
    using ::testing::HasSubstr;
    using ::testing::ThrowsMessage;
    EXPECT_THAT([] { ColumnParallelLinear(8, 10); },
                ThrowsMessage<ShapeError>(HasSubstr(
                    "[ColumnParallelLinear] output size 10 is not divisible by tensor parallel "
                    "size 4")));
    EXPECT_THAT([] { RowParallelLinear(10, 8); },
                ThrowsMessage<ShapeError>(HasSubstr(
                    "[RowParallelLinear] input size 10 is not divisible by tensor parallel size "
                    "4")));
    EXPECT_THAT([] { ParallelEmbedding(10, 8); },
                ThrowsMessage<ShapeError>(HasSubstr(
                    "[ParallelEmbedding] vocabulary size 10 is not divisible by tensor parallel "
                    "size 4")));
    ParallelEmbeddingOptions eo;
    eo.shard_across_embedding = true;
    EXPECT_THAT([&] { ParallelEmbedding(8, 6, eo); },
                ThrowsMessage<ShapeError>(HasSubstr("embedding dim 6 is not divisible")));
    ColumnParallelLinearOptions so;
    so.stride = 3;
    EXPECT_THAT([&] { ColumnParallelLinear(8, 16, so); },
                ThrowsMessage<ShapeError>(HasSubstr("not divisible by stride 3")));
    ColumnParallelLinearOptions sp;
    sp.sequence_parallel_enabled = true;  // with gather_output (default true)
    EXPECT_THAT([&] { ColumnParallelLinear(8, 16, sp); },
                ThrowsMessage<InvalidArgument>(HasSubstr("requires gather_output=false")));
    RowParallelLinearOptions rp;
    rp.sequence_parallel_enabled = true;
    EXPECT_THAT([&] { RowParallelLinear(8, 16, rp); },
                ThrowsMessage<InvalidArgument>(HasSubstr("requires input_is_parallel=true")));
    // A sequence that does not divide under SP (the row layer reduce-scatters it).
    RowParallelLinearOptions rs;
    rs.input_is_parallel = true;
    rs.sequence_parallel_enabled = true;
    RowParallelLinear row(8, 16, rs);
    Tensor x = randn({2, 6, 2}, 1);
    EXPECT_THAT([&] { row.forward(x); },
                ThrowsMessage<ShapeError>(HasSubstr(
                    "[reduce_scatter_to_sequence_parallel_region] sequence length 6 is not "
                    "divisible by tensor parallel size 4")));
  });
}

}  // namespace
