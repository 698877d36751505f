// ZeRO-3 (Zero1Options::stage three, units = the decoder layers, layers/param_unit.h) against
// ZeRO-1 and the unsharded path (GradSync's DP mean + parallel_grad_norm + AdamW) on the same
// ranks: 20 steps of a 4-layer Llama at DP 2, DP 4 and TP 2 x DP 2 with clipping, at_step and
// overlap, with and without reshard_after_forward and with full activation recomputation. With
// one parameter per bucket (the same bucket layout as ZeRO-1's) every parameter and norm is
// bitwise ZeRO-1's; with ZeRO-1's default-size buckets (a unit's parameters in buckets of their
// own) within 1e-6 (the norm's partial sums go in another order); both within 1e-6 of plain DP.
// Between steps a rank holds every parameter (the root unit's: embedding, final norm, head, tied
// or not) only as its shard. Forwards without a graph (validation, generation) gather the root and
// release it. The same tests run under mpirun -np 4 (label mpi).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/param_unit.h"
#include "nxd/optim/grad_norm.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/zero1.h"
#include "nxd/optim/zero3_unit.h"
#include "support/compare.h"
#include "support/ranks.h"
#include "support/tiny_models.h"
#include "zero_util.h"

using namespace nxd;
using namespace nxd::optim;

