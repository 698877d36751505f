#include "nxd/pipeline/executor.h"

#include <optional>

#include "nxd/autograd/graph.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/sim/clock.h"

namespace nxd::pipeline {

namespace {

constexpr int kHeader = 10;  // ndim, up to 8 dims, dtype
int act_tag(int stage) {
  return 3 * stage;
}
int grad_tag(int stage) {
  return 3 * stage + 1;
}
int shape_tag(int stage) {
  return 3 * stage + 2;
}

}  // namespace

Executor::Executor(std::shared_ptr<Communicator> group, ScheduleConfig cfg)
    : group_(std::move(group)), cfg_(cfg) {
  cfg_.validate();
  NXD_CHECK(group_, "[pipeline::Executor] no pipeline group");
  NXD_CHECK(group_->size() == cfg_.pp, "[pipeline::Executor] the pipeline group has ",
            group_->size(), " ranks, the schedule pp=", cfg_.pp);
  rank_ = group_->rank();
}

void Executor::send_activation(const Tensor& t, int to_stage, const Key& key) {
  const int dst = to_stage % cfg_.pp;
  Tensor buf = t.is_contiguous() ? t : t.contiguous();
  if (!shapes_.count(key)) {
    NXD_CHECK(buf.dim() <= kHeader - 2, "[pipeline] activation ", buf.desc(), " has more than ",
              kHeader - 2, " dims");
    Tensor h = zeros({kHeader}, DType::i64);
    int64_t* p = h.data<int64_t>();
    p[0] = buf.dim();
    for (int64_t d = 0; d < buf.dim(); ++d) p[1 + d] = buf.size(d);
    // the dtype, and 256 for a meta activation (a shape-only step: the receiver's is meta too)
    p[kHeader - 1] = static_cast<int64_t>(buf.dtype()) + (buf.is_meta() ? 256 : 0);
    pending_.emplace_back(group_->isend(h, dst, shape_tag(to_stage)), h);
    shapes_[key] = Meta{buf.shape(), buf.dtype(), buf.is_meta()};
  } else {
    const Meta& m = shapes_.at(key);
    NXD_CHECK_SHAPE(m.shape == buf.shape() && m.dtype == buf.dtype(), "[pipeline] stage ",
                    to_stage - 1, " sends ", buf.desc(), " where it sent ", shape_str(m.shape),
                    " before for the same microbatch shape");
  }
  pending_.emplace_back(group_->isend(buf, dst, act_tag(to_stage)), buf);
}

void Executor::send_gradient(const Tensor& t, int to_stage) {
  Tensor buf = t.is_contiguous() ? t : t.contiguous();
  pending_.emplace_back(group_->isend(buf, to_stage % cfg_.pp, grad_tag(to_stage)), buf);
}

Tensor Executor::recv_activation(int stage, const Key& key) {
  const int src = (stage - 1) % cfg_.pp;
  auto it = shapes_.find(key);
  if (it == shapes_.end()) {
    Tensor h = zeros({kHeader}, DType::i64);
    group_->recv(h, src, shape_tag(stage));
    const int64_t* p = h.data<int64_t>();
    Meta m;
    for (int64_t d = 0; d < p[0]; ++d) m.shape.push_back(p[1 + d]);
    m.dtype = static_cast<DType>(p[kHeader - 1] % 256);
    m.meta = p[kHeader - 1] >= 256;
    it = shapes_.emplace(key, m).first;
  }
  Tensor x =
      empty(it->second.shape, it->second.dtype, it->second.meta ? Device::meta : Device::host);
  group_->recv(x, src, act_tag(stage));
  return x;
}

namespace {
// A forward or backward on the sim timeline's phase lane ("F3", "B3c1"), so Perfetto shows the
// schedule's staircase; nothing without a recording sim clock.
// Its modeled time is added to `total`.
struct Phase {
  Phase(const Action& a, double& total) : action(a), total(total), clock(sim::current_sim_clock()) {
    if (clock) start = clock->now();
  }
  ~Phase() {
    if (!clock) return;
    total += clock->now() - start;
    if (clock->recording()) clock->record_phase(to_string(action), start, clock->now());
  }
  Action action;
  double& total;
  sim::SimClock* clock;
  double start = 0;
};
}  // namespace

StepResult Executor::run(StageRunner& runner, StepKind kind, int64_t mb_rows, int64_t seq_len) {
  const bool train = kind == StepKind::train;
  StepResult res;
  sim::SimClock* clock = sim::current_sim_clock();
  const double t0 = clock ? clock->now() : 0.0;
  const std::vector<Action> actions =
      train ? build_schedule(cfg_, rank_) : build_inference_schedule(cfg_, rank_);
  // per (chunk, microbatch): the received input, the output (activation or loss), its gradient
  std::map<std::pair<int, int>, Tensor> inputs, outputs, grads;
  std::optional<NoGradGuard> no_grad;
  if (!train) no_grad.emplace();
  for (const Action& a : actions) {
    const auto key = std::make_pair(a.chunk, a.microbatch);
    const int stage = stage_of(cfg_, rank_, a.chunk);
    switch (a.kind) {
      case ActionKind::recv_act: {
        Tensor x = recv_activation(stage, {stage, mb_rows, seq_len});
        if (train && is_floating(x.dtype())) x.set_requires_grad(true);
        inputs[key] = x;
        break;
      }
      case ActionKind::forward: {
        const Phase phase(a, res.phase_seconds);
        auto in = inputs.find(key);
        Tensor out =
            runner.forward(a.chunk, a.microbatch, in == inputs.end() ? Tensor() : in->second);
        if (is_last_stage(cfg_, rank_, a.chunk)) {
          NXD_CHECK_SHAPE(out.numel() == 1, "[pipeline] the last stage returned ", out.desc(),
                          ", not a scalar loss");
          res.losses.push_back(out.detach());
          if (!train) break;
        } else if (!train) {
          inputs.erase(key);
        }
        outputs[key] = out;
        break;
      }
      case ActionKind::send_act:
        send_activation(outputs.at(key).detach(), stage + 1, {stage + 1, mb_rows, seq_len});
        if (!train) outputs.erase(key);
        break;
      case ActionKind::recv_grad: {
        Tensor g = empty_like(outputs.at(key).detach());
        group_->recv(g, (stage + 1) % cfg_.pp, grad_tag(stage));
        grads[key] = g;
        break;
      }
      case ActionKind::backward: {
        const Phase phase(a, res.phase_seconds);
        Tensor out = outputs.at(key);
        if (is_last_stage(cfg_, rank_, a.chunk)) {
          nxd::backward(out);
        } else {
          nxd::backward({out}, {grads.at(key)});
          grads.erase(key);
        }
        outputs.erase(key);
        break;
      }
      case ActionKind::send_grad: {
        Tensor x = inputs.at(key);
        Tensor g = x.grad().defined() ? x.grad() : zeros_like(x);
        send_gradient(g, stage - 1);
        inputs.erase(key);
        break;
      }
    }
  }
  // On an exception the buffers stay in pending_ (a send may still read them) and the failure
  // reaches the peers through the backend.
  for (auto& w : pending_) w.first.wait();
  pending_.clear();
  if (clock) res.span_seconds = clock->now() - t0;
  return res;
}

}  // namespace nxd::pipeline
