// GradSync (data-parallel gradient averaging in flat buckets) against the mean of the per-rank
// gradients computed serially on one thread: DP 2 and 4, overlap and at-step modes, bucket sizes
// from "every parameter larger than a bucket" to one bucket, unused and rank-dependent
// parameters, gradient accumulation with no_sync, bf16 and f64 gradients, DP size 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/basic.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/init.h"
#include "support/compare.h"
#include "support/ranks.h"

using namespace nxd;
using namespace nxd::optim;
using namespace nxd::testing;

namespace {

constexpr int64_t B = 6, IN = 12, H1 = 40, H2 = 24, OUT = 4;
constexpr uint64_t kSeed = 11;

Tensor randn(const Shape& shape, uint64_t stream, double std = 1.0) {
  Tensor t = zeros(shape);
  init::normal(t, RngStream{kSeed, stream}, 0.0, std);
  return t;
}

// Parameters in registration order: unused [5], extra [4] (used on DP rank 0 only), a, b, c.
struct Toy : Module {
  Tensor unused, extra;
  std::shared_ptr<Linear> a, b, c;
  Toy() {
    unused = register_parameter("unused", zeros({5}), ParamInit::normal(1.0));
    extra = register_parameter("extra", zeros({OUT}), ParamInit::normal(1.0));
    LinearOptions lo;
    lo.weight_init = ParamInit::normal(0.3);
    lo.bias_init = ParamInit::normal(0.1);
    a = register_module("a", std::make_shared<Linear>(IN, H1, lo));
    b = register_module("b", std::make_shared<Linear>(H1, H2, lo));
    c = register_module("c", std::make_shared<Linear>(H2, OUT, lo));
    init_parameters(kSeed);
  }
  // The loss of microbatch `mb` of DP rank `r`.
  Tensor loss(int r, int mb) const {
    const uint64_t s = 100 + 10 * r + mb;
    Tensor y = c->forward(tanh(b->forward(tanh(a->forward(randn({B, IN}, s))))));
    if (r == 0) y = mul(y, extra);
    return sum(mul(y, randn({B, OUT}, 1000 + s)));
  }
};

// The per-rank accumulated gradients (microbatches summed in .grad), computed serially, and their
// mean in the all-reduce's order: ((g0 + g1) + g2 ...) / n in f32. Undefined where no rank had one.
std::map<std::string, Tensor> serial_mean(int n, int microbatches) {
  std::map<std::string, std::vector<Tensor>> per;
  for (int r = 0; r < n; ++r) {
    Toy m;
    for (int mb = 0; mb < microbatches; ++mb) backward(m.loss(r, mb));
    for (auto& [k, t] : m.named_parameters()) per[k].push_back(t.grad());
  }
  std::map<std::string, Tensor> mean;
  for (auto& [k, gs] : per) {
    Tensor acc;
    for (auto& g : gs)
      if (g.defined()) acc = g;
    if (!acc.defined()) {
      mean[k] = Tensor();
      continue;
    }
    const int64_t len = acc.numel();
    std::vector<float> sum(len, 0.0f);
    for (int r = 0; r < n; ++r) {
      std::vector<float> v = gs[r].defined() ? gs[r].contiguous().to_vector_as<float>()
                                             : std::vector<float>(len, 0.0f);
      for (int64_t i = 0; i < len; ++i) sum[i] = r == 0 ? v[i] : sum[i] + v[i];
    }
    for (auto& x : sum) x = x / static_cast<float>(n);
    Tensor t = empty(acc.shape());
    std::memcpy(t.data<float>(), sum.data(), len * sizeof(float));
    mean[k] = t;
  }
  return mean;
}

struct Case {
  int dp;
  GradSyncMode mode;
  int64_t bucket_bytes;
  int microbatches;
};

std::string case_str(const Case& c) {
  return "dp=" + std::to_string(c.dp) + " mode=" + grad_sync_mode_name(c.mode) +
         " bucket_bytes=" + std::to_string(c.bucket_bytes) +
         " microbatches=" + std::to_string(c.microbatches);
}

// Runs one case; returns rank 0's averaged gradients (for comparing modes).
std::map<std::string, Tensor> run_case(const Case& c) {
  SCOPED_TRACE(case_str(c));
  const auto want = serial_mean(c.dp, c.microbatches);
  std::map<std::string, Tensor> rank0;
  std::mutex mu;
  double worst = 0;
  run_ranks(c.dp, [&] {
    parallel_state::initialize_model_parallel(1);
    const int r = parallel_state::get_data_parallel_rank();
    Toy m;
    GradSync sync(m, {.bucket_bytes = c.bucket_bytes, .mode = c.mode});
    EXPECT_EQ(sync.dp_size(), c.dp);
    auto layout = sync.bucket_layout();
    // Layout: every parameter once, in reverse registration order; a bucket closes at the cap.
    std::vector<int> order;
    const auto params = m.parameters();
    for (size_t bi = 0; bi < layout.size(); ++bi) {
      int64_t bytes = 0, before_last = 0;
      for (int i : layout[bi]) {
        order.push_back(i);
        before_last = bytes;
        bytes += params[i].numel() * 4;
      }
      if (bi + 1 < layout.size()) {
        EXPECT_GE(bytes, c.bucket_bytes) << "bucket " << bi;
      }
      EXPECT_LT(before_last, c.bucket_bytes) << "bucket " << bi;
    }
    std::vector<int> rev;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) rev.push_back(i);
    EXPECT_EQ(order, rev);

    for (int mb = 0; mb < c.microbatches; ++mb) {
      const bool last = mb + 1 == c.microbatches;
      if (!last) {
        auto guard = sync.no_sync();
        backward(m.loss(r, mb));
        EXPECT_EQ(sync.launched_buckets(), 0);
      } else {
        backward(m.loss(r, mb));
      }
    }
    // Overlap: every bucket before the first one holding a gradient that did not arrive on this
    // rank (unused: param 0; extra: param 1 on ranks != 0) was launched during backward.
    int expect_launched = 0;
    if (c.mode == GradSyncMode::overlap) {
      expect_launched = static_cast<int>(layout.size());
      for (size_t bi = 0; bi < layout.size(); ++bi)
        for (int i : layout[bi])
          if (i == 0 || (i == 1 && r != 0))
            expect_launched = std::min(expect_launched, static_cast<int>(bi));
    }
    EXPECT_EQ(sync.launched_buckets(), expect_launched);
    sync.finish();
    EXPECT_EQ(sync.launched_buckets(), 0);

    for (auto& [k, t] : m.named_parameters()) {
      const Tensor& w = want.at(k);
      if (!w.defined()) {
        EXPECT_FALSE(t.grad().defined()) << k << ": no rank had a gradient, none expected";
        continue;
      }
      EXPECT_TRUE(t.grad().defined()) << k;
      if (!t.grad().defined()) continue;
      EXPECT_TRUE(bitwise_equal(t.grad(), w, k));
      std::lock_guard<std::mutex> g(mu);
      worst = std::max(worst, diff(t.grad(), w).max_abs);
      if (r == 0) rank0[k] = t.grad().clone();
    }
  });
  std::printf("    [%s] %zu params, largest |difference| to the serial mean %.3g\n",
              case_str(c).c_str(), want.size(), worst);
  return rank0;
}

