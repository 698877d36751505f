// LoRA fine-tuning through NxD's API (NxDConfig::lora_config): 20 AdamW steps of a tiny GQA Llama
// with adapters on every projection at TP 1/2/4 x DP, SP, full activation recomputation, ZeRO-1
// and a pipeline, against one rank: every loss, gradient norm and adapter gradient (ZeRO-1: each
// rank's shard of it; the pipeline: losses and norms) within 1e-5;
// the base weights bitwise unchanged; optimizer state for the adapters only.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <mutex>

#include "nxd/api/nxd_api.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/lora.h"
#include "support/compare.h"
#include "support/lora.h"
#include "support/ranks.h"
#include "support/tiny_models.h"

using namespace nxd;
using namespace nxd::api;

namespace {

constexpr int kSteps = 20;
constexpr int kDpBatches = 2;
constexpr double kEps = 1e-4;  // the global batch: two [4, 16] batches

LoraConfig lora() {
  return nxd::testing::every_projection_lora();
}

Tensor batch_ids(int q, int step) {
  return nxd::testing::random_ids(900u + static_cast<uint64_t>(step), static_cast<uint64_t>(q), 64);
}

struct LoraRun {
  std::vector<double> losses, norms;
  // one rank: the full adapter gradients of every step
  std::vector<std::map<std::string, Tensor>> grads;
  double worst_grad = 0;  // parallel runs: the largest relative difference to the one-rank grads
  std::string worst_name;
  int64_t optimizer_params = 0, model_params = 0;
};

// This rank's part of a full (one-rank) adapter tensor: B of a column layer and A of a row layer
// are split as their layer's weight (K/V: the replica's block), the other is replicated.
Tensor local_part(Module& m, const std::string& name, const Tensor& full) {
  const std::string layer = name.substr(0, name.rfind(".lora_"));
  for (auto& [n, mod] : m.named_modules())
    if (n == layer) {
      LoraTarget t;
      if (!dynamic_cast<ParallelModule*>(mod)->lora_target(t)) break;
      const bool b = name.ends_with("lora_B.weight");
      if (t.style == LoraTarget::Style::column && b) return full.narrow(0, t.out0, t.local_out);
      if (t.style == LoraTarget::Style::row && !b) return full.narrow(1, t.in0, t.local_in);
      return full;
    }
  throw InvalidArgument("no layer " + layer);
}

// kSteps of AdamW (lr 1e-2, no clipping: the gradients after step() are the DP mean) on `world`
// ranks. eps 1e-4 rather than 1e-8: AdamW's m / (sqrt(v) + eps) turns an element whose gradient is
// rounding noise (~1e-9) into a step of +-lr whose sign is the noise's, and later steps' gradients
// then differ by far more than the parallel computation does (with eps 1e-8 the adapter gradients
// drifted to 4e-5 by step 19 while every loss stayed within 1.2e-7); with eps 1e-4 such an element
// moves by at most lr * 1e-5, and the comparison measures the parallel layout. `ref`: the one-rank
// run whose gradients each step is compared with (null: record them).
LoraRun train(int world, NxDConfig want, const LoraRun* ref) {
  LoraRun out;
  std::mutex mu;
  nxd::testing::run_ranks(world, [&] {
    want.lora_config = lora();
    want.optimizer_config.grad_clipping = false;
    const NxDConfig cfg = neuronx_distributed_config(want);
    ModelConfig mc = nxd::testing::tiny_gqa_llama(4);
    mc.kv_size_multiplier = std::max(1, cfg.tensor_parallel_size / 2);
    auto model = initialize_parallel_model(cfg, mc, 3);
    std::map<std::string, Tensor> base;
    for (const auto& p : model->local_named_parameters())
      if (!is_lora_name(p.name)) base[p.name] = p.param.detach().clone();
    auto opt = initialize_parallel_optimizer(
        cfg, *model, optim::default_param_groups(model->local_named_parameters(), 1e-2, 0.0),
        optim::AdamWOptions{.eps = kEps});
    const int dp = parallel_state::get_data_parallel_size();
    const int d = parallel_state::get_data_parallel_rank();
    const bool zero1 = cfg.optimizer_config.zero_one_enabled;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<Tensor> ids, tg;
      for (int q = 0; q < kDpBatches; ++q)
        if (dp == 1 || q % dp == d) {
          ids.push_back(batch_ids(q, step));
          tg.push_back(batch_ids(q, 100 + step));
        }
      Tensor lt = model->run_train(cat_raw(ids, 0), cat_raw(tg, 0)).detach().clone();
      if (dp > 1 && !model->is_pipeline())  // the pipeline's loss is already the DP mean
        parallel_state::get_data_parallel_group().all_reduce(lt, ReduceOp::avg);
      const double loss = lt.item();
      opt->step();
      if (!ref && !model->is_pipeline()) {
        // the reference gradients: rank 0's (every rank of a run without a reference used to
        // push into the shared vector at once, a data race that corrupted the heap at TP 2)
        std::map<std::string, Tensor> g;
        for (auto& [n, t] : lora_parameters(model->local_module())) g[n] = t.grad().clone();
        std::lock_guard<std::mutex> l(mu);
        if (current_context().rank() == 0) out.grads.push_back(std::move(g));
      } else if (ref && !model->is_pipeline()) {
        // the DP mean of every adapter gradient; with ZeRO-1 only this rank's shard of each
        // (the elements [lo, hi) its bucket shards cover) holds it
        Module& m = model->local_module();
        std::map<std::string, std::pair<int64_t, int64_t>> range;
        if (zero1)
          for (const auto& sh : opt->inner().sharded_state()) range[sh.param] = {sh.lo, sh.hi};
        for (auto& [n, t] : lora_parameters(m)) {
          Tensor got = t.grad().contiguous().reshape({-1});
          Tensor want_g = local_part(m, n, ref->grads[step].at(n)).contiguous().reshape({-1});
          if (zero1) {
            const auto [lo, hi] = range.at(n);
            if (lo == hi) continue;
            got = got.narrow(0, lo, hi - lo);
            want_g = want_g.narrow(0, lo, hi - lo);
          }
          const double r = nxd::testing::diff(got, want_g).rel();
          std::lock_guard<std::mutex> l(mu);
          if (r > out.worst_grad)
            out.worst_grad = r, out.worst_name = n + " step " + std::to_string(step);
        }
      }
      opt->zero_grad();
      if (current_context().rank() == 0) {
        out.losses.push_back(loss);
        out.norms.push_back(opt->grad_norm().value());
      }
    }
    int64_t in_opt = 0;
    for (const auto& g : opt->inner().param_groups())
      for (const auto& p : g.params) in_opt += p.param.numel();
    for (const auto& p : model->local_named_parameters()) {
      if (is_lora_name(p.name)) {
        EXPECT_TRUE(p.param.requires_grad()) << p.name;
        continue;
      }
      EXPECT_FALSE(p.param.requires_grad()) << p.name;
      EXPECT_BITWISE_EQ(p.param.detach(), base.at(p.name)) << p.name;
    }
    if (current_context().rank() == 0) {
      out.optimizer_params = in_opt;
      for (const auto& p : model->local_named_parameters()) out.model_params += p.param.numel();
    }
  });
  return out;
}

