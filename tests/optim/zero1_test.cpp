// ZeRO-1 (optim/zero1.h) against the unsharded path (GradSync's DP mean + parallel_grad_norm +
// AdamW) on the same ranks: 10 steps of a Llama at DP 2 and 4, and TP2 x DP2, with clipping —
// every parameter within 1e-6 of the unsharded run after each step, the norm within 1e-6; the
// optimizer state per rank (allocator counters) is 1/DP of AdamW's within 10% at DP 1, 2, 4, 8;
// the gathered state is AdamW's, and scattering it back resumes bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/optim/elementwise_optimizer.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/zero1.h"
#include "nxd/runtime/context.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "support/tiny_models.h"
#include "zero_util.h"

using namespace nxd;
using namespace nxd::optim;

namespace {

Tensor ids_for(int dp_rank, int step, int64_t vocab) {
  return nxd::testing::zero_ids(1000u, dp_rank, step, vocab);
}
using nxd::testing::named;

struct Worst {
  std::mutex mu;
  double param = 0, norm = 0;
  void add(double p, double n) {
    std::lock_guard<std::mutex> l(mu);
    param = std::max(param, p), norm = std::max(norm, n);
  }
};

// A user's optimizer (Adagrad: an elementwise rule of its own, one state tensor "sum"):
//   sum += g * g;   p -= lr * g / (sqrt(sum) + eps)
class UserAdagrad : public ElementwiseOptimizer {
 public:
  explicit UserAdagrad(std::vector<ParamGroup> groups)
      : ElementwiseOptimizer(std::move(groups), rule()) {}
  static ElementwiseRule rule() {
    ElementwiseRule r;
    r.kind = "UserAdagrad";
    r.state = {"sum"};
    r.hyperparameters = {{"eps", 1e-10}};
    r.update = [](const ElementwiseStep& e) {
      const float lr = static_cast<float>(e.lr);
      for (int64_t i = 0; i < e.n; ++i) {
        e.state[0][i] += e.g[i] * e.g[i];
        e.p[i] -= lr * e.g[i] / (std::sqrt(e.state[0][i]) + 1e-10f);
      }
    };
    return r;
  }
};

// The unsharded optimizer of a kind ("AdamW", "Lion", "SGD", "UserAdagrad").
std::unique_ptr<Optimizer> make_reference(const std::string& kind, std::vector<ParamGroup> g) {
  if (kind == "Lion") return std::make_unique<Lion>(std::move(g), LionOptions{0.9, 0.99});
  if (kind == "UserAdagrad") return std::make_unique<UserAdagrad>(std::move(g));
  if (kind == "SGD") return std::make_unique<SGD>(std::move(g), SGDOptions{.momentum = 0.9});
  return std::make_unique<AdamW>(std::move(g), AdamWOptions{0.9, 0.99, 1e-8});
}

// 10 steps of both paths on `world` ranks at tensor parallel size `tp`: the unsharded optimizer
// of `kind` after GradSync's DP mean, and ZeRO-1 over its elementwise rule.
void compare(int world, int tp, const std::string& kind = "AdamW") {
  Worst worst;
  nxd::testing::run_ranks(world, [&] {
    parallel_state::initialize_model_parallel(tp);
    ModelConfig c = nxd::testing::tiny_gqa_llama();
    c.kv_size_multiplier = std::max(1, tp / 2);
    auto ref = make_causal_lm(c, 5), z = make_causal_lm(c, 5);
    const double lr = kind == "Lion" ? 3e-3 : 3e-2;
    std::unique_ptr<Optimizer> adam =
        make_reference(kind, default_param_groups(named(*ref), lr, 0.1));
    GradSync sync(*ref, GradSyncOptions{1 << 14, GradSyncMode::at_step});
    const NormGroups groups = NormGroups::from_parallel_state();
    Zero1Options zo{AdamWOptions{0.9, 0.99, 1e-8}, nullptr, groups, norm_params(*z)};
    zo.rule = adam->elementwise_rule();
    Zero1Optimizer zero(default_param_groups(named(*z), lr, 0.1), zo);
    EXPECT_EQ(std::string(zero.kind()), kind);
    const int d = parallel_state::get_data_parallel_rank();
    for (int step = 0; step < 10; ++step) {
      Tensor ids = ids_for(d, step, c.vocab_size), tg = ids_for(d, 50 + step, c.vocab_size);
      backward(ref->loss(ids, tg));
      backward(z->loss(ids, tg));
      sync.finish();
      const double n1 = clip_parallel_grad_norm(norm_params(*ref), 0.5, groups);
      const double n2 = zero.clip_grad_norm(0.5);
      adam->step();
      zero.step();
      adam->zero_grad(true);
      zero.zero_grad(true);
      double p = 0;
      for (auto& [name, t] : ref->named_parameters()) {
        p = std::max(p, nxd::testing::diff(z->get_parameter(name).detach(), t.detach()).rel());
      }
      worst.add(p, std::abs(n2 - n1) / n1);
    }
  });
  std::printf("    [%s, world %d, tp %d] largest relative parameter difference %.3g, norm %.3g\n",
              kind.c_str(), world, tp, worst.param, worst.norm);
  EXPECT_LE(worst.param, 1e-6);
  EXPECT_LE(worst.norm, 1e-6);
}

}  // namespace

