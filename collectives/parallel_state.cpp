#include "nxd/collectives/parallel_state.h"

#include "nxd/runtime/context.h"

namespace nxd::parallel_state {
namespace {

struct State {
  bool initialized = false;
  Layout layout;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0, cp_rank = 0, ep_rank = 0;
  std::shared_ptr<Communicator> tp, dp, pp, cp, dp_cp, ep, expert_dp;
  std::vector<int> pp_ranks;  // this rank's PP group
};

State& state() {
  Context& ctx = current_context();
  State& s = ctx.ext<State>();
  if (!s.initialized) {
    NXD_CHECK_T(ConfigError, ctx.world_size() == 1, "[parallel_state] rank ", ctx.rank(),
                " of a world of ", ctx.world_size(),
                ": model parallel is not initialized; call initialize_model_parallel(tp, pp)");
    initialize_model_parallel(ParallelSizes{});
  }
  return s;
}

// The index of the group in `table` that holds global rank r.
int group_index(const Groups& table, int r) {
  for (size_t g = 0; g < table.size(); ++g)
    for (int m : table[g])
      if (m == r) return static_cast<int>(g);
  NXD_INTERNAL_CHECK(false, "parallel_state: rank ", r, " is in no group of a table");
  return -1;
}

// One group per value of the outer indices; `inner` lists the members of one group.
template <typename Outer, typename Inner>
Groups table(Outer&& for_each_outer, Inner&& members) {
  Groups t;
  for_each_outer([&](auto... outer) { t.push_back(members(outer...)); });
  return t;
}

// The sizes of a layout (dp derived), checked: tp x cp x pp divides the world, ep divides
// dp x cp.
Layout layout_sizes(int world, const ParallelSizes& z) {
  const int tp = z.tensor, pp = z.pipeline, cp = z.context, ep = z.expert;
  NXD_CHECK_T(ConfigError, world >= 1 && tp >= 1 && pp >= 1 && cp >= 1 && ep >= 1,
              "[initialize_model_parallel] need world, tp, pp, cp, ep >= 1, got world=", world,
              " tp=", tp, " pp=", pp, " cp=", cp, " ep=", ep);
  NXD_CHECK_T(ConfigError, world % (tp * cp * pp) == 0, "[initialize_model_parallel] world size ",
              world, " is not divisible by tensor_model_parallel_size (", tp,
              ") x context_parallel_size (", cp, ") x pipeline_model_parallel_size (", pp,
              ") = ", tp * cp * pp);
  Layout l;
  l.world = world;
  l.tp = tp;
  l.pp = pp;
  l.cp = cp;
  l.ep = ep;
  l.dp = world / (tp * cp * pp);
  const int dp = l.dp;
  NXD_CHECK_T(ConfigError, (dp * cp) % ep == 0,
              "[initialize_model_parallel] expert_model_parallel_size (", ep,
              ") must divide the data-parallel size ", dp, " x context-parallel size ", cp, " = ",
              dp * cp, " (world ", world, " / (tp ", tp, " x pp ", pp, "))");
  return l;
}

// The TP, CP, DP, DP x CP and PP groups; global rank ((p * dp + d) * cp + c) * tp + t.
void add_model_groups(Layout& l) {
  const int tp = l.tp, pp = l.pp, cp = l.cp, dp = l.dp;
  auto at = [&](int p, int d, int c, int t) { return ((p * dp + d) * cp + c) * tp + t; };
  auto each_pdc = [&](auto f) {
    for (int p = 0; p < pp; ++p)
      for (int d = 0; d < dp; ++d)
        for (int c = 0; c < cp; ++c) f(p, d, c);
  };
  auto each_pdt = [&](auto f) {
    for (int p = 0; p < pp; ++p)
      for (int d = 0; d < dp; ++d)
        for (int t = 0; t < tp; ++t) f(p, d, t);
  };
  auto each_pct = [&](auto f) {
    for (int p = 0; p < pp; ++p)
      for (int c = 0; c < cp; ++c)
        for (int t = 0; t < tp; ++t) f(p, c, t);
  };
  auto each_pt = [&](auto f) {
    for (int p = 0; p < pp; ++p)
      for (int t = 0; t < tp; ++t) f(p, t);
  };
  auto each_dct = [&](auto f) {
    for (int d = 0; d < dp; ++d)
      for (int c = 0; c < cp; ++c)
        for (int t = 0; t < tp; ++t) f(d, c, t);
  };
  l.tp_groups = table(each_pdc, [&](int p, int d, int c) {
    std::vector<int> g;
    for (int t = 0; t < tp; ++t) g.push_back(at(p, d, c, t));
    return g;
  });
  l.cp_groups = table(each_pdt, [&](int p, int d, int t) {
    std::vector<int> g;
    for (int c = 0; c < cp; ++c) g.push_back(at(p, d, c, t));
    return g;
  });
  l.dp_groups = table(each_pct, [&](int p, int c, int t) {
    std::vector<int> g;
    for (int d = 0; d < dp; ++d) g.push_back(at(p, d, c, t));
    return g;
  });
  l.dp_cp_groups = table(each_pt, [&](int p, int t) {
    std::vector<int> g;
    for (int d = 0; d < dp; ++d)
      for (int c = 0; c < cp; ++c) g.push_back(at(p, d, c, t));
    return g;
  });
  l.pp_groups = table(each_dct, [&](int d, int c, int t) {
    std::vector<int> g;
    for (int p = 0; p < pp; ++p) g.push_back(at(p, d, c, t));
    return g;
  });
}

void add_expert_groups(Layout& l) {
  const int ep = l.ep;
  // EP and expert-DP split each data x context group (members in data x context rank order,
  // q = dp * CP + cp): EP = EP consecutive q, expert-DP = the q with the same q % EP.
  for (const auto& g : l.dp_cp_groups) {
    const int n = static_cast<int>(g.size()) / ep;
    for (int e = 0; e < n; ++e)
      l.ep_groups.emplace_back(g.begin() + e * ep, g.begin() + (e + 1) * ep);
    for (int j = 0; j < ep; ++j) {
      l.expert_dp_groups.emplace_back();
      for (int e = 0; e < n; ++e) l.expert_dp_groups.back().push_back(g[e * ep + j]);
    }
  }
}

}  // namespace

Layout make_layout(int world, const ParallelSizes& z) {
  Layout l = layout_sizes(world, z);
  add_model_groups(l);
  add_expert_groups(l);
  return l;
}

Layout make_layout(int world, int tp, int pp) {
  return make_layout(world, ParallelSizes{.tensor = tp, .pipeline = pp});
}

void initialize_model_parallel(const ParallelSizes& sizes) {
  Context& ctx = current_context();
  State& s = ctx.ext<State>();
  NXD_CHECK_T(ConfigError, !s.initialized, "[initialize_model_parallel] rank ", ctx.rank(),
              ": already initialized (tp=", s.layout.tp, ", pp=", s.layout.pp, ", cp=", s.layout.cp,
              ", ep=", s.layout.ep, "); call destroy_model_parallel() first");
  std::shared_ptr<Communicator> w = world_ptr();
  Layout l = make_layout(w->size(), sizes);
  const int r = w->rank();
  const int t = r % l.tp, c = (r / l.tp) % l.cp, d = (r / (l.tp * l.cp)) % l.dp,
            p = r / (l.tp * l.cp * l.dp);
  // Color = the group's index in its table; the key (the global rank) keeps members in ascending
  // order. Every rank calls split once per table, in the same order.
  auto split = [&](const Groups& tbl) { return w->split(group_index(tbl, r), r); };
  s.tp = split(l.tp_groups);
  s.dp = split(l.dp_groups);
  s.pp = split(l.pp_groups);
  s.cp = split(l.cp_groups);
  s.dp_cp = split(l.dp_cp_groups);
  s.ep = split(l.ep_groups);
  s.expert_dp = split(l.expert_dp_groups);
  s.tp_rank = t;
  s.dp_rank = d;
  s.pp_rank = p;
  s.cp_rank = c;
  const int q = d * l.cp + c;  // the data x context rank
  s.ep_rank = q % l.ep;
  s.pp_ranks = l.pp_groups[group_index(l.pp_groups, r)];
  s.layout = std::move(l);
  NXD_INTERNAL_CHECK(s.tp->rank() == t && s.dp->rank() == d && s.pp->rank() == p &&
                         s.cp->rank() == c && s.dp_cp->rank() == d * s.layout.cp + c &&
                         s.ep->rank() == s.ep_rank && s.expert_dp->rank() == q / s.layout.ep,
                     "parallel_state group ranks disagree with the layout");
  s.initialized = true;
}

void initialize_model_parallel(int tp, int pp) {
  initialize_model_parallel(ParallelSizes{.tensor = tp, .pipeline = pp});
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

namespace nxd::parallel_state {

int get_context_parallel_size() {
  return state().layout.cp;
}
int get_context_parallel_rank() {
  return state().cp_rank;
}
Communicator& get_context_parallel_group() {
  return *state().cp;
}
std::shared_ptr<Communicator> get_context_parallel_group_ptr() {
  return state().cp;
}
Groups get_context_parallel_replica_groups() {
  return state().layout.cp_groups;
}

int get_data_context_parallel_size() {
  const Layout& l = state().layout;
  return l.dp * l.cp;
}
int get_data_context_parallel_rank() {
  State& s = state();
  return s.dp_rank * s.layout.cp + s.cp_rank;
}
Communicator& get_data_context_parallel_group() {
  return *state().dp_cp;
}
std::shared_ptr<Communicator> get_data_context_parallel_group_ptr() {
  return state().dp_cp;
}
Groups get_data_context_parallel_replica_groups() {
  return state().layout.dp_cp_groups;
}

int get_expert_model_parallel_size() {
  return state().layout.ep;
}
int get_expert_model_parallel_rank() {
  return state().ep_rank;
}
Communicator& get_expert_model_parallel_group() {
  return *state().ep;
}
std::shared_ptr<Communicator> get_expert_model_parallel_group_ptr() {
  return state().ep;
}
Groups get_expert_model_parallel_replica_groups() {
  return state().layout.ep_groups;
}

int get_expert_data_parallel_size() {
  const Layout& l = state().layout;
  return l.dp * l.cp / l.ep;
}
int get_expert_data_parallel_rank() {
  State& s = state();
  return (s.dp_rank * s.layout.cp + s.cp_rank) / s.layout.ep;
}
Communicator& get_expert_data_parallel_group() {
  return *state().expert_dp;
}
std::shared_ptr<Communicator> get_expert_data_parallel_group_ptr() {
  return state().expert_dp;
}
Groups get_expert_data_parallel_replica_groups() {
  return state().layout.expert_dp_groups;
}

}  // namespace nxd::parallel_state
