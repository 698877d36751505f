#include "nxd/collectives/parallel_state.h"

#include "nxd/runtime/context.h"

namespace nxd::parallel_state {
namespace {

struct State {
  bool initialized = false;
  Layout layout;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;
  std::shared_ptr<Communicator> tp, dp, pp;
  std::vector<int> pp_ranks;  // this rank's PP group
};

State& state() {
  Context& ctx = current_context();
  State& s = ctx.ext<State>();
  if (!s.initialized) {
    NXD_CHECK_T(ConfigError, ctx.world_size() == 1, "[parallel_state] rank ", ctx.rank(),
                " of a world of ", ctx.world_size(),
                ": model parallel is not initialized; call initialize_model_parallel(tp, pp)");
    initialize_model_parallel(1, 1);
  }
  return s;
}

}  // namespace

Layout make_layout(int world, int tp, int pp) {
  NXD_CHECK_T(ConfigError, world >= 1 && tp >= 1 && pp >= 1,
              "[initialize_model_parallel] need world, tp, pp >= 1, got world=", world, " tp=", tp,
              " pp=", pp);
  NXD_CHECK_T(ConfigError, world % (tp * pp) == 0, "[initialize_model_parallel] world size ", world,
              " is not divisible by tensor_model_parallel_size (", tp,
              ") x pipeline_model_parallel_size (", pp, ") = ", tp * pp);
  Layout l;
  l.world = world;
  l.tp = tp;
  l.pp = pp;
  l.dp = world / (tp * pp);
  const int dp = l.dp;
  auto rank_at = [&](int p, int d, int t) { return (p * dp + d) * tp + t; };
  for (int p = 0; p < pp; ++p)
    for (int d = 0; d < dp; ++d) {
      l.tp_groups.emplace_back();
      for (int t = 0; t < tp; ++t) l.tp_groups.back().push_back(rank_at(p, d, t));
    }
  for (int p = 0; p < pp; ++p)
    for (int t = 0; t < tp; ++t) {
      l.dp_groups.emplace_back();
      for (int d = 0; d < dp; ++d) l.dp_groups.back().push_back(rank_at(p, d, t));
    }
  for (int d = 0; d < dp; ++d)
    for (int t = 0; t < tp; ++t) {
      l.pp_groups.emplace_back();
      for (int p = 0; p < pp; ++p) l.pp_groups.back().push_back(rank_at(p, d, t));
    }
  return l;
}

void initialize_model_parallel(int tp, int pp) {
  Context& ctx = current_context();
  State& s = ctx.ext<State>();
  NXD_CHECK_T(ConfigError, !s.initialized, "[initialize_model_parallel] rank ", ctx.rank(),
              ": already initialized (tp=", s.layout.tp, ", pp=", s.layout.pp,
              "); call destroy_model_parallel() first");
  std::shared_ptr<Communicator> w = world_ptr();
  Layout l = make_layout(w->size(), tp, pp);
  const int r = w->rank();
  const int t = r % tp, d = (r / tp) % l.dp, p = r / (tp * l.dp);
  // Group index in each table; the key (the global rank) keeps members in ascending order.
  s.tp = w->split(p * l.dp + d, r);
  s.dp = w->split(p * tp + t, r);
  s.pp = w->split(d * tp + t, r);
  s.tp_rank = t;
  s.dp_rank = d;
  s.pp_rank = p;
  s.pp_ranks = l.pp_groups[d * tp + t];
  s.layout = std::move(l);
  NXD_INTERNAL_CHECK(s.tp->rank() == t && s.dp->rank() == d && s.pp->rank() == p,
                     "parallel_state group ranks disagree with the layout");
  s.initialized = true;
}

bool model_parallel_is_initialized() {
  State* s = current_context().find_ext<State>();
  return s && s->initialized;
}

void destroy_model_parallel() {
  current_context().ext<State>() = State{};
}

const Layout& get_layout() {
  return state().layout;
}

int get_tensor_model_parallel_size() {
  return state().layout.tp;
}
int get_tensor_model_parallel_rank() {
  return state().tp_rank;
}
Communicator& get_tensor_model_parallel_group() {
  return *state().tp;
}
std::shared_ptr<Communicator> get_tensor_model_parallel_group_ptr() {
  return state().tp;
}
Groups get_tensor_model_parallel_replica_groups() {
  return state().layout.tp_groups;
}

int get_data_parallel_size() {
  return state().layout.dp;
}
int get_data_parallel_rank() {
  return state().dp_rank;
}
Communicator& get_data_parallel_group() {
  return *state().dp;
}
std::shared_ptr<Communicator> get_data_parallel_group_ptr() {
  return state().dp;
}
Groups get_data_parallel_replica_groups() {
  return state().layout.dp_groups;
}

int get_pipeline_model_parallel_size() {
  return state().layout.pp;
}
int get_pipeline_model_parallel_rank() {
  return state().pp_rank;
}
Communicator& get_pipeline_model_parallel_group() {
  return *state().pp;
}
std::shared_ptr<Communicator> get_pipeline_model_parallel_group_ptr() {
  return state().pp;
}
Groups get_pipeline_model_parallel_replica_groups() {
  return state().layout.pp_groups;
}

int get_pipeline_model_parallel_next_rank() {
  State& s = state();
  return s.pp_ranks[(s.pp_rank + 1) % s.layout.pp];
}
int get_pipeline_model_parallel_prev_rank() {
  State& s = state();
  return s.pp_ranks[(s.pp_rank - 1 + s.layout.pp) % s.layout.pp];
}
bool is_pipeline_first_stage() {
  return state().pp_rank == 0;
}
bool is_pipeline_last_stage() {
  State& s = state();
  return s.pp_rank == s.layout.pp - 1;
}

}  // namespace nxd::parallel_state