TEST(Zero1, MatchesAdamWAtDp2AndDp4) {
  compare(2, 1);
  compare(4, 1);
}

TEST(Zero1, MatchesAdamWWithTensorParallelism) {
  compare(4, 2);
}

TEST(Zero1, LionMatchesUnshardedLionAtDp2Dp4AndTp2) {
  compare(2, 1, "Lion");
  compare(4, 1, "Lion");
  compare(4, 2, "Lion");
}

TEST(Zero1, AUsersElementwiseOptimizerMatchesItsUnshardedSelf) {
  compare(2, 1, "UserAdagrad");
  compare(4, 1, "UserAdagrad");
}

TEST(Zero1, SgdWithMomentumMatchesUnshardedSgd) {
  compare(2, 1, "SGD");
}

TEST(Zero1, LionKeepsHalfOfAdamWsStateAndZero1OneOverDpOfIt) {
  nxd::testing::run_ranks(4, [&] {
    parallel_state::initialize_model_parallel(1);
    auto m = make_causal_lm(nxd::testing::tiny_gqa_llama(), 5);
    const auto groups = default_param_groups(named(*m), 1e-3, 0.0);
    Lion lion(groups);
    AdamW adam(groups);
    int64_t lion_moments = 0, adam_moments = 0;  // the per-element state (not the step counts)
    for (const auto& [n, t] : lion.state_tensors())
      if (t.dim() > 0) lion_moments += t.nbytes();
    for (const auto& [n, t] : adam.state_tensors())
      if (t.dim() > 0) adam_moments += t.nbytes();
    EXPECT_EQ(lion_moments * 2, adam_moments);
    Zero1Options zo;
    zo.rule = lion.elementwise_rule();
    Zero1Optimizer zero(groups, zo);
    // one f32 per element of this rank's shard: a quarter of Lion's at DP 4, plus padding
    EXPECT_EQ(zero.state_bytes(), zero.shard_elements() * 4);
    EXPECT_LE(zero.state_bytes(), lion_moments / 4 + 4 * 64);
  });
}

TEST(Zero1, OptimizerStateIsOneOverDpOfAdamW) {
  for (int dp : {1, 2, 4, 8}) {
    int64_t adam_bytes = 0, zero_bytes = 0, reported = 0;
    nxd::testing::run_ranks(dp, [&] {
      parallel_state::initialize_model_parallel(1);
      auto m = make_causal_lm(nxd::testing::tiny_gqa_llama(), 5);
      MemoryCounter& mem = current_context().memory();
      const int64_t before = mem.live();
      int64_t a = 0, z = 0, r = 0;
      {
        AdamW adam(default_param_groups(named(*m), 1e-3, 0.0));
        a = mem.live() - before;
      }
      {
        Zero1AdamW zero(default_param_groups(named(*m), 1e-3, 0.0), {});
        // the gradient buckets (the gradients' own memory) are not optimizer state
        z = mem.live() - before - zero.grad_sync().buffer_bytes();
        r = zero.state_bytes();
      }
      if (current_context().rank() == 0) adam_bytes = a, zero_bytes = z, reported = r;
    });
    const double ratio = static_cast<double>(zero_bytes) / adam_bytes;
    std::printf("    DP %d: AdamW state %lld bytes, ZeRO-1 %lld per rank (ratio %.3f, 1/DP %.3f)\n",
                dp, static_cast<long long>(adam_bytes), static_cast<long long>(zero_bytes), ratio,
                1.0 / dp);
    EXPECT_NEAR(ratio, 1.0 / dp, 0.1 / dp) << "DP " << dp;
    EXPECT_EQ(reported, zero_bytes);
  }
}

