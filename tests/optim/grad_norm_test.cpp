// The gradient norm across tensor-parallel ranks against the single-rank model's norm: a toy
// transformer block built from RMSNorm, GQAQKVColumnParallelLinear (K/V replicated by
// kv_size_multiplier when TP exceeds the KV heads), RowParallelLinear and ColumnParallelLinear,
// at TP 2/4/8 with sequence parallelism on and off, and at TP 2 x DP 2 with GradSync. The TP=1
// block is the same class on a one-rank group (same names, same seed). Also: NxD's counting
// (replicated K/V m times) is measurably wrong, and clipping scales every gradient alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/layers.h"
#include "nxd/layers/parallel/qkv.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/runtime/init.h"
#include "support/compare.h"
#include "support/ranks.h"

using namespace nxd;
using namespace nxd::optim;
using namespace nxd::testing;

namespace {

constexpr int64_t B = 2, S = 8, HID = 16, H = 8, HKV = 2, D = 4, FF = 32;
constexpr uint64_t kSeed = 7;
constexpr double kTol = 1e-6;

Tensor randn(const Shape& shape, uint64_t stream, double std = 1.0) {
  Tensor t = zeros(shape);
  init::normal(t, RngStream{kSeed, stream}, 0.0, std);
  return t;
}

Tensor seq_chunk(const Tensor& t, int r, int n) {
  const int64_t len = t.size(1) / n;
  return t.narrow(1, r * len, len).clone();
}

// norm1 -> GQA attention -> o_proj (+ residual) -> norm2 -> up -> silu -> down (+ residual).
struct Block : Module {
  std::shared_ptr<RMSNorm> norm1, norm2;
  std::shared_ptr<GQAQKVColumnParallelLinear> qkv;
  std::shared_ptr<RowParallelLinear> o_proj, down;
  std::shared_ptr<ColumnParallelLinear> up;
  bool sp;

  Block(std::shared_ptr<Communicator> group, bool sp_, int64_t m) : sp(sp_) {
    norm1 = register_module(
        "norm1", std::make_shared<RMSNorm>(HID, RMSNormOptions{.sequence_parallel_enabled = sp}));
    GQAQKVColumnParallelLinearOptions qo;
    qo.bias = true;
    qo.sequence_parallel_enabled = sp;
    qo.kv_size_multiplier = m;
    qo.head_dim = D;
    qo.weight_init = ParamInit::normal(0.3);
    qo.bias_init = ParamInit::normal(0.2);
    qo.group = group;
    qkv = std::make_shared<GQAQKVColumnParallelLinear>(HID, H * D, HKV * D, qo);
    register_module("q_proj", qkv->q_proj());
    register_module("k_proj", qkv->k_proj());
    register_module("v_proj", qkv->v_proj());
    RowParallelLinearOptions ro;
    ro.bias = false;
    ro.input_is_parallel = true;
    ro.sequence_parallel_enabled = sp;
    ro.weight_init = ParamInit::normal(0.3);
    ro.group = group;
    o_proj = register_module("o_proj", std::make_shared<RowParallelLinear>(H * D, HID, ro));
    norm2 = register_module(
        "norm2", std::make_shared<RMSNorm>(HID, RMSNormOptions{.sequence_parallel_enabled = sp}));
    ColumnParallelLinearOptions co;
    co.gather_output = false;
    co.sequence_parallel_enabled = sp;
    co.weight_init = ParamInit::normal(0.3);
    co.bias_init = ParamInit::normal(0.2);
    co.group = group;
    up = register_module("up", std::make_shared<ColumnParallelLinear>(HID, FF, co));
    RowParallelLinearOptions ro2 = ro;
    ro2.bias = true;
    ro2.bias_init = ParamInit::normal(0.2);
    down = register_module("down", std::make_shared<RowParallelLinear>(FF, HID, ro2));
    init_parameters(kSeed);
    // Non-trivial norm weights (their init is ones: perturb identically on every rank).
    NoGradGuard ng;
    for (auto* n : {norm1.get(), norm2.get()})
      n->weight().detach().copy_(add(randn({HID}, 77, 0.2).detach(), 1.0));
  }