namespace {

Tensor ids_for(int dp_rank, int step, int64_t vocab) {
  return nxd::testing::zero_ids(3000u, dp_rank, step, vocab);
}
using nxd::testing::named;

struct Case {
  int world = 2, tp = 1;
  GradSyncMode mode = GradSyncMode::at_step;
  int64_t bucket_bytes = 1;  // 1: a bucket per parameter (ZeRO-1's layout = ZeRO-3's)
  bool reshard_after_forward = true;
  bool recompute = false;
  bool tied = false;  // tie_word_embeddings: the root's embedding is its head
};

struct Worst {
  std::mutex mu;
  double param = 0, norm = 0, vs_zero1 = 0, resident = 0;
  int gathered_between_steps = 0;  // parameters whose full storage exists after a step
  bool ran = false;
  void add(double p, double n, double z, double r, int g) {
    std::lock_guard<std::mutex> l(mu);
    param = std::max(param, p), norm = std::max(norm, n), vs_zero1 = std::max(vs_zero1, z);
    resident = std::max(resident, r);
    gathered_between_steps = std::max(gathered_between_steps, g);
    ran = true;
  }
};

Zero1Options options(Module& m, ZeroStage stage, const Case& k) {
  Zero1Options zo{AdamWOptions{0.9, 0.99, 1e-8}, nullptr, NormGroups::from_parallel_state(),
                  norm_params(m)};
  zo.registration_order = nxd::testing::named(m);
  zo.bucket_bytes = k.bucket_bytes;
  zo.mode = k.mode;
  zo.stage = stage;
  if (stage == ZeroStage::three) {
    for (const auto& l : static_cast<CausalLM&>(m).decoder_stack()->layers())
      zo.units.push_back(l.get());
    // the final norm and head (and a tied embedding): FSDP's root unit; an untied embedding: a
    // lookup unit of its own
    UnitModules roots;
    add_root_units({&m}, roots);
    zo.roots = roots.roots;
    zo.lookup_units = roots.lookups;
    zo.reshard_after_forward = k.reshard_after_forward;
  }
  return zo;
}

void compare(const Case& k) {
  Worst worst;
  if (!nxd::testing::run_ranks(k.world, [&] {
        parallel_state::initialize_model_parallel(k.tp);
        ModelConfig c = nxd::testing::tiny_gqa_llama(4);
        c.kv_size_multiplier = std::max(1, k.tp / 2);
        if (k.recompute) c.activations_checkpoint_granularity = CheckpointGranularity::full;
        c.tie_word_embeddings = k.tied;
        auto ref = make_causal_lm(c, 5), z1 = make_causal_lm(c, 5), z3 = make_causal_lm(c, 5);
        AdamW adam(default_param_groups(named(*ref), 3e-2, 0.1), AdamWOptions{0.9, 0.99, 1e-8});
        GradSync sync(*ref, GradSyncOptions{1 << 14, GradSyncMode::at_step});
        const NormGroups groups = NormGroups::from_parallel_state();
        Zero1Optimizer one(default_param_groups(named(*z1), 3e-2, 0.1),
                           options(*z1, ZeroStage::one, k));
        Zero1Optimizer three(default_param_groups(named(*z3), 3e-2, 0.1),
                             options(*z3, ZeroStage::three, k));
        EXPECT_EQ(three.stage(), ZeroStage::three);
        int64_t full = 0;
        for (auto& [name, t] : z3->named_parameters()) full += t.nbytes();
        const double resident =
            static_cast<double>(three.resident_parameter_bytes()) / static_cast<double>(full);
        const int d = parallel_state::get_data_parallel_rank();
        for (int step = 0; step < 20; ++step) {
          Tensor ids = ids_for(d, step, c.vocab_size), tg = ids_for(d, 50 + step, c.vocab_size);
          backward(ref->loss(ids, tg));
          backward(z1->loss(ids, tg));
          backward(z3->loss(ids, tg));
          sync.finish();
          const double n0 = clip_parallel_grad_norm(norm_params(*ref), 0.5, groups);
          const double n1 = one.clip_grad_norm(0.5);
          const double n3 = three.clip_grad_norm(0.5);
          adam.step();
          one.step();
          three.step();
          adam.zero_grad(true);
          one.zero_grad(true);
          three.zero_grad(true);
          int gathered = 0;  // every unit, the root included, released between steps
          for (auto& [name, t] : z3->named_parameters()) gathered += t.storage()->has_data();
          three.gather_parameters();
          double p = 0, z = std::abs(n3 - n1) / n1;
          for (auto& [name, t] : ref->named_parameters()) {
            const Tensor w3 = z3->get_parameter(name).detach();
            p = std::max(p, nxd::testing::diff(w3, t.detach()).rel());
            z = std::max(z, nxd::testing::diff(w3, z1->get_parameter(name).detach()).max_abs);
          }
          three.release_parameters();
          worst.add(p, std::abs(n3 - n0) / n0, z, resident, gathered);
        }
      }))
    return;                // under an MPI world smaller than `world`
  if (!worst.ran) return;  // a process outside the first `world` of an MPI run
  const int dp = k.world / k.tp;
  std::printf(
      "    [world %d, tp %d, %s, buckets %lld B, reshard %d, recompute %d, tied %d] ZeRO-3 vs "
      "plain "
      "DP: parameters %.3g, norm %.3g; vs ZeRO-1: largest difference %.3g; parameters held "
      "between steps %.4f of the model (1/DP %.4f), %d of them gathered\n",
      k.world, k.tp, grad_sync_mode_name(k.mode), static_cast<long long>(k.bucket_bytes),
      k.reshard_after_forward, k.recompute, k.tied, worst.param, worst.norm, worst.vs_zero1,
      worst.resident, 1.0 / dp, worst.gathered_between_steps);
  EXPECT_LE(worst.param, 1e-6);
  EXPECT_LE(worst.norm, 1e-6);
  if (k.bucket_bytes == 1)
    EXPECT_EQ(worst.vs_zero1, 0.0);
  else
    EXPECT_LE(worst.vs_zero1, 1e-6);
  // every parameter, the root's (embedding, final norm, head) included, is held as its 1/DP shard
  // (plus its bucket's padding, less than DP elements a bucket) and released between steps
  EXPECT_LT(worst.resident, 1.0 / dp + 0.01);
  EXPECT_EQ(worst.gathered_between_steps, 0);
}

}  // namespace

TEST(Zero3, MatchesZero1AndPlainDpAtDp2AndDp4) {
  compare({.world = 2, .mode = GradSyncMode::at_step});
  compare({.world = 4, .mode = GradSyncMode::overlap});
  compare({.world = 4, .mode = GradSyncMode::overlap, .bucket_bytes = 1 << 14});
}