TEST(Zero1, GatheredStateIsAdamWsAndScattersBack) {
  nxd::testing::run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(1);
    auto ref = make_causal_lm(nxd::testing::tiny_gqa_llama(), 5),
         z = make_causal_lm(nxd::testing::tiny_gqa_llama(), 5);
    AdamW adam(default_param_groups(named(*ref), 1e-2, 0.0));
    GradSync sync(*ref, GradSyncOptions{1 << 14, GradSyncMode::at_step});
    Zero1AdamW zero(default_param_groups(named(*z), 1e-2, 0.0), {});
    const int d = parallel_state::get_data_parallel_rank();
    for (int step = 0; step < 3; ++step) {
      backward(ref->loss(ids_for(d, step, 64), ids_for(d, 9, 64)));
      backward(z->loss(ids_for(d, step, 64), ids_for(d, 9, 64)));
      sync.finish();
      adam.step();
      zero.step();
      adam.zero_grad(true);
      zero.zero_grad(true);
    }
    zero.gather_state();
    ASSERT_EQ(zero.state_tensors().size(), adam.state_tensors().size());
    for (size_t i = 0; i < adam.state_tensors().size(); ++i) {
      EXPECT_EQ(zero.state_tensors()[i].first, adam.state_tensors()[i].first);
      EXPECT_TRUE(nxd::testing::close_rel(zero.state_tensors()[i].second,
                                          adam.state_tensors()[i].second, 1e-6,
                                          zero.state_tensors()[i].first));
    }
    // a fresh ZeRO-1 optimizer given that state continues exactly as the first one
    Zero1AdamW again(default_param_groups(named(*z), 1e-2, 0.0), {});
    again.gather_state();  // lays out the tensors
    for (size_t i = 0; i < zero.state_tensors().size(); ++i)
      again.state_tensors()[i].second.copy_(zero.state_tensors()[i].second);
    again.scatter_state();
    again.release_state();
    EXPECT_TRUE(again.state_tensors().empty());
    auto z2 = make_causal_lm(nxd::testing::tiny_gqa_llama(), 5);
    for (auto& [n, t] : z2->named_parameters()) t.detach().copy_(z->get_parameter(n).detach());
    Zero1AdamW fresh(default_param_groups(named(*z2), 1e-2, 0.0), {});
    fresh.gather_state();
    for (size_t i = 0; i < zero.state_tensors().size(); ++i)
      fresh.state_tensors()[i].second.copy_(zero.state_tensors()[i].second);
    fresh.scatter_state();
    backward(z->loss(ids_for(d, 7, 64), ids_for(d, 9, 64)));
    backward(z2->loss(ids_for(d, 7, 64), ids_for(d, 9, 64)));
    zero.step();
    fresh.step();
    for (auto& [n, t] : z->named_parameters())
      EXPECT_TRUE(nxd::testing::bitwise_equal(z2->get_parameter(n).detach(), t.detach(), n));
  });
}

// Mixed precision: a bf16 model with f32 gradient accumulation, master weights and stochastic
// rounding. ZeRO-1 updates and rounds every element as AdamW does (the same noise for the same
// element): after 6 steps at DP 2 and 4 the parameters are bitwise those of GradSync + AdamW,
// with ZeRO-1's buckets reduce-scattered at the step or during backward (overlap).
TEST(Zero1, Bf16MasterWeightsAndStochasticRoundingMatchAdamWBitwise) {
  for (int dp : {2, 4})
    for (GradSyncMode mode : {GradSyncMode::at_step, GradSyncMode::overlap}) {
      SCOPED_TRACE(std::string("dp ") + std::to_string(dp) + " " + grad_sync_mode_name(mode));
      nxd::testing::run_ranks(dp, [&] {
        parallel_state::initialize_model_parallel(1);
        ModelConfig c = nxd::testing::tiny_gqa_llama();
        c.dtype = DType::bf16;
        auto ref = make_causal_lm(c, 5), z = make_causal_lm(c, 5);
        AdamWOptions ao{0.9, 0.99, 1e-8};
        ao.precision = {.master_weights = true, .stochastic_rounding = true, .seed = 9};
        AdamW adam(default_param_groups(named(*ref), 3e-2, 0.1), ao);
        GradSync sync(*ref, GradSyncOptions{.bucket_bytes = 1 << 13,
                                            .mode = GradSyncMode::at_step,
                                            .fp32_grad_acc = true});
        Zero1Options zo{ao, nullptr, {}, norm_params(*z)};
        zo.registration_order = named(*z);
        zo.bucket_bytes = 1 << 13;
        zo.mode = mode;
        Zero1AdamW zero(default_param_groups(named(*z), 3e-2, 0.1), zo);
        EXPECT_GT(zero.state_bytes(), 0);
        const int d = parallel_state::get_data_parallel_rank();
        for (int step = 0; step < 6; ++step) {
          Tensor ids = ids_for(d, step, c.vocab_size), tg = ids_for(d, 50 + step, c.vocab_size);
          backward(ref->loss(ids, tg));
          backward(z->loss(ids, tg));
          sync.finish();
          adam.step();
          zero.step();
          adam.zero_grad(true);
          zero.zero_grad(true);
        }
        for (auto& [name, t] : ref->named_parameters()) {
          ASSERT_EQ(t.dtype(), DType::bf16);
          EXPECT_BITWISE_EQ(z->get_parameter(name).detach(), t.detach()) << name;
        }
        // the gathered state is AdamW's, masters included
        zero.gather_state();
        std::map<std::string, Tensor> mine(zero.state_tensors().begin(),
                                           zero.state_tensors().end());
        ASSERT_EQ(mine.size(), adam.state_tensors().size());
        for (const auto& [name, t] : adam.state_tensors()) {
          ASSERT_TRUE(mine.count(name)) << name;
          EXPECT_BITWISE_EQ(mine[name], t) << name;
        }
        zero.release_state();
      });
    }
}
