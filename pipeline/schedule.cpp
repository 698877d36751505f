#include "nxd/pipeline/schedule.h"

#include <algorithm>
#include <compare>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "nxd/runtime/error.h"

namespace nxd::pipeline {

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& s) {
  if (s == "gpipe") return ScheduleKind::gpipe;
  if (s == "1f1b") return ScheduleKind::one_f_one_b;
  if (s == "interleaved") return ScheduleKind::interleaved;
  throw ConfigError("unknown pipeline schedule '" + s + "' (expected gpipe, 1f1b or interleaved)");
}

const char* action_name(ActionKind k) {
  switch (k) {
    case ActionKind::recv_act:
      return "recv_act";
    case ActionKind::forward:
      return "F";
    case ActionKind::send_act:
      return "send_act";
    case ActionKind::recv_grad:
      return "recv_grad";
    case ActionKind::backward:
      return "B";
    case ActionKind::send_grad:
      return "send_grad";
  }
  return "?";
}

std::string to_string(const Action& a) {
  std::ostringstream o;
  o << action_name(a.kind);
  if (a.kind != ActionKind::forward && a.kind != ActionKind::backward) o << ' ';
  o << a.microbatch;
  if (a.chunk != 0) o << 'c' << a.chunk;
  return o.str();
}

ScheduleConfig ScheduleConfig::checked(int pp, int num_microbatches, int vpp, ScheduleKind kind) {
  const ScheduleConfig c{.pp = pp, .num_microbatches = num_microbatches, .vpp = vpp, .kind = kind};
  c.validate();
  return c;
}

void ScheduleConfig::validate() const {
  auto fail = [&](const std::string& why) {
    std::ostringstream o;
    o << "pipeline schedule " << schedule_name(kind) << " with pp=" << pp
      << " microbatches=" << num_microbatches << " vpp=" << vpp << ": " << why;
    throw ConfigError(o.str());
  };
  if (pp < 1) fail("pp must be >= 1");
  if (num_microbatches < 1) fail("the number of microbatches must be >= 1");
  if (vpp < 1) fail("vpp must be >= 1");
  if (kind != ScheduleKind::interleaved && vpp > 1)
    fail("virtual pipeline stages (vpp > 1) need the interleaved schedule");
  if (kind == ScheduleKind::interleaved) {
    if (vpp < 2) fail("the interleaved schedule needs vpp >= 2");
    if (pp < 2) fail("the interleaved schedule needs pp >= 2");
    if (num_microbatches % pp != 0)
      fail("the interleaved schedule needs the microbatches to be a multiple of pp");
  }
}

ScheduleConfig resolve_schedule(const PipelineJob& j) {
  auto fail = [](auto&&... a) { throw ConfigError(str(a...)); };
  if (j.pipeline_model_parallel_size < 1)
    fail("distributed_strategy.pipeline_model_parallel_size must be >= 1, got ",
         j.pipeline_model_parallel_size);
  if (j.virtual_pipeline_model_parallel_size < 1)
    fail("distributed_strategy.virtual_pipeline_model_parallel_size must be >= 1, got ",
         j.virtual_pipeline_model_parallel_size);
  if (j.micro_batch_size < 1 || j.data_parallel_size < 1 ||
      j.global_batch_size % (j.micro_batch_size * j.data_parallel_size) != 0 ||
      j.global_batch_size < j.micro_batch_size * j.data_parallel_size)
    fail("data.global_batch_size=", j.global_batch_size,
         " is not a positive multiple of data.micro_batch_size=", j.micro_batch_size,
         " x data-parallel size ", j.data_parallel_size);
  ScheduleConfig c;
  c.pp = j.pipeline_model_parallel_size;
  c.vpp = j.virtual_pipeline_model_parallel_size;
  c.num_microbatches =
      static_cast<int>(j.global_batch_size / (j.micro_batch_size * j.data_parallel_size));
  c.kind = j.pipeline_schedule;
  if (c.vpp > 1 && c.kind != ScheduleKind::interleaved)
    fail("distributed_strategy.virtual_pipeline_model_parallel_size=", c.vpp,
         " needs distributed_strategy.pipeline_schedule=interleaved (got ",
         schedule_name(j.pipeline_schedule), ")");
  if (j.num_layers < static_cast<int64_t>(c.pp) * c.vpp)
    fail("model.num_layers=", j.num_layers,
         " cannot be cut into pipeline_model_parallel_size=", c.pp,
         " x virtual_pipeline_model_parallel_size=", c.vpp, " stages of at least one layer each");
  c.validate();  // interleaved: vpp >= 2, pp >= 2, microbatches a multiple of pp
  return c;
}

