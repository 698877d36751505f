// Pipeline schedules checked without communication: every send meets its receive, the lock-step
// simulation never deadlocks, every microbatch gets one forward and one backward per stage
// (simulate() checks all three), 1F1B is NxD's order, and invalid configurations are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "nxd/pipeline/schedule.h"
#include "nxd/runtime/error.h"

using namespace nxd;
using namespace nxd::pipeline;

namespace {

ScheduleConfig config(ScheduleKind k, int pp, int m, int vpp = 1) {
  ScheduleConfig c;
  c.kind = k;
  c.pp = pp;
  c.num_microbatches = m;
  c.vpp = vpp;
  return c;
}

std::string label(const ScheduleConfig& c) {
  std::string s = schedule_name(c.kind);
  s += " pp=";
  s += std::to_string(c.pp);
  s += " M=";
  s += std::to_string(c.num_microbatches);
  s += " vpp=";
  s += std::to_string(c.vpp);
  return s;
}

// NxD's 1F1B step table written from its description (step -> (microbatch, forward?)):
// warmup steps i are F(i); steady offsets are F(off/2 + warmup) when even, B(off/2) when odd;
// cooldown steps j are B(steady + j).
std::string nxd_1f1b_order(int pp, int M, int rank) {
  const int warmup = std::min(pp - rank - 1, M), steady = M - warmup;
  std::string s;
  auto step = [&](char what, int mb) {
    if (!s.empty()) s += ' ';
    s += what;
    s += std::to_string(mb);
  };
  for (int i = 0; i < warmup; ++i) step('F', i);
  for (int off = 0; off < 2 * steady; ++off) {
    if (off % 2 == 0) {
      step('F', off / 2 + warmup);
    } else {
      step('B', off / 2);
    }
  }
  for (int j = 0; j < warmup; ++j) step('B', steady + j);
  return s;
}

void expect_runs(const ScheduleConfig& c, SendModel model) {
  SimulationResult r = simulate(c, build_schedules(c), model);
  EXPECT_TRUE(r.ok) << label(c) << (model == SendModel::buffered ? " buffered: " : " rendezvous: ")
                    << r.error;
}

}  // namespace

TEST(Schedule, OneFOneBIsNxDTableForPP4M6) {
  const std::vector<std::string> table = {
      "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5",
      "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5",
      "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5",
      "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5",
  };
  auto c = config(ScheduleKind::one_f_one_b, 4, 6);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(compute_order(build_schedule(c, r)), table[r]) << r;
}

TEST(Schedule, OneFOneBMatchesNxDOrderAndRuns) {
  for (int pp : {2, 4, 8}) {
    for (int m : {1, 4, 8, 32}) {
      auto c = config(ScheduleKind::one_f_one_b, pp, m);
      for (int r = 0; r < pp; ++r) {
        auto acts = build_schedule(c, r);
        EXPECT_EQ(compute_order(acts), nxd_1f1b_order(pp, m, r)) << label(c) << " rank " << r;
        // steady-state sends are deferred until after the next gradient receive
        const int warmup = std::min(pp - r - 1, m);
        for (size_t i = 0; i < acts.size(); ++i) {
          if (acts[i].kind != ActionKind::send_act || acts[i].microbatch < warmup) continue;
          ASSERT_GT(i, 0u);
          EXPECT_EQ(acts[i - 1].kind, ActionKind::recv_grad) << label(c) << " rank " << r;
          EXPECT_EQ(acts[i - 1].microbatch, acts[i].microbatch - warmup);
        }
      }
      expect_runs(c, SendModel::buffered);
      expect_runs(c, SendModel::rendezvous);
      SimulationResult res = simulate(c, build_schedules(c));
      for (int r = 0; r < pp; ++r)
        EXPECT_EQ(res.max_live[r], std::min(pp - r, m)) << label(c) << " rank " << r;
    }
  }
}