  Tensor forward(const Tensor& x) const {
    auto heads = [](const Tensor& t) {
      return transpose(view(t, {t.size(0), t.size(1), t.size(-1) / D, D}), 1, 2);
    };
    auto [q, k, v] = qkv->forward(norm1->forward(x));
    Tensor o = scaled_dot_product_attention(heads(q), heads(k), heads(v), true);
    o = reshape(transpose(o, 1, 2), {B, S, q.size(-1)});
    Tensor x2 = add(x, o_proj->forward(o));
    return add(x2, down->forward(silu(up->forward(norm2->forward(x2)))));
  }
};

// Loss of batch `batch` on this TP rank (under SP: its sequence shard of the loss).
Tensor loss_of(const Block& blk, int batch, int tp_rank, int tp) {
  Tensor x = randn({B, S, HID}, 10 + batch), w = randn({B, S, HID}, 20 + batch);
  if (blk.sp) {
    x = seq_chunk(x, tp_rank, tp);
    w = seq_chunk(w, tp_rank, tp);
  }
  return sum(mul(blk.forward(x), w));
}

struct RefNorms {
  double l2 = 0, inf = 0;
};

// The single-rank block's norms (grads averaged over `batches` as DP averaging would).
RefNorms reference(int batches) {
  std::vector<std::vector<Tensor>> grads;
  std::vector<Tensor> params;
  for (int b = 0; b < batches; ++b) {
    Block ref(make_self_communicator(), false, 1);
    backward(loss_of(ref, b, 0, 1));
    std::vector<Tensor> g;
    for (auto& p : ref.parameters()) g.push_back(p.grad().clone());
    grads.push_back(g);
    if (b == 0) params = ref.parameters();
  }
  std::vector<Tensor> mean_params;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = zeros(params[i].shape()).set_requires_grad(true);
    Tensor acc = grads[0][i].clone();
    for (int b = 1; b < batches; ++b) acc.copy_(add(acc, grads[b][i]));
    p.set_grad(batches > 1 ? mul(acc, 1.0 / batches) : acc);
    mean_params.push_back(p);
  }
  return {grad_norm(mean_params, 2.0), grad_norm(mean_params, kInfNorm)};
}

std::mutex g_mu;

void run_norm_case(int tp, bool sp) {
  SCOPED_TRACE(::testing::Message() << "tp=" << tp << " sp=" << sp);
  const int64_t m = std::max<int64_t>(1, tp / HKV);
  const RefNorms ref = reference(1);
  double worst = 0, nxd_style = 0;
  run_ranks(tp, [&] {
    parallel_state::initialize_model_parallel(tp);
    auto g = parallel_state::get_tensor_model_parallel_group_ptr();
    Block blk(g, sp, m);
    backward(loss_of(blk, 0, g->rank(), tp));
    if (sp) allreduce_sequence_parallel_gradients(blk);
    auto ps = norm_params(blk);
    const NormGroups groups = NormGroups::from_parallel_state();
    const double l2 = parallel_grad_norm(ps, groups, 2.0);
    const double inf = parallel_grad_norm(ps, groups, kInfNorm);
    EXPECT_LE(std::abs(l2 - ref.l2) / ref.l2, kTol) << l2 << " vs " << ref.l2;
    EXPECT_LE(std::abs(inf - ref.inf) / ref.inf, kTol) << inf << " vs " << ref.inf;

    // NxD's rule: sharded params (replicated K/V included) summed over TP, duplicated ones / tp.
    double nxd = 0;
    for (auto& p : ps) {
      double s = std::pow(grad_norm({p.param}, 2.0), 2);
      nxd += p.attrs.tensor_model_parallel ? s : s / tp;
    }
    g->all_reduce(&nxd, &nxd, 1, DType::f64, ReduceOp::sum);
    nxd = std::sqrt(nxd);
    if (m > 1) {
      EXPECT_GT(std::abs(nxd - ref.l2) / ref.l2, 1e-3) << "replicated K/V should be over-counted";
    } else {
      EXPECT_LE(std::abs(nxd - ref.l2) / ref.l2, kTol);
    }

    // Clipping: every gradient scaled by the same coefficient; the norm is then max_norm.
    std::vector<Tensor> before;
    for (auto& p : ps) before.push_back(p.param.grad().clone());
    const double max_norm = 0.25 * ref.l2;
    const double ret = clip_parallel_grad_norm(ps, max_norm, groups);
    EXPECT_EQ(ret, l2);
    const float coef = static_cast<float>(max_norm / (l2 + 1e-6));
    for (size_t i = 0; i < ps.size(); ++i) {
      std::vector<float> v = before[i].to_vector_as<float>();
      for (auto& x : v) x *= coef;
      Tensor want = empty(before[i].shape());
      std::copy(v.begin(), v.end(), want.data<float>());
      EXPECT_TRUE(bitwise_equal(ps[i].param.grad(), want, ps[i].name));
    }
    const double after = parallel_grad_norm(ps, groups, 2.0);
    EXPECT_LE(std::abs(after - max_norm) / max_norm, kTol);
    // Below the threshold nothing changes.
    std::vector<Tensor> kept;
    for (auto& p : ps) kept.push_back(p.param.grad().clone());
    clip_parallel_grad_norm(ps, 10 * after, groups);
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_TRUE(bitwise_equal(ps[i].param.grad(), kept[i], ps[i].name));

    std::lock_guard<std::mutex> lk(g_mu);
    worst = std::max({worst, std::abs(l2 - ref.l2) / ref.l2, std::abs(inf - ref.inf) / ref.inf});
    nxd_style = nxd;
  });
  std::printf(
      "    [tp=%d sp=%d m=%lld] norm L2 %.9g inf %.9g (single rank), largest relative difference "
      "%.3g; NxD's count %.9g\n",
      tp, sp, static_cast<long long>(m), ref.l2, ref.inf, worst, nxd_style);
}