namespace {

struct Builder {
  const ScheduleConfig& c;
  int r;
  std::vector<Action> out;
  bool first(int chunk) const { return is_first_stage(c, r, chunk); }
  bool last(int chunk) const { return is_last_stage(c, r, chunk); }
  void add(ActionKind k, int mb, int chunk) { out.push_back({k, mb, chunk}); }
  // recv_act, F, and send_act unless deferred
  void fwd(int mb, int chunk, bool send = true) {
    if (!first(chunk)) add(ActionKind::recv_act, mb, chunk);
    add(ActionKind::forward, mb, chunk);
    if (send && !last(chunk)) add(ActionKind::send_act, mb, chunk);
  }
  // recv_grad, the deferred send of forward `deferred_mb` (>= 0), B, send_grad
  void bwd(int mb, int chunk, int deferred_mb = -1) {
    if (!last(chunk)) add(ActionKind::recv_grad, mb, chunk);
    if (deferred_mb >= 0 && !last(chunk)) add(ActionKind::send_act, deferred_mb, chunk);
    add(ActionKind::backward, mb, chunk);
    if (!first(chunk)) add(ActionKind::send_grad, mb, chunk);
  }
};

void gpipe(Builder& b) {
  const int M = b.c.num_microbatches;
  for (int i = 0; i < M; ++i) b.fwd(i, 0);
  for (int i = 0; i < M; ++i) b.bwd(i, 0);
}

void one_f_one_b(Builder& b) {
  const int M = b.c.num_microbatches;
  const int warmup = std::min(b.c.pp - b.r - 1, M), steady = M - warmup;
  for (int i = 0; i < warmup; ++i) b.fwd(i, 0);
  for (int i = 0; i < steady; ++i) {
    b.fwd(i + warmup, 0, /*send=*/false);  // sent after the next backward's gradient arrives
    b.bwd(i, 0, /*deferred_mb=*/i + warmup);
  }
  for (int j = 0; j < warmup; ++j) b.bwd(steady + j, 0);
}

void interleaved(Builder& b) {
  const int pp = b.c.pp, vpp = b.c.vpp, M = b.c.num_microbatches, total = M * vpp;
  const int warmup = M == pp ? total : std::min((pp - b.r - 1) * 2 + (vpp - 1) * pp, total);
  const int steady = total - warmup;
  // the k-th forward runs chunks 0, 1, .., vpp-1 in turn (pp microbatches each); the k-th
  // backward the same chunks in reverse
  auto fwd_chunk = [&](int k) { return (k % (pp * vpp)) / pp; };
  auto bwd_chunk = [&](int k) { return vpp - 1 - fwd_chunk(k); };
  auto mb_of = [&](int k) { return (k / (pp * vpp)) * pp + k % pp; };
  for (int k = 0; k < warmup; ++k) b.fwd(mb_of(k), fwd_chunk(k));
  for (int i = 0; i < steady; ++i) {
    const int k = warmup + i;
    b.fwd(mb_of(k), fwd_chunk(k));
    b.bwd(mb_of(i), bwd_chunk(i));
  }
  for (int k = steady; k < total; ++k) b.bwd(mb_of(k), bwd_chunk(k));
}

}  // namespace

std::vector<Action> build_schedule(const ScheduleConfig& cfg, int rank) {
  cfg.validate();
  NXD_CHECK(rank >= 0 && rank < cfg.pp, "[build_schedule] rank ", rank, " outside [0, ", cfg.pp,
            ")");
  Builder b{cfg, rank, {}};
  switch (cfg.kind) {
    case ScheduleKind::gpipe:
      gpipe(b);
      break;
    case ScheduleKind::one_f_one_b:
      one_f_one_b(b);
      break;
    case ScheduleKind::interleaved:
      interleaved(b);
      break;
  }
  return std::move(b.out);
}

std::vector<std::vector<Action>> build_schedules(const ScheduleConfig& cfg) {
  cfg.validate();
  std::vector<std::vector<Action>> all;
  for (int r = 0; r < cfg.pp; ++r) all.push_back(build_schedule(cfg, r));
  return all;
}