void expect_matches(const LoraRun& one, const LoraRun& par, const char* what) {
  ASSERT_EQ(par.losses.size(), one.losses.size());
  double wl = 0, wn = 0;
  for (size_t i = 0; i < one.losses.size(); ++i) {
    wl = std::max(wl, std::abs(par.losses[i] - one.losses[i]) / std::abs(one.losses[i]));
    wn = std::max(wn, std::abs(par.norms[i] - one.norms[i]) / one.norms[i]);
  }
  std::printf(
      "    %s vs one rank over %d steps: largest relative difference loss %.3g, grad norm %.3g, "
      "adapter gradient %.3g (%s)\n",
      what, kSteps, wl, wn, par.worst_grad,
      par.worst_name.empty() ? "not compared: the pipeline's stages" : par.worst_name.c_str());
  EXPECT_LE(wl, 1e-5) << what;
  EXPECT_LE(wn, 1e-5) << what;
  EXPECT_LE(par.worst_grad, 1e-5) << what;
  EXPECT_GT(one.losses.front() - one.losses.back(), 0.01) << "the adapters did not train";
}

const LoraRun& one_rank() {
  static const LoraRun r = train(1, NxDConfig{}, nullptr);
  return r;
}

}  // namespace

TEST(LoraTrain, OneRankTrainsTheAdaptersOnly) {
  const LoraRun& one = one_rank();
  std::printf("    loss %.4f -> %.4f; optimizer holds %lld of %lld parameters\n",
              one.losses.front(), one.losses.back(), static_cast<long long>(one.optimizer_params),
              static_cast<long long>(one.model_params));
  EXPECT_GT(one.losses.front() - one.losses.back(), 0.01);
  // rank 4 on q,k,v,o (hidden 32, q 32, kv 16) and gate/up/down (ffn 48), 4 layers
  const int64_t per_layer = 4 * ((32 + 32) + (32 + 16) * 2 + (32 + 32) + (32 + 48) * 2 + (48 + 32));
  EXPECT_EQ(one.optimizer_params, 4 * per_layer);
}