TEST(ParallelGradNorm, MatchesSingleRankNorm) {
  for (bool sp : {false, true})
    for (int tp : {2, 4, 8}) run_norm_case(tp, sp);
}

TEST(ParallelGradNorm, SingleRankEqualsPlainGradNorm) {
  Block blk(make_self_communicator(), false, 1);
  backward(loss_of(blk, 0, 0, 1));
  NormGroups none;
  EXPECT_EQ(parallel_grad_norm(norm_params(blk), none, 2.0), grad_norm(blk.parameters(), 2.0));
  EXPECT_EQ(parallel_grad_norm(norm_params(blk), none, kInfNorm),
            grad_norm(blk.parameters(), kInfNorm));
  EXPECT_THROW(parallel_grad_norm(norm_params(blk), none, 1.0), InvalidArgument);
  EXPECT_THROW(clip_parallel_grad_norm(norm_params(blk), 0.0, none), InvalidArgument);
}

// Shared parameters are left out of the norm but clipped.
TEST(ParallelGradNorm, SharedParamsSkippedButClipped) {
  Tensor a = zeros({3}).set_requires_grad(true), b = zeros({2}).set_requires_grad(true);
  a.set_grad(from_doubles({3, 0, 4}, {3}));
  b.set_grad(from_doubles({100, 100}, {2}));
  std::vector<NormParam> ps{{"a", a, {}, false}, {"b", b, {}, true}};
  EXPECT_NEAR(clip_parallel_grad_norm(ps, 1.0, NormGroups{}), 5.0, 1e-12);
  const double c = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(b.grad().at({0}), 100 * c, 1e-4);
  EXPECT_NEAR(a.grad().at({2}), 4 * c, 1e-6);
}