TEST(GradSync, AveragesLikeTheSerialMeanInBothModes) {
  for (int dp : {2, 4})
    for (int64_t bucket : {int64_t{64}, int64_t{2048}, int64_t{25} << 20})
      for (int mbs : {1, 2}) {
        auto overlap = run_case({dp, GradSyncMode::overlap, bucket, mbs});
        auto at_step = run_case({dp, GradSyncMode::at_step, bucket, mbs});
        ASSERT_EQ(overlap.size(), at_step.size());
        for (auto& [k, t] : overlap) EXPECT_TRUE(bitwise_equal(t, at_step.at(k), k));
      }
}

TEST(GradSync, BucketLayoutOfSmallAndLargeParameters) {
  run_ranks(2, [] {
    parallel_state::initialize_model_parallel(1);
    Toy m;  // 5, 4, 480, 40, 960, 24, 96, 4 elements
    // 64-byte buckets: every parameter of >= 16 floats alone; the small ones group up to the cap.
    GradSync s(m, {.bucket_bytes = 64});
    std::vector<std::vector<int>> want{{7, 6}, {5}, {4}, {3}, {2}, {1, 0}};
    EXPECT_EQ(s.bucket_layout(), want);
    GradSync one(m, {.bucket_bytes = int64_t{25} << 20});
    EXPECT_EQ(one.bucket_layout().size(), 1u);
  });
}

TEST(GradSync, SecondReadyWithSyncOnIsAnError) {
  run_ranks(2, [] {
    parallel_state::initialize_model_parallel(1);
    const int r = parallel_state::get_data_parallel_rank();
    Toy m;
    GradSync s(m, {.bucket_bytes = 64});
    backward(m.loss(r, 0));
    try {
      backward(m.loss(r, 1));
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("became ready twice"), std::string::npos) << e.what();
    }
  });
}