// Tied embeddings: the root's one weight is read by the embedding at the forward's start and by
// the head at its end, and gets its gradient from both (the head's first in backward).
TEST(Zero3, RootUnitWithTiedEmbeddings) {
  compare({.world = 2, .mode = GradSyncMode::at_step, .tied = true});
  compare({.world = 4, .mode = GradSyncMode::overlap, .tied = true});
  compare({.world = 4, .tp = 2, .mode = GradSyncMode::overlap, .tied = true});
}

TEST(Zero3, MatchesZero1AndPlainDpWithTensorParallelism) {
  compare({.world = 4, .tp = 2, .mode = GradSyncMode::overlap});
}

// A second stage-3 optimizer over a model the first one sharded (destroyed since) takes the
// weights back whole: two steps with each give ZeRO-1's parameters (restarted alike) bitwise.
TEST(Zero3, ASecondOptimizerOverTheSameModelTakesItsWeightsBack) {
  bool same = true;
  std::mutex mu;
  nxd::testing::run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(1);
    ModelConfig c = nxd::testing::tiny_gqa_llama(2);
    auto a = make_causal_lm(c, 5), b = make_causal_lm(c, 5);
    const Case k{.world = 2};
    const int d = parallel_state::get_data_parallel_rank();
    auto steps = [&](Module& m, Zero1Optimizer& o, int from) {
      for (int step = from; step < from + 2; ++step) {
        backward(static_cast<CausalLM&>(m).loss(ids_for(d, step, c.vocab_size),
                                                ids_for(d, 50 + step, c.vocab_size)));
        o.clip_grad_norm(0.5);
        o.step();
        o.zero_grad(true);
      }
    };
    // the same on ZeRO-1 (whose model keeps its weights): bitwise the same parameters
    for (Module* m : {static_cast<Module*>(a.get()), static_cast<Module*>(b.get())}) {
      const ZeroStage st = m == a.get() ? ZeroStage::three : ZeroStage::one;
      {
        Zero1Optimizer first(default_param_groups(named(*m), 3e-2, 0.1), options(*m, st, k));
        steps(*m, first, 0);
      }
      Zero1Optimizer second(default_param_groups(named(*m), 3e-2, 0.1), options(*m, st, k));
      steps(*m, second, 2);
      second.gather_parameters();  // stays whole: the optimizer goes first
    }
    bool s = true;
    for (auto& [name, t] : a->named_parameters())
      s = s && nxd::testing::diff(t.detach(), b->get_parameter(name).detach()).max_abs == 0;
    std::lock_guard<std::mutex> l(mu);
    same = same && s;
  });
  EXPECT_TRUE(same);
}

TEST(Zero3, KeepsParametersFromForwardToBackwardAndComposesWithRecomputation) {
  compare({.world = 2, .mode = GradSyncMode::overlap, .reshard_after_forward = false});
  compare({.world = 2, .mode = GradSyncMode::overlap, .recompute = true});
}