// TP 2 x DP 2: SP gradient all-reduce, DP averaging (GradSync), then the norm over TP equals the
// single-rank norm of the gradient averaged over the two batches.
TEST(ParallelGradNorm, TensorAndDataParallel) {
  constexpr int kTp = 2, kDp = 2;
  for (bool sp : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "sp=" << sp);
    const RefNorms ref = reference(kDp);
    double worst = 0;
    run_ranks(kTp * kDp, [&] {
      parallel_state::initialize_model_parallel(kTp);
      auto g = parallel_state::get_tensor_model_parallel_group_ptr();
      Block blk(g, sp, 1);
      GradSync sync(blk, {.bucket_bytes = 1024});
      backward(loss_of(blk, parallel_state::get_data_parallel_rank(), g->rank(), kTp));
      // finish() first: it overwrites .grad with the average of what its hooks copied during
      // backward; the SP sum over TP commutes with the DP average, so it comes after.
      sync.finish();
      if (sp) allreduce_sequence_parallel_gradients(blk);
      const double l2 = clip_parallel_grad_norm(blk, 1e9);
      const double inf = clip_parallel_grad_norm(blk, 1e9, kInfNorm);
      EXPECT_LE(std::abs(l2 - ref.l2) / ref.l2, kTol) << l2 << " vs " << ref.l2;
      EXPECT_LE(std::abs(inf - ref.inf) / ref.inf, kTol) << inf << " vs " << ref.inf;
      std::lock_guard<std::mutex> lk(g_mu);
      worst = std::max({worst, std::abs(l2 - ref.l2) / ref.l2, std::abs(inf - ref.inf) / ref.inf});
    });
    std::printf("    [tp=2 dp=2 sp=%d] largest relative difference to the single rank %.3g\n", sp,
                worst);
  }
}

}  // namespace

namespace {

// A weight tied under two names is listed and counted once.
TEST(ParallelGradNorm, TiedWeightCountedOnce) {
  Module m;
  Tensor w = m.register_parameter("w", zeros({3, 3}), ParamInit::normal(0.5));
  auto child = std::make_shared<Module>();
  child->register_parameter("w", w);
  m.register_module("child", child);
  m.init_parameters(kSeed);
  backward(add(sum(matmul(randn({2, 3}, 5), w)), sum(mul(w, w))));
  auto ps = norm_params(m);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].name, "w");
  EXPECT_EQ(parallel_grad_norm(ps, NormGroups{}, 2.0), grad_norm({w}, 2.0));
}

}  // namespace

namespace {

// Sharded parameters need the TP group they were sharded over.
TEST(ParallelGradNorm, MissingTpGroupIsAnError) {
  run_ranks(2, [] {
    parallel_state::initialize_model_parallel(2);
    auto g = parallel_state::get_tensor_model_parallel_group_ptr();
    Block blk(g, false, 1);
    backward(loss_of(blk, 0, g->rank(), 2));
    try {
      parallel_grad_norm(norm_params(blk), NormGroups{}, 2.0);
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("is sharded over 2 ranks but the TP group has 1"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace

namespace {

// PP stages hold different parameters and ZeRO-1 ranks disjoint shards of them: the norm sums
// (max for inf) over both groups. World 4: stage r / 2 holds tensors {2s, 2s+1}, shard r % 2 holds
// one half of each; stage 1 also holds a tied copy of tensor 0 marked shared (not counted).
TEST(ParallelGradNorm, SumsOverPipelineAndZero1Groups) {
  constexpr int64_t N = 10;
  std::vector<Tensor> full;
  for (int t = 0; t < 4; ++t) full.push_back(randn({N}, 900 + t, 0.5 + t));
  auto full_norm = [&](double type) {
    std::vector<Tensor> ps;
    for (auto& f : full) {
      Tensor p = zeros({N}).set_requires_grad(true);
      p.set_grad(f.clone());
      ps.push_back(p);
    }
    return grad_norm(ps, type);
  };
  const double l2 = full_norm(2.0), inf = full_norm(kInfNorm);
  run_ranks(4, [&] {
    Communicator& w = world();
    const int r = w.rank(), stage = r / 2, shard = r % 2;
    NormGroups groups;
    groups.pp = w.split(shard, r);
    groups.zero1 = w.split(stage, r);
    std::vector<NormParam> ps;
    auto add_shard = [&](int t, bool shared) {
      Tensor p = zeros({N / 2}).set_requires_grad(true);
      p.set_grad(full[t].narrow(0, shard * (N / 2), N / 2).clone());
      ps.push_back({"t" + std::to_string(t), p, {}, shared});
    };
    add_shard(2 * stage, false);
    add_shard(2 * stage + 1, false);
    if (stage == 1) add_shard(0, true);
    const double got = parallel_grad_norm(ps, groups, 2.0);
    const double got_inf = parallel_grad_norm(ps, groups, kInfNorm);
    EXPECT_LE(std::abs(got - l2) / l2, 1e-12) << got << " vs " << l2;
    EXPECT_EQ(got_inf, inf);
  });
}

}  // namespace
