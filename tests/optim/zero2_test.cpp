// ZeRO-2 (Zero1Options::stage two: GradSync storage shard_only, optim/grad_sync.h) against ZeRO-1
// and the unsharded path (GradSync's DP mean + parallel_grad_norm + AdamW) on the same ranks: 20
// steps of a Llama at DP 2, DP 4 and TP2 x DP2 with clipping, at_step and overlap — every
// parameter bitwise ZeRO-1's (the same buckets, collectives and accumulation dtype) and within
// 1e-6 of the unsharded run; between steps a rank holds no .grad and only its gradient shards
// (1/DP of ZeRO-1's buckets plus padding); bf16 parameters with f32 accumulation over two
// micro batches bitwise ZeRO-1's. The same tests run under mpirun -np 4 (label mpi).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/zero1.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "support/tiny_models.h"
#include "zero_util.h"

using namespace nxd;
using namespace nxd::optim;

namespace {

Tensor ids_for(int dp_rank, int step, int64_t vocab) {
  return nxd::testing::zero_ids(2000u, dp_rank, step, vocab);
}
using nxd::testing::named;

struct Worst {
  std::mutex mu;
  double param = 0, norm = 0;
  bool bitwise = true;
  double grad_ratio = 0;  // ZeRO-2's gradient bytes / ZeRO-1's (the largest over ranks)
  void add(double p, double n, bool b) {
    std::lock_guard<std::mutex> l(mu);
    param = std::max(param, p), norm = std::max(norm, n), bitwise = bitwise && b;
  }
};

Zero1Options options(Module& m, ZeroStage stage, GradSyncMode mode) {
  Zero1Options zo{AdamWOptions{0.9, 0.99, 1e-8}, nullptr, NormGroups::from_parallel_state(),
                  norm_params(m)};
  zo.registration_order = [&] {
    std::vector<NamedParam> out;
    for (auto& [n, t] : m.named_parameters()) out.push_back({n, t});
    return out;
  }();
  zo.bucket_bytes = 1 << 14;
  zo.mode = mode;
  zo.stage = stage;
  return zo;
}

void compare(int world, int tp, GradSyncMode mode) {
  Worst worst;
  if (!nxd::testing::run_ranks(world, [&] {
        parallel_state::initialize_model_parallel(tp);
        ModelConfig c = nxd::testing::tiny_gqa_llama();
        c.kv_size_multiplier = std::max(1, tp / 2);
        auto ref = make_causal_lm(c, 5), z1 = make_causal_lm(c, 5), z2 = make_causal_lm(c, 5);
        AdamW adam(default_param_groups(named(*ref), 3e-2, 0.1), AdamWOptions{0.9, 0.99, 1e-8});
        GradSync sync(*ref, GradSyncOptions{1 << 14, GradSyncMode::at_step});
        const NormGroups groups = NormGroups::from_parallel_state();
        Zero1Optimizer one(default_param_groups(named(*z1), 3e-2, 0.1),
                           options(*z1, ZeroStage::one, mode));
        Zero1Optimizer two(default_param_groups(named(*z2), 3e-2, 0.1),
                           options(*z2, ZeroStage::two, mode));
        EXPECT_EQ(two.stage(), ZeroStage::two);
        const int d = parallel_state::get_data_parallel_rank();
        for (int step = 0; step < 20; ++step) {
          Tensor ids = ids_for(d, step, c.vocab_size), tg = ids_for(d, 50 + step, c.vocab_size);
          backward(ref->loss(ids, tg));
          backward(z1->loss(ids, tg));
          backward(z2->loss(ids, tg));
          sync.finish();
          const double n0 = clip_parallel_grad_norm(norm_params(*ref), 0.5, groups);
          const double n1 = one.clip_grad_norm(0.5);
          const double n2 = two.clip_grad_norm(0.5);
          bool no_grad = true;  // ZeRO-2 keeps no full-size gradient after the reduction
          for (auto& [name, t] : z2->named_parameters()) no_grad = no_grad && !t.grad().defined();
          EXPECT_TRUE(no_grad) << "step " << step;
          adam.step();
          one.step();
          two.step();
          adam.zero_grad(true);
          one.zero_grad(true);
          two.zero_grad(true);
          double p = 0;
          bool same = n1 == n2;
          for (auto& [name, t] : ref->named_parameters()) {
            const Tensor w2 = z2->get_parameter(name).detach();
            p = std::max(p, nxd::testing::diff(w2, t.detach()).rel());
            same = same && nxd::testing::diff(w2, z1->get_parameter(name).detach()).max_abs == 0;
          }
          worst.add(p, std::abs(n2 - n0) / n0, same);
        }
        const double ratio = static_cast<double>(two.grad_sync().buffer_bytes()) /
                             static_cast<double>(one.grad_sync().buffer_bytes());
        std::lock_guard<std::mutex> l(worst.mu);
        worst.grad_ratio = std::max(worst.grad_ratio, ratio);
      }))
    return;                           // under an MPI world smaller than `world`
  if (worst.grad_ratio == 0) return;  // a process outside the first `world` of an MPI run
  const int dp = world / tp;
  std::printf(
      "    [world %d, tp %d, %s] ZeRO-2 vs plain DP: parameters %.3g, norm %.3g; bitwise ZeRO-1: "
      "%s; gradient bytes held %.3f of ZeRO-1's (1/DP %.3f)\n",
      world, tp, grad_sync_mode_name(mode), worst.param, worst.norm, worst.bitwise ? "yes" : "no",
      worst.grad_ratio, 1.0 / dp);
  EXPECT_LE(worst.param, 1e-6);
  EXPECT_LE(worst.norm, 1e-6);
  EXPECT_TRUE(worst.bitwise);
  EXPECT_NEAR(worst.grad_ratio, 1.0 / dp, 0.1 / dp);
}

}  // namespace