// Between steps, forwards without a graph read the root's weights: a validation loss and logits
// give ZeRO-1's results bitwise and leave every parameter released, as do generation with the KV
// cache and reading the weights inside WholeParameters.
TEST(Zero3, RootUnitServesForwardsWithoutAGraphAndLeavesThemReleased) {
  int gathered = 0;
  double worst = 0;
  std::mutex mu;
  nxd::testing::run_ranks(2, [&] {
    parallel_state::initialize_model_parallel(1);
    const ModelConfig c = nxd::testing::tiny_gqa_llama(2);
    auto z1 = make_causal_lm(c, 5), z3 = make_causal_lm(c, 5);
    const Case k{.world = 2, .mode = GradSyncMode::overlap};
    Zero1Optimizer one(default_param_groups(named(*z1), 3e-2, 0.1),
                       options(*z1, ZeroStage::one, k));
    Zero1Optimizer three(default_param_groups(named(*z3), 3e-2, 0.1),
                         options(*z3, ZeroStage::three, k));
    const int d = parallel_state::get_data_parallel_rank();
    int g = 0;
    double w = 0;
    auto released = [&] {
      for (auto& [name, t] : z3->named_parameters()) g += t.storage()->has_data();
    };
    for (int step = 0; step < 2; ++step) {
      const Tensor ids = ids_for(d, step, c.vocab_size), tg = ids_for(d, 50 + step, c.vocab_size);
      for (auto* o : {&one, &three}) {
        backward((o == &one ? z1 : z3)->loss(ids, tg));
        o->clip_grad_norm(0.5);
        o->step();
        o->zero_grad(true);
      }
      released();
      NoGradGuard ng;
      w = std::max(w, nxd::testing::diff(z3->loss(ids, tg), z1->loss(ids, tg)).max_abs);
      w = std::max(w, nxd::testing::diff(z3->forward(ids), z1->forward(ids)).max_abs);
      released();
      const GenerateOptions go{.max_new_tokens = 4, .temperature = 0};
      const std::vector<int64_t> prompt = {1, 2, 3};
      // the KV-cache path gathers each layer for its step (and the root by its scope)
      w = std::max(w, z3->generate(prompt, go) == z1->generate(prompt, go) ? 0.0 : 1.0);
      released();
      {  // inside WholeParameters the same generation leaves every layer whole
        const WholeParameters whole({z3.get()});
        w = std::max(w, z3->generate(prompt, go) == z1->generate(prompt, go) ? 0.0 : 1.0);
        for (auto& [name, t] : z1->named_parameters())
          w = std::max(w, nxd::testing::diff(z3->get_parameter(name).detach(), t.detach()).max_abs);
      }
      released();
    }
    std::lock_guard<std::mutex> l(mu);
    gathered = std::max(gathered, g);
    worst = std::max(worst, w);
  });
  std::printf(
      "    ZeRO-3 vs ZeRO-1 without a graph (loss, logits, generation, the weights): largest "
      "difference %.3g; parameters left gathered %d\n",
      worst, gathered);
  EXPECT_EQ(worst, 0.0);
  EXPECT_EQ(gathered, 0);
}

// An untied embedding is a lookup unit of its own: gathered for the lookup and released right
// after it, so between the forward and the backward only the root's final norm and head are
// gathered (the embedding's backward reads no weight); a tied one is the head's weight and stays
// in the root unit, gathered until the head's backward. Either way every parameter is released
// after the backward.
TEST(Zero3, EmbeddingIsGatheredForItsLookupAloneUnlessTied) {
  for (const bool tied : {false, true}) {
    // counts over the ranks this process ran (both under sim, its own under mpirun)
    int embedding_gathered = 0, head_gathered = 0, left = 0, lookups = 0, ran = 0;
    std::mutex mu;
    nxd::testing::run_ranks(2, [&] {
      parallel_state::initialize_model_parallel(1);
      ModelConfig c = nxd::testing::tiny_gqa_llama(2);
      c.tie_word_embeddings = tied;
      auto z3 = make_causal_lm(c, 5);
      Zero1Optimizer three(default_param_groups(named(*z3), 3e-2, 0.1),
                           options(*z3, ZeroStage::three, Case{.world = 2, .tied = tied}));
      const int d = parallel_state::get_data_parallel_rank();
      const Tensor loss = z3->loss(ids_for(d, 0, c.vocab_size), ids_for(d, 50, c.vocab_size));
      const Tensor& emb = z3->get_parameter("model.embed_tokens.weight");
      const Tensor& head = z3->get_parameter(tied ? "model.embed_tokens.weight" : "lm_head.weight");
      const int e = emb.storage()->has_data(), h = head.storage()->has_data();
      const int n = z3->decoder_stack()->lookup_unit_module() ? 1 : 0;
      backward(loss);
      int g = 0;
      for (auto& [name, t] : z3->named_parameters()) g += t.storage()->has_data();
      std::lock_guard<std::mutex> l(mu);
      embedding_gathered += e, head_gathered += h, left += g, lookups += n, ++ran;
    });
    std::printf(
        "    %s head: after the forward the embedding is gathered on %d of %d ranks, the head on "
        "%d; parameters gathered after the backward %d\n",
        tied ? "tied" : "untied", embedding_gathered, ran, head_gathered, left);
    EXPECT_EQ(lookups, tied ? 0 : ran);
    EXPECT_EQ(embedding_gathered, tied ? ran : 0);
    EXPECT_EQ(head_gathered, ran);
    EXPECT_EQ(left, 0);
  }
}