TEST(LoraTrain, Tp2Dp2MatchesOneRank) {
  NxDConfig c;
  c.tensor_parallel_size = 2;
  expect_matches(one_rank(), train(4, c, &one_rank()), "TP2 x DP2");
}

TEST(LoraTrain, Tp4ReplicatedKvMatchesOneRank) {
  NxDConfig c;
  c.tensor_parallel_size = 4;
  expect_matches(one_rank(), train(4, c, &one_rank()), "TP4 (KV x2)");
}

TEST(LoraTrain, Tp2SequenceParallelRecomputeMatchesOneRank) {
  NxDConfig c;
  c.tensor_parallel_size = 2;
  c.sequence_parallel = true;
  c.activation_checkpoint_config = "full";
  expect_matches(one_rank(), train(2, c, &one_rank()), "TP2 SP + full recompute");
}

TEST(LoraTrain, Zero1Tp2Dp2MatchesOneRank) {
  NxDConfig c;
  c.tensor_parallel_size = 2;
  c.optimizer_config.zero_one_enabled = true;
  expect_matches(one_rank(), train(4, c, &one_rank()), "TP2 x DP2 ZeRO-1");
}

TEST(LoraTrain, Zero1Tp4Dp2MatchesOneRank) {
  NxDConfig c;
  c.tensor_parallel_size = 4;
  c.optimizer_config.zero_one_enabled = true;
  expect_matches(one_rank(), train(8, c, &one_rank()), "TP4 (KV x2) x DP2 ZeRO-1");
}

TEST(LoraTrain, Zero1Dp2Tp1MatchesOneRank) {
  NxDConfig c;
  c.optimizer_config.zero_one_enabled = true;
  expect_matches(one_rank(), train(2, c, &one_rank()), "DP2 ZeRO-1");
}

TEST(LoraTrain, PipelineZero1MatchesOneRank) {
  NxDConfig c;
  c.pipeline_parallel_size = 2;
  c.pipeline_config.num_microbatches = 2;
  c.optimizer_config.zero_one_enabled = true;
  expect_matches(one_rank(), train(4, c, &one_rank()), "PP2 x DP2 ZeRO-1");
}

// NxD Training's LoRA runs keep the base in bf16: mixed_precision at TP 2, the frozen bf16 base
// bitwise unchanged, the adapters (bf16, f32 master weights in AdamW) training.
TEST(LoraTrain, MixedPrecisionKeepsTheBf16BaseFrozen) {
  NxDConfig c;
  c.tensor_parallel_size = 2;
  c.precision = "mixed_precision";
  const LoraRun r = train(2, c, nullptr);
  std::printf("    mixed_precision TP2: loss %.4f -> %.4f\n", r.losses.front(), r.losses.back());
  EXPECT_GT(r.losses.front() - r.losses.back(), 0.01);
  EXPECT_NEAR(r.losses.front(), one_rank().losses.front(), 1e-2);  // bf16 weights: close
}