std::vector<Action> build_inference_schedule(const ScheduleConfig& cfg, int rank) {
  cfg.validate();
  NXD_CHECK(rank >= 0 && rank < cfg.pp, "[build_inference_schedule] rank ", rank, " outside [0, ",
            cfg.pp, ")");
  Builder b{cfg, rank, {}};
  for (int mb = 0; mb < cfg.num_microbatches; ++mb)
    for (int c = 0; c < cfg.vpp; ++c) b.fwd(mb, c);
  return std::move(b.out);
}

std::string compute_order(const std::vector<Action>& actions) {
  std::string s;
  for (const Action& a : actions) {
    if (a.kind != ActionKind::forward && a.kind != ActionKind::backward) continue;
    if (!s.empty()) s += ' ';
    s += to_string(a);
  }
  return s;
}

double analytical_bubble(const ScheduleConfig& cfg) {
  const double p = cfg.pp, m = cfg.num_microbatches;
  const double b = (p - 1) / (m + p - 1);
  return cfg.kind == ScheduleKind::interleaved ? b / cfg.vpp : b;
}

namespace {

// A message channel: activations or gradients bound for one stage. Its two ends are fixed ranks.
struct Channel {
  bool activation = true;  // else gradients
  int to_stage = 0;
  auto operator<=>(const Channel&) const = default;
};

struct Sim {
  const ScheduleConfig& c;
  const std::vector<std::vector<Action>>& s;
  SendModel model;
  std::vector<size_t> pc;
  std::map<Channel, std::deque<int>> queue;  // sent, not yet received microbatches
  std::set<std::tuple<int, int, int>> received_act, received_grad, fwd_done, bwd_done;  // r,c,mb
  std::vector<int> live, max_live;
  std::string error;

  bool done(int r) const { return pc[r] >= s[r].size(); }
  static bool is_send(ActionKind k) {
    return k == ActionKind::send_act || k == ActionKind::send_grad;
  }
  static bool is_recv(ActionKind k) {
    return k == ActionKind::recv_act || k == ActionKind::recv_grad;
  }
  // The channel of a send or receive and the rank at its other end.
  std::pair<Channel, int> channel(int r, const Action& a) const {
    const int st = stage_of(c, r, a.chunk);
    switch (a.kind) {
      case ActionKind::send_act:
        return {{.activation = true, .to_stage = st + 1}, (st + 1) % c.pp};
      case ActionKind::recv_act:
        return {{.activation = true, .to_stage = st}, (st - 1) % c.pp};
      case ActionKind::send_grad:
        return {{.activation = false, .to_stage = st - 1}, (st - 1) % c.pp};
      default:
        return {{.activation = false, .to_stage = st}, (st + 1) % c.pp};  // recv_grad
    }
  }
  bool fail(int r, const Action& a, const std::string& why) {
    error = "rank " + std::to_string(r) + " " + to_string(a) + ": " + why;
    return false;
  }
  bool stage_ok(int r, const Action& a) {
    const int st = stage_of(c, r, a.chunk);
    if (a.chunk < 0 || a.chunk >= c.vpp) return fail(r, a, "chunk out of range");
    if (a.microbatch < 0 || a.microbatch >= c.num_microbatches)
      return fail(r, a, "microbatch out of range");
    if ((a.kind == ActionKind::recv_act || a.kind == ActionKind::send_grad) && st == 0)
      return fail(r, a, "the first stage has no previous stage");
    if ((a.kind == ActionKind::send_act || a.kind == ActionKind::recv_grad) &&
        st == c.num_stages() - 1)
      return fail(r, a, "the last stage has no next stage");
    return true;
  }
  // Completes a receive of microbatch `mb` on `ch` (queue already popped).
  bool deliver(int r, const Action& a, int mb) {
    if (mb != a.microbatch)
      return fail(r, a, "the matching send carried microbatch " + std::to_string(mb));
    auto& set = a.kind == ActionKind::recv_act ? received_act : received_grad;
    if (!set.insert({r, a.chunk, a.microbatch}).second) return fail(r, a, "received twice");
    return true;
  }
  // Runs rank r's next action if it can; false with error set on a violation.
  bool step(int r, bool& progressed) {
    const Action& a = s[r][pc[r]];
    if (!stage_ok(r, a)) return false;
    const auto key = std::make_tuple(r, a.chunk, a.microbatch);
    const int st = stage_of(c, r, a.chunk);
    if (a.kind == ActionKind::forward) {
      if (st > 0 && !received_act.count(key)) return fail(r, a, "input activation not received");
      if (!fwd_done.insert(key).second) return fail(r, a, "second forward");
      max_live[r] = std::max(max_live[r], ++live[r]);
    } else if (a.kind == ActionKind::backward) {
      if (!fwd_done.count(key)) return fail(r, a, "backward before its forward");
      if (st < c.num_stages() - 1 && !received_grad.count(key))
        return fail(r, a, "output gradient not received");
      if (!bwd_done.insert(key).second) return fail(r, a, "second backward");
      --live[r];
    } else if (is_send(a.kind)) {
      const bool act = a.kind == ActionKind::send_act;
      if (!(act ? fwd_done : bwd_done).count(key))
        return fail(r, a,
                    act ? "sends an activation before its forward"
                        : "sends a gradient before its backward");
      auto [ch, peer] = channel(r, a);
      if (model == SendModel::rendezvous) {
        if (done(peer)) return true;  // blocked: reported as a deadlock
        const Action& b = s[peer][pc[peer]];
        if (!is_recv(b.kind) || channel(peer, b).first != ch) return true;  // blocked
        if (!deliver(peer, b, a.microbatch)) return false;
        ++pc[peer];
      } else {
        queue[ch].push_back(a.microbatch);
      }
    } else {  // receive
      auto [ch, peer] = channel(r, a);
      auto& q = queue[ch];
      if (q.empty()) return true;  // blocked (rendezvous: the sender completes the pair)
      const int mb = q.front();
      q.pop_front();
      if (!deliver(r, a, mb)) return false;
    }
    ++pc[r];
    progressed = true;
    return true;
  }
  std::string blocked() const {
    std::string w = "deadlock; next actions:";
    for (int r = 0; r < c.pp; ++r)
      w += " rank " + std::to_string(r) + ": " + (done(r) ? "done" : to_string(s[r][pc[r]])) + ";";
    return w;
  }
};

}  // namespace