TEST(Schedule, GPipeRunsAndStoresEveryMicrobatch) {
  for (int pp : {1, 2, 4, 8}) {
    for (int m : {1, 4, 8, 32}) {
      auto c = config(ScheduleKind::gpipe, pp, m);
      expect_runs(c, SendModel::buffered);
      expect_runs(c, SendModel::rendezvous);
      SimulationResult res = simulate(c, build_schedules(c));
      for (int r = 0; r < pp; ++r) EXPECT_EQ(res.max_live[r], m) << label(c);
    }
  }
}

TEST(Schedule, InterleavedRunsForVpp2And3) {
  for (int vpp : {2, 3}) {
    for (int pp : {2, 4, 8}) {
      for (int k : {1, 2, 4}) {
        auto c = config(ScheduleKind::interleaved, pp, pp * k, vpp);
        expect_runs(c, SendModel::buffered);
        for (int r = 0; r < pp; ++r) {
          // each chunk runs its forwards, and its backwards, in microbatch order
          std::vector<int> next_f(vpp, 0), next_b(vpp, 0);
          for (const Action& a : build_schedule(c, r)) {
            if (a.kind == ActionKind::forward) {
              EXPECT_EQ(a.microbatch, next_f[a.chunk]++);
            } else if (a.kind == ActionKind::backward) {
              EXPECT_EQ(a.microbatch, next_b[a.chunk]++);
            }
          }
        }
      }
    }
  }
  // Megatron's example shape: pp=2, vpp=2, M=4 on rank 0
  auto c = config(ScheduleKind::interleaved, 2, 4, 2);
  EXPECT_EQ(compute_order(build_schedule(c, 0)),
            "F0 F1 F0c1 F1c1 F2 B0c1 F3 B1c1 F2c1 B0 F3c1 B1 B2c1 B3c1 B2 B3");
}

