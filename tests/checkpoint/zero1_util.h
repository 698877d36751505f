#pragma once
// ZeRO-1 pieces of the checkpoint tests: the small Llama of ckpt_util.h trained with Zero1AdamW
// (small buckets, so parameters straddle DP ranks) or with AdamW (GradSync's DP mean), on batch
// shards that do not depend on the DP degree: a rank computes the mean loss over the shards it is
// given, so DP 4 with one shard per rank, DP 2 with two and one rank with all four take the same
// steps up to rounding.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt_util.h"
#include "nxd/optim/elementwise_optimizer.h"
#include "nxd/optim/grad_sync.h"
#include "nxd/optim/zero1.h"
#include "nxd/optim/zero3_unit.h"

namespace nxd::testing {

struct TraineeOptions {
  bool zero1 = false;  // Zero1AdamW, else AdamW
  uint64_t seed = 1;
  bool bf16 = false;  // bf16 parameters with f32 master weights
  bool lion = false;  // Lion (ZeRO-1 over its rule), else AdamW
  // zero1: the stage (three: every decoder layer a unit, optim/zero3_unit.h), the bucket size
  optim::ZeroStage stage = optim::ZeroStage::one;
  int64_t bucket_bytes = 3000;  // several buckets; parameters cut between DP ranks
  int layers = 0, hidden = 0;   // 0: ckpt_model_config's (hidden: FFN twice it, 2 KV heads)
  bool root = false;  // stage three: the embedding, final norm and head a unit too (the root)
};

struct Zero1Trainee {
  std::shared_ptr<CausalLM> model;
  std::unique_ptr<optim::Optimizer> opt;  // Zero1AdamW, or AdamW
  std::unique_ptr<optim::GradSync> sync;  // AdamW's DP mean
  std::unique_ptr<optim::LRSchedule> sched;

  Zero1Trainee(int tp, TraineeOptions o) {
    ModelConfig c = ckpt_model_config(tp);
    if (o.bf16) c.dtype = DType::bf16;
    if (o.layers) c.num_layers = o.layers;
    if (o.hidden) c.hidden_size = o.hidden, c.ffn_hidden_size = 2 * o.hidden;
    model = make_causal_lm(c, o.seed);
    std::vector<optim::NamedParam> ps;
    for (const auto& [n, t] : model->named_parameters()) ps.push_back({n, t});
    optim::AdamWOptions ao{0.9, 0.99, 1e-8};
    ao.precision.master_weights = o.bf16;
    auto groups = optim::default_param_groups(ps, 1e-2, 0.01);
    const optim::LionOptions lo{.beta1 = 0.9, .beta2 = 0.99, .precision = ao.precision};
    if (o.zero1) {
      optim::Zero1Options zo;
      zo.adamw = ao;
      if (o.lion) zo.rule = optim::lion_rule(lo);
      zo.registration_order = ps;
      zo.bucket_bytes = o.bucket_bytes;
      zo.stage = o.stage;
      if (o.stage == optim::ZeroStage::three)
        for (size_t i = 0; i < model->decoder_stack()->layers().size(); ++i)
          zo.units.push_back(model->decoder_stack()->layers()[i].get());
      if (o.root && o.stage == optim::ZeroStage::three) {
        // the final norm and head (and a tied embedding) a root unit; an untied embedding a
        // lookup unit of its own
        optim::UnitModules roots;
        optim::add_root_units({model.get()}, roots);
        zo.roots = roots.roots;
        zo.lookup_units = roots.lookups;
      }
      opt = std::make_unique<optim::Zero1AdamW>(std::move(groups), zo);
    } else {
      if (o.lion)
        opt = std::make_unique<optim::Lion>(std::move(groups), lo);
      else
        opt = std::make_unique<optim::AdamW>(std::move(groups), ao);
      if (parallel_state::get_data_parallel_size() > 1)
        sync = std::make_unique<optim::GradSync>(
            *model,
            optim::GradSyncOptions{.bucket_bytes = 1 << 14, .mode = optim::GradSyncMode::at_step});
    }
    sched = std::make_unique<optim::LRSchedule>(ckpt_schedule());
  }
  optim::Zero1AdamW* zero1() { return dynamic_cast<optim::Zero1AdamW*>(opt.get()); }

  static Tensor batch(int64_t step, const std::vector<int>& shards) {
    std::vector<int64_t> ids;
    for (int k : shards)
      for (int64_t i = 0; i < 2 * 9; ++i) ids.push_back((i * 7 + step * 5 + k * 3) % 32);
    return from_vector<int64_t>(ids, {2 * static_cast<int64_t>(shards.size()), 9});
  }
  // One step on the mean loss over `shards`.
  void step(int64_t step, const std::vector<int>& shards) {
    Tensor all = batch(step, shards);
    opt->set_lr(sched->lr(opt->steps()));
    backward(model->loss(all.narrow(1, 0, 8).contiguous(), all.narrow(1, 1, 8).contiguous()));
    if (sync) sync->finish();
    opt->step();
    opt->zero_grad(true);
  }
  double eval_loss() {
    NoGradGuard g;
    Tensor all = batch(100, {0, 1});
    return model->loss(all.narrow(1, 0, 8).contiguous(), all.narrow(1, 1, 8).contiguous()).item();
  }
};

// The shards DP rank r of n computes, out of 4.
inline std::vector<int> shards_of(int r, int n) {
  std::vector<int> s;
  for (int k = r * (4 / n); k < (r + 1) * (4 / n); ++k) s.push_back(k);
  return s;
}

// Copies of a sharded optimizer's records ("<param>.<what>" [lo, hi) and "<param>.step").
inline std::map<std::string, Tensor> shard_snapshot(const optim::Optimizer& o) {
  std::map<std::string, Tensor> s;
  for (const auto& r : o.sharded_state()) {
    for (const auto& [what, t] : r.tensors) s[r.param + "." + what] = t.clone();
    s[r.param + ".step"] = from_vector<int64_t>({r.step}, {});
  }
  return s;
}

// The full per-parameter state of either optimizer, in AdamW's names (ZeRO-1: gathered over DP,
// collective).
inline std::map<std::string, Tensor> full_state(optim::Optimizer& o) {
  std::map<std::string, Tensor> s;
  auto* z = dynamic_cast<optim::Zero1AdamW*>(&o);
  if (z) z->gather_state();
  for (const auto& [n, t] : o.state_tensors()) s[n] = t.clone();
  if (z) z->release_state();
  return s;
}

}  // namespace nxd::testing