// bf16 gradients: reduced in f32 and rounded once (pure bf16), or accumulated and reduced in f32
// with fp32_grad_acc (then .grad is f32); f64 in f64; one bucket per parameter dtype.
TEST(GradSync, Bf16ReducedInF32AndF64Buckets) {
  constexpr int kDp = 4;
  constexpr int64_t N = 37;
  auto value = [](int r, int64_t i) { return 0.1 * (i + 1) * (r + 1) + 1.0 / (3 + i + r); };
  for (bool fp32_acc : {false, true}) {
    SCOPED_TRACE(fp32_acc ? "fp32_grad_acc" : "bf16 gradients");
    run_ranks(kDp, [&] {
      parallel_state::initialize_model_parallel(1);
      const int r = parallel_state::get_data_parallel_rank();
      Tensor pb = zeros({N}, DType::bf16).set_requires_grad(true);
      Tensor pd = zeros({N}, DType::f64).set_requires_grad(true);
      Tensor pf = zeros({N}, DType::f32).set_requires_grad(true);
      GradSync s({{"pb", pb}, {"pd", pd}, {"pf", pf}},
                 {.mode = GradSyncMode::at_step, .fp32_grad_acc = fp32_acc});
      EXPECT_EQ(s.bucket_layout().size(), 3u);  // f32 (pf), f64 (pd), bf16 (pb)
      // the gradients arrive through backward: into the bucket slices
      std::vector<double> vb(N);
      for (int64_t i = 0; i < N; ++i) vb[i] = value(r, i);
      Tensor gb = from_doubles(vb, {N}, DType::bf16);
      backward(sum(mul(pb, gb)));
      backward(sum(mul(pd, from_doubles(vb, {N}, DType::f64))));
      if (r % 2 == 0) backward(sum(mul(pf, from_doubles(vb, {N}, DType::f32))));  // odd: none
      EXPECT_EQ(pb.grad().dtype(), fp32_acc ? DType::f32 : DType::bf16);
      s.finish();
      EXPECT_EQ(s.copied_bytes(), 0);
      std::vector<double> eb(N), ed(N), ef(N);
      for (int64_t i = 0; i < N; ++i) {
        float accb = 0, accf = 0;
        double accd = 0;
        for (int q = 0; q < kDp; ++q) {
          accb += static_cast<float>(bf16(static_cast<float>(value(q, i))));
          accd += value(q, i);
          accf += q % 2 == 0 ? static_cast<float>(value(q, i)) : 0.0f;
        }
        eb[i] = fp32_acc ? accb / kDp : static_cast<float>(bf16(accb / kDp));  // rounded once
        ed[i] = accd / kDp;
        ef[i] = accf / kDp;
      }
      EXPECT_BITWISE_EQ(pb.grad(), from_doubles(eb, {N}, fp32_acc ? DType::f32 : DType::bf16));
      EXPECT_BITWISE_EQ(pd.grad(), from_doubles(ed, {N}, DType::f64));
      ASSERT_TRUE(pf.grad().defined());
      EXPECT_BITWISE_EQ(pf.grad(), from_doubles(ef, {N}, DType::f32));
    });
  }
}

// A .grad that is not its bucket slice (set by hand, or computed before the GradSync existed) is
// copied into the slice when its bucket launches, and .grad then is the slice.
TEST(GradSync, GradSetByHandIsCopiedIntoItsSlice) {
  run_ranks(2, [] {
    parallel_state::initialize_model_parallel(1);
    const int r = parallel_state::get_data_parallel_rank();
    Tensor p = zeros({5}).set_requires_grad(true);
    GradSync s({{"p", p}}, {.mode = GradSyncMode::at_step});
    p.set_grad(from_doubles({1.0 + r, 2, 3, 4, 5 + r}, {5}));
    s.finish();
    EXPECT_EQ(s.copied_bytes(), 5 * 4);
    EXPECT_BITWISE_EQ(p.grad(), from_doubles({1.5, 2, 3, 4, 5.5}, {5}));
    // the next pass goes straight into the slice
    p.set_grad(Tensor());
    backward(sum(mul(p, from_doubles({1.0 + r, 0, 0, 0, 0}, {5}))));
    s.finish();
    EXPECT_EQ(s.copied_bytes(), 5 * 4);
    EXPECT_BITWISE_EQ(p.grad(), from_doubles({1.5, 0, 0, 0, 0}, {5}));
  });
}

TEST(GradSync, DpSizeOneIsANoOp) {
  Toy m;
  GradSync s(m);
  EXPECT_EQ(s.dp_size(), 1);
  backward(m.loss(0, 0));
  std::vector<Tensor> before;
  for (auto& p : m.parameters()) before.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
  s.finish();
  auto ps = m.parameters();
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_EQ(ps[i].grad().defined(), before[i].defined());
    if (before[i].defined()) {
      EXPECT_BITWISE_EQ(ps[i].grad(), before[i]);
    }
  }
}