TEST(Zero2, MatchesPlainDpAndZero1AtDp2AndDp4) {
  compare(2, 1, GradSyncMode::at_step);
  compare(4, 1, GradSyncMode::overlap);
}

TEST(Zero2, MatchesPlainDpAndZero1WithTensorParallelism) {
  compare(4, 2, GradSyncMode::overlap);
}

// bf16 parameters, f32 gradient accumulation over two micro batches (the first under no_sync):
// ZeRO-2's fresh f32 .grads accumulate as ZeRO-1's f32 buckets do.
TEST(Zero2, Bf16WithF32AccumulationOverMicroBatchesIsBitwiseZero1) {
  bool same = true;
  std::mutex mu;
  nxd::testing::run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(1);
    ModelConfig c = nxd::testing::tiny_gqa_llama();
    auto z1 = make_causal_lm(c, 5), z2 = make_causal_lm(c, 5);
    z1->to_dtype(DType::bf16);
    z2->to_dtype(DType::bf16);
    auto opts = [&](Module& m, ZeroStage s) {
      Zero1Options zo = options(m, s, GradSyncMode::overlap);
      zo.adamw.precision.master_weights = true;
      zo.fp32_grad_acc = true;
      return zo;
    };
    Zero1Optimizer one(default_param_groups(named(*z1), 1e-2, 0.1), opts(*z1, ZeroStage::one));
    Zero1Optimizer two(default_param_groups(named(*z2), 1e-2, 0.1), opts(*z2, ZeroStage::two));
    const int d = parallel_state::get_data_parallel_rank();
    for (int step = 0; step < 5; ++step) {
      for (int mb = 0; mb < 2; ++mb) {
        Tensor ids = ids_for(2 * d + mb, step, c.vocab_size);
        Tensor tg = ids_for(2 * d + mb, 50 + step, c.vocab_size);
        if (mb == 0) {
          auto g1 = one.grad_sync().no_sync();
          auto g2 = two.grad_sync().no_sync();
          backward(z1->loss(ids, tg));
          backward(z2->loss(ids, tg));
        } else {
          backward(z1->loss(ids, tg));
          backward(z2->loss(ids, tg));
        }
      }
      const bool norms = one.clip_grad_norm(1.0) == two.clip_grad_norm(1.0);
      one.step();
      two.step();
      one.zero_grad(true);
      two.zero_grad(true);
      bool s = norms;
      for (auto& [name, t] : z1->named_parameters())
        s = s && nxd::testing::diff(z2->get_parameter(name).detach(), t.detach()).max_abs == 0;
      std::lock_guard<std::mutex> l(mu);
      same = same && s;
    }
  });
  EXPECT_TRUE(same);
}