TEST(Schedule, SimulationCatchesBrokenSchedules) {
  auto c = config(ScheduleKind::one_f_one_b, 4, 6);
  // 1F1B sending each activation right after its forward: under rendezvous sends a stage
  // sending an activation meets its neighbour sending a gradient (why NxD defers the send).
  std::vector<std::vector<Action>> eager = build_schedules(c);
  for (int r = 0; r + 1 < c.pp; ++r) {
    std::vector<Action> out;
    for (const Action& a : eager[r]) {
      if (a.kind == ActionKind::send_act) continue;
      out.push_back(a);
      if (a.kind == ActionKind::forward) out.push_back({ActionKind::send_act, a.microbatch, 0});
    }
    eager[r] = out;
  }
  EXPECT_TRUE(simulate(c, eager, SendModel::buffered).ok);
  SimulationResult dl = simulate(c, eager, SendModel::rendezvous);
  EXPECT_FALSE(dl.ok);
  EXPECT_NE(dl.error.find("deadlock"), std::string::npos) << dl.error;

  // a missing gradient send: the previous stage never gets its gradient
  auto s = build_schedules(c);
  auto it = std::find(s[2].begin(), s[2].end(), Action{ActionKind::send_grad, 3, 0});
  ASSERT_NE(it, s[2].end());
  s[2].erase(it);
  SimulationResult r = simulate(c, s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;

  // a duplicated forward, and receives in the wrong microbatch order
  s = build_schedules(c);
  s[3].push_back(Action{ActionKind::forward, 0, 0});
  r = simulate(c, s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("second forward"), std::string::npos) << r.error;
  s = build_schedules(config(ScheduleKind::gpipe, 2, 2));
  std::swap(s[1][0], s[1][2]);  // recv_act 1 first, then recv_act 0
  r = simulate(config(ScheduleKind::gpipe, 2, 2), s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("carried microbatch 0"), std::string::npos) << r.error;
}

TEST(Schedule, InvalidConfigurationsNameTheNumbers) {
  auto msg = [](const ScheduleConfig& c) {
    try {
      build_schedule(c, 0);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(config(ScheduleKind::interleaved, 4, 6, 2)).find("multiple of pp"),
            std::string::npos);
  EXPECT_NE(msg(config(ScheduleKind::interleaved, 4, 6, 2)).find("pp=4 microbatches=6 vpp=2"),
            std::string::npos);
  EXPECT_NE(msg(config(ScheduleKind::one_f_one_b, 4, 8, 2)).find("need the interleaved"),
            std::string::npos);
  EXPECT_NE(msg(config(ScheduleKind::interleaved, 4, 8, 1)).find("vpp >= 2"), std::string::npos);
  EXPECT_NE(msg(config(ScheduleKind::interleaved, 1, 4, 2)).find("pp >= 2"), std::string::npos);
  EXPECT_NE(msg(config(ScheduleKind::gpipe, 2, 0)).find("microbatches=0"), std::string::npos);
  EXPECT_NE(msg(config(ScheduleKind::gpipe, 0, 4)).find("pp=0"), std::string::npos);
  EXPECT_THROW(parse_schedule("zigzag"), ConfigError);
  EXPECT_EQ(parse_schedule("1f1b"), ScheduleKind::one_f_one_b);
  EXPECT_THROW(build_schedule(config(ScheduleKind::gpipe, 2, 2), 2), InvalidArgument);
}

TEST(Schedule, InferenceRunsForwardsOnly) {
  for (int vpp : {1, 2, 3}) {
    for (int pp : {1, 2, 4}) {
      for (int m : {1, 3, 8}) {
        auto c = config(vpp > 1 ? ScheduleKind::interleaved : ScheduleKind::gpipe, pp,
                        vpp > 1 ? pp * m : m, vpp);
        if (vpp > 1 && pp == 1) continue;
        std::vector<std::vector<Action>> s;
        for (int r = 0; r < pp; ++r) s.push_back(build_inference_schedule(c, r));
        for (SendModel model : {SendModel::buffered, SendModel::rendezvous}) {
          SimulationResult res = simulate(c, s, model, /*forward_only=*/true);
          EXPECT_TRUE(res.ok) << label(c) << ": " << res.error;
        }
        EXPECT_FALSE(simulate(c, s).ok);  // a training step needs the backwards
      }
    }
  }
}

TEST(Schedule, ResolveScheduleOfAJob) {
  PipelineJob j;
  j.pipeline_model_parallel_size = 4;
  j.data_parallel_size = 2;
  j.global_batch_size = 32;
  j.micro_batch_size = 2;
  j.num_layers = 8;
  ScheduleConfig c = resolve_schedule(j);
  EXPECT_EQ(c.num_microbatches, 8);
  EXPECT_EQ(c.kind, ScheduleKind::one_f_one_b);
  auto err = [](PipelineJob j) {
    try {
      resolve_schedule(j);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PipelineJob b = j;
  b.global_batch_size = 30;
  EXPECT_NE(err(b).find("data.global_batch_size=30 is not a positive multiple of "
                        "data.micro_batch_size=2 x data-parallel size 2"),
            std::string::npos);
  b = j;
  b.virtual_pipeline_model_parallel_size = 2;
  EXPECT_NE(err(b).find("needs distributed_strategy.pipeline_schedule=interleaved"),
            std::string::npos);
  b.pipeline_schedule = ScheduleKind::interleaved;
  EXPECT_EQ(resolve_schedule(b).vpp, 2);
  b.virtual_pipeline_model_parallel_size = 3;
  EXPECT_NE(err(b).find("model.num_layers=8 cannot be cut into pipeline_model_parallel_size=4 x "
                        "virtual_pipeline_model_parallel_size=3"),
            std::string::npos);
  b.virtual_pipeline_model_parallel_size = 2;
  b.global_batch_size = 12;  // 3 microbatches
  EXPECT_NE(err(b).find("multiple of pp"), std::string::npos);
  // the schedule's name is parsed where the configuration is read (parse_schedule)
  std::string unknown;
  try {
    parse_schedule("zigzag");
  } catch (const ConfigError& e) {
    unknown = e.what();
  }
  EXPECT_NE(unknown.find("unknown pipeline schedule 'zigzag'"), std::string::npos) << unknown;
}

TEST(Schedule, AnalyticalBubble) {
  EXPECT_DOUBLE_EQ(analytical_bubble(config(ScheduleKind::one_f_one_b, 4, 6)), 3.0 / 9.0);
  EXPECT_DOUBLE_EQ(analytical_bubble(config(ScheduleKind::interleaved, 4, 8, 2)), 3.0 / 11.0 / 2);
}
