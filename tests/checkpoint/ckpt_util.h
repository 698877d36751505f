#pragma once
// Shared pieces of the checkpoint tests: a small Llama (GQA, so TP 4 replicates K/V), AdamW
// with NxD's groups, a cosine schedule, training steps, and snapshots of every tensor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "io/io_util.h"
#include "nxd/autograd/graph.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/optim/lr_schedule.h"
#include "nxd/optim/optimizer.h"
#include "support/compare.h"
#include "support/files.h"
#include "support/tiny_models.h"

namespace nxd::testing {

inline ModelConfig ckpt_model_config(int tp) {
  ModelConfig c = tiny_model("llama");
  c.vocab_size = 32;
  c.kv_size_multiplier = tp > 2 ? tp / 2 : 1;
  return c;
}

inline optim::LRScheduleOptions ckpt_schedule() {
  return {.kind = optim::ScheduleKind::cosine,
          .lr = 1e-2,
          .min_lr = 1e-3,
          .warmup_steps = 2,
          .decay_steps = 10};
}

// A model, its optimizer and schedule on the current TP group.
struct Trainee {
  std::shared_ptr<CausalLM> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::LRSchedule> sched;
  explicit Trainee(int tp, uint64_t seed = 1, optim::LRScheduleOptions so = ckpt_schedule()) {
    model = make_causal_lm(ckpt_model_config(tp), seed);
    std::vector<optim::NamedParam> ps;
    for (const auto& [n, t] : model->named_parameters()) ps.push_back({n, t});
    opt = std::make_unique<optim::AdamW>(optim::default_param_groups(ps, so.lr, 0.01));
    sched = std::make_unique<optim::LRSchedule>(so);
  }
  // One optimizer step on the batch of `step` (the same on every rank); returns the loss.
  double step(int64_t step) {
    std::vector<int64_t> ids(2 * 9);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + step * 5) % 32);
    Tensor all = from_vector<int64_t>(ids, {2, 9});
    Tensor x = all.narrow(1, 0, 8).contiguous(), y = all.narrow(1, 1, 8).contiguous();
    opt->set_lr(sched->lr(opt->steps()));
    Tensor loss = model->loss(x, y);
    backward(loss);
    opt->step();
    opt->zero_grad(true);
    return loss.item();
  }
  double eval_loss() {
    NoGradGuard g;
    std::vector<int64_t> ids(2 * 9);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 3 + 1) % 32);
    Tensor all = from_vector<int64_t>(ids, {2, 9});
    return model->loss(all.narrow(1, 0, 8).contiguous(), all.narrow(1, 1, 8).contiguous()).item();
  }
};

// Copies of every model tensor ("m:" + name) and optimizer state tensor ("o:" + name).
inline std::map<std::string, Tensor> snapshot(const Module& m, const optim::Optimizer* o) {
  std::map<std::string, Tensor> s;
  for (const auto& [n, t] : m.state_dict()) s["m:" + n] = t.detach().clone();
  if (o)
    for (const auto& [n, t] : o->state_tensors()) s["o:" + n] = t.detach().clone();
  return s;
}

inline void expect_same(const std::map<std::string, Tensor>& a,
                        const std::map<std::string, Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [n, t] : a) {
    auto it = b.find(n);
    ASSERT_NE(it, b.end()) << what << ": " << n;
    EXPECT_TRUE(bitwise_equal(t, it->second, what + ": " + n));
  }
}

}  // namespace nxd::testing