SimulationResult simulate(const ScheduleConfig& cfg, const std::vector<std::vector<Action>>& s,
                          SendModel model, bool forward_only) {
  cfg.validate();
  NXD_CHECK(static_cast<int>(s.size()) == cfg.pp, "[simulate] ", s.size(),
            " action lists for pp=", cfg.pp);
  Sim sim{cfg,
          s,
          model,
          std::vector<size_t>(cfg.pp, 0),
          {},
          {},
          {},
          {},
          {},
          std::vector<int>(cfg.pp, 0),
          std::vector<int>(cfg.pp, 0),
          {}};
  SimulationResult res;
  for (;;) {
    bool all_done = true, progressed = false;
    for (int r = 0; r < cfg.pp; ++r) {
      size_t before;
      do {  // run as far as possible
        if (sim.done(r)) break;
        before = sim.pc[r];
        if (!sim.step(r, progressed)) {
          res.error = sim.error;
          return res;
        }
      } while (sim.pc[r] != before);
      all_done = all_done && sim.done(r);
    }
    ++res.rounds;
    if (all_done) break;
    if (!progressed) {
      res.error = sim.blocked();
      return res;
    }
  }
  for (const auto& [ch, q] : sim.queue)
    if (!q.empty()) {
      res.error = std::string(ch.activation ? "activation" : "gradient") + " for stage " +
                  std::to_string(ch.to_stage) + " microbatch " + std::to_string(q.front()) +
                  " sent but never received";
      return res;
    }
  const size_t expected = static_cast<size_t>(cfg.num_stages()) * cfg.num_microbatches;
  if (sim.fwd_done.size() != expected || sim.bwd_done.size() != (forward_only ? 0 : expected)) {
    res.error = std::to_string(sim.fwd_done.size()) + " forwards and " +
                std::to_string(sim.bwd_done.size()) + " backwards, expected " +
                std::to_string(expected) + (forward_only ? " forwards only" : " of each");
    return res;
  }
  res.ok = true;
  res.max_live = sim.max_live;
  return res;
}

}  // namespace nxd::pipeline