TEST(GradSync, BadArgumentsAreClearErrors) {
  Toy m;
  try {
    GradSync s({{"a", m.extra}, {"b", m.extra}});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'a' and 'b'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(GradSync(m, {.bucket_bytes = 0}), InvalidArgument);
  std::vector<NamedParam> plain{{"x", zeros({3})}};  // does not require grad
  EXPECT_THROW(GradSync{plain}, InvalidArgument);
}

}  // namespace

namespace {

// A weight tied under two names is one tensor: one bucket slot, averaged once.
TEST(GradSync, TiedWeightIsAveragedOnce) {
  run_ranks(2, [] {
    parallel_state::initialize_model_parallel(1);
    const int r = parallel_state::get_data_parallel_rank();
    Module m;
    Tensor w = m.register_parameter("w", zeros({3, 3}), ParamInit::normal(0.5));
    auto child = std::make_shared<Module>();
    child->register_parameter("w", w);
    m.register_module("child", child);
    m.init_parameters(kSeed);
    // at_step: in overlap mode the bucket (w's .grad itself) may already be averaging when
    // backward returns
    GradSync s(m, {.bucket_bytes = 16, .mode = GradSyncMode::at_step});
    ASSERT_EQ(s.bucket_layout().size(), 1u);
    Tensor x = randn({2, 3}, 300 + r);
    backward(add(sum(matmul(x, w)), sum(mul(w, w))));  // two uses, one gradient
    std::vector<float> mine = w.grad().to_vector_as<float>();
    s.finish();
    // the average of the two ranks' gradients: recompute the other rank's serially
    Tensor w2 = w.detach().clone().set_requires_grad(true);
    backward(add(sum(matmul(randn({2, 3}, 300 + (1 - r)), w2)), sum(mul(w2, w2))));
    std::vector<float> other = w2.grad().to_vector_as<float>(), want(9);
    for (int i = 0; i < 9; ++i) want[i] = (r == 0 ? mine[i] + other[i] : other[i] + mine[i]) / 2;
    Tensor wt = empty({3, 3});
    std::copy(want.begin(), want.end(), wt.data<float>());
    EXPECT_BITWISE_EQ(w.grad(), wt);
  });
}

// Meta parameters (the planner): buckets are shapes only; the collectives are charged, no data.
TEST(GradSync, MetaParametersAreShapeOnly) {
  run_ranks(2, [] {
    parallel_state::initialize_model_parallel(1);
    LinearOptions lo;
    lo.param = ParamOptions{DType::f32, Device::meta};
    Linear lin(8, 4, lo);
    GradSync s(lin, {.bucket_bytes = 16});  // bias, then weight: two buckets
    ASSERT_EQ(s.bucket_layout().size(), 2u);
    backward(sum(lin.forward(empty({2, 8}, DType::f32, Device::meta))));
    EXPECT_EQ(s.launched_buckets(), 2);
    s.finish();
    EXPECT_TRUE(lin.weight().grad().is_meta());
  });
}

}  // namespace

namespace {

// On the sim backend's modeled clock, launching buckets from the hooks overlaps the all-reduces
// with the rest of backward: the step is shorter than reducing everything at the step.
TEST(GradSync, OverlapShortensTheModeledStep) {
  constexpr int64_t W = 512, L = 6;
  auto step_time = [&](GradSyncMode mode) {
    sim::LaunchOptions o;
    o.world_size = 2;
    auto res = sim::launch(o, [&] {
      parallel_state::initialize_model_parallel(1);
      Module m;
      std::vector<std::shared_ptr<Linear>> layers;
      for (int64_t l = 0; l < L; ++l)
        layers.push_back(m.register_module(str("l", l), std::make_shared<Linear>(W, W)));
      m.init_parameters(kSeed);
      GradSync s(m, {.bucket_bytes = W * W * 4, .mode = mode});
      Tensor h = randn({64, W}, 5);
      for (auto& l : layers) h = tanh(l->forward(h));
      backward(sum(h));
      s.finish();
    });
    return res.sim_seconds();
  };
  const double ov = step_time(GradSyncMode::overlap), at = step_time(GradSyncMode::at_step);
  std::printf("    modeled step: overlap %.3g us, at step %.3g us (ratio %.3f)\n", ov * 1e6,
              at * 1e6, ov / at);
  EXPECT_LT(ov, at);
}

}  // namespace
