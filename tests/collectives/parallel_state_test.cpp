// parallel_state against NxD's ground-truth layouts (ranks = arange(world).reshape(PP, DP, TP)).
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>

#include "nxd/collectives/parallel_state.h"
#include "support/ranks.h"

using namespace nxd;
namespace ps = nxd::parallel_state;
using Groups = ps::Groups;

namespace {

struct Truth {
  int world, tp, pp;
  Groups tp_groups, dp_groups, pp_groups;
};

Truth tp8_pp4() {  // 32 ranks, DP1
  Truth t{32, 8, 4, {}, {}, {}};
  for (int g = 0; g < 4; ++g) {
    t.tp_groups.emplace_back();
    for (int i = 0; i < 8; ++i) t.tp_groups.back().push_back(8 * g + i);
  }
  for (int r = 0; r < 32; ++r) t.dp_groups.push_back({r});
  for (int i = 0; i < 8; ++i) t.pp_groups.push_back({i, i + 8, i + 16, i + 24});
  return t;
}

Truth tp2_pp2_dp4() {  // 16 ranks
  return {16,
          2,
          2,
          {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}},
          {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}},
          {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}};
}

Truth tp2_pp2_dp2() {  // 8 ranks
  return {8,
          2,
          2,
          {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
          {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
          {{0, 4}, {1, 5}, {2, 6}, {3, 7}}};
}

const std::vector<int>& group_of(const Groups& gs, int r) {
  for (auto& g : gs)
    for (int x : g)
      if (x == r) return g;
  throw std::runtime_error("rank not in any group");
}

int index_in(const std::vector<int>& g, int r) {
  return static_cast<int>(std::find(g.begin(), g.end(), r) - g.begin());
}

void check_live(const Truth& t) {
  sim::launch(t.world, [&] {
    ps::initialize_model_parallel(t.tp, t.pp);
    const int r = world().rank();
    EXPECT_EQ(ps::get_tensor_model_parallel_size(), t.tp);
    EXPECT_EQ(ps::get_pipeline_model_parallel_size(), t.pp);
    EXPECT_EQ(ps::get_data_parallel_size(), t.world / (t.tp * t.pp));
    EXPECT_EQ(ps::get_tensor_model_parallel_replica_groups(), t.tp_groups);
    EXPECT_EQ(ps::get_data_parallel_replica_groups(), t.dp_groups);
    EXPECT_EQ(ps::get_pipeline_model_parallel_replica_groups(), t.pp_groups);
    const auto& tg = group_of(t.tp_groups, r);
    const auto& dg = group_of(t.dp_groups, r);
    const auto& pg = group_of(t.pp_groups, r);
    EXPECT_EQ(ps::get_tensor_model_parallel_group().ranks(), tg) << "rank " << r;
    EXPECT_EQ(ps::get_data_parallel_group().ranks(), dg) << "rank " << r;
    EXPECT_EQ(ps::get_pipeline_model_parallel_group().ranks(), pg) << "rank " << r;
    EXPECT_EQ(ps::get_tensor_model_parallel_rank(), index_in(tg, r));
    EXPECT_EQ(ps::get_data_parallel_rank(), index_in(dg, r));
    const int pr = index_in(pg, r);
    EXPECT_EQ(ps::get_pipeline_model_parallel_rank(), pr);
    EXPECT_EQ(ps::get_pipeline_model_parallel_next_rank(), pg[(pr + 1) % t.pp]);
    EXPECT_EQ(ps::get_pipeline_model_parallel_prev_rank(), pg[(pr + t.pp - 1) % t.pp]);
    EXPECT_EQ(ps::is_pipeline_first_stage(), pr == 0);
    EXPECT_EQ(ps::is_pipeline_last_stage(), pr == t.pp - 1);
    // The groups really communicate: the TP-group sum of global ranks.
    Tensor x = full({1}, r, DType::i64);
    ps::get_tensor_model_parallel_group().all_reduce(x);
    int64_t want = 0;
    for (int m : tg) want += m;
    EXPECT_EQ(x.item(), double(want));
    ps::destroy_model_parallel();
    EXPECT_FALSE(ps::model_parallel_is_initialized());
  });
}

}  // namespace

TEST(ParallelState, LayoutTablesMatchNxD) {
  for (const Truth& t : {tp8_pp4(), tp2_pp2_dp4(), tp2_pp2_dp2()}) {
    ps::Layout l = ps::make_layout(t.world, t.tp, t.pp);
    EXPECT_EQ(l.tp_groups, t.tp_groups) << "world " << t.world;
    EXPECT_EQ(l.dp_groups, t.dp_groups) << "world " << t.world;
    EXPECT_EQ(l.pp_groups, t.pp_groups) << "world " << t.world;
  }
}

TEST(ParallelState, LiveGroups32RanksTp8Pp4) {
  check_live(tp8_pp4());
}
TEST(ParallelState, LiveGroups16RanksTp2Pp2Dp4) {
  check_live(tp2_pp2_dp4());
}
TEST(ParallelState, LiveGroups8RanksTp2Pp2Dp2) {
  check_live(tp2_pp2_dp2());
}

TEST(ParallelState, WorldThatDoesNotDivideIsAnError) {
  try {
    ps::make_layout(12, 8, 1);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("world size 12"), std::string::npos) << m;
    EXPECT_NE(m.find("8"), std::string::npos) << m;
  }
  EXPECT_THROW(ps::make_layout(8, 3, 1), ConfigError);
  EXPECT_THROW(ps::make_layout(8, 2, 3), ConfigError);
  EXPECT_THROW(ps::make_layout(8, 0, 1), ConfigError);
  // Live: every rank gets the error; launch rethrows it.
  EXPECT_THROW(sim::launch(6, [] { ps::initialize_model_parallel(4, 1); }), ConfigError);
}

TEST(ParallelState, PerRankStateAndReinitialize) {
  sim::launch(4, [] {
    EXPECT_FALSE(ps::model_parallel_is_initialized());
    EXPECT_THROW(ps::get_tensor_model_parallel_size(), ConfigError);  // world > 1, not init
    ps::initialize_model_parallel(2, 1);
    EXPECT_THROW(ps::initialize_model_parallel(2, 1), ConfigError);  // twice
    EXPECT_EQ(ps::get_data_parallel_size(), 2);
    ps::destroy_model_parallel();
    ps::initialize_model_parallel(1, 4);
    EXPECT_EQ(ps::get_pipeline_model_parallel_size(), 4);
    EXPECT_EQ(ps::get_pipeline_model_parallel_rank(), world().rank());
  });
  // A world of one rank is implicitly TP=PP=DP=1.
  sim::launch(1, [] {
    EXPECT_EQ(ps::get_tensor_model_parallel_size(), 1);
    EXPECT_EQ(ps::get_data_parallel_rank(), 0);
    EXPECT_EQ(ps::get_pipeline_model_parallel_next_rank(), 0);
  });
}

// 16 ranks TP2 CP2 DP4 EP2: rank = 4*dp + 2*cp + tp (arange(16).reshape(PP1, DP4, CP2, TP2)).
// EP and expert-DP fold over DP x CP (Megatron-core's expert groups): with q = 2*dp + cp, an EP
// group is q in {2e, 2e+1} (here the CP group), expert-DP the q of one parity: 4 ranks over 2 CP
// ranks each (per CP slice, 2 ranks: the experts' gradients were never averaged over CP).
TEST(ParallelState, ContextAndExpertGroupsTp2Cp2Dp4Ep2) {
  const ps::ParallelSizes sizes{.tensor = 2, .context = 2, .expert = 2};
  const Groups tp = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}};
  const Groups cp = {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}};
  const Groups dp = {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}};
  const Groups dp_cp = {{0, 2, 4, 6, 8, 10, 12, 14}, {1, 3, 5, 7, 9, 11, 13, 15}};
  const Groups ep = {{0, 2}, {4, 6}, {8, 10}, {12, 14}, {1, 3}, {5, 7}, {9, 11}, {13, 15}};
  const Groups edp = {{0, 4, 8, 12}, {2, 6, 10, 14}, {1, 5, 9, 13}, {3, 7, 11, 15}};
  ps::Layout l = ps::make_layout(16, sizes);
  EXPECT_EQ(l.dp, 4);
  EXPECT_EQ(l.tp_groups, tp);
  EXPECT_EQ(l.cp_groups, cp);
  EXPECT_EQ(l.dp_groups, dp);
  EXPECT_EQ(l.dp_cp_groups, dp_cp);
  EXPECT_EQ(l.ep_groups, ep);
  EXPECT_EQ(l.expert_dp_groups, edp);
  sim::launch(16, [&] {
    ps::initialize_model_parallel(sizes);
    const int r = world().rank();
    const auto& cg = group_of(cp, r);
    const auto& dcg = group_of(dp_cp, r);
    const auto& eg = group_of(ep, r);
    const auto& edg = group_of(edp, r);
    EXPECT_EQ(ps::get_context_parallel_size(), 2);
    EXPECT_EQ(ps::get_context_parallel_group().ranks(), cg) << "rank " << r;
    EXPECT_EQ(ps::get_context_parallel_rank(), index_in(cg, r));
    EXPECT_EQ(ps::get_data_context_parallel_size(), 8);
    EXPECT_EQ(ps::get_data_context_parallel_group().ranks(), dcg) << "rank " << r;
    EXPECT_EQ(ps::get_data_context_parallel_rank(), index_in(dcg, r));
    EXPECT_EQ(ps::get_expert_model_parallel_size(), 2);
    EXPECT_EQ(ps::get_expert_model_parallel_group().ranks(), eg) << "rank " << r;
    EXPECT_EQ(ps::get_expert_model_parallel_rank(), index_in(eg, r));
    EXPECT_EQ(ps::get_expert_data_parallel_size(), 4);
    EXPECT_EQ(ps::get_expert_data_parallel_group().ranks(), edg) << "rank " << r;
    EXPECT_EQ(ps::get_expert_data_parallel_rank(), index_in(edg, r));
    EXPECT_EQ(ps::get_data_parallel_group().ranks(), group_of(dp, r)) << "rank " << r;
    EXPECT_EQ(ps::get_expert_model_parallel_replica_groups(), ep);
    // The new groups really communicate: sums of global ranks.
    for (Communicator* g :
         {&ps::get_context_parallel_group(), &ps::get_expert_model_parallel_group(),
          &ps::get_expert_data_parallel_group(), &ps::get_data_context_parallel_group()}) {
      Tensor x = full({1}, r, DType::i64);
      g->all_reduce(x);
      int64_t want = 0;
      for (int m : g->ranks()) want += m;
      EXPECT_EQ(x.item(), double(want)) << "rank " << r;
    }
    ps::destroy_model_parallel();
  });
}

// EP may exceed DP: 8 ranks TP2 CP2 DP2 EP4 (q = 2*dp + cp; rank = 2*q + tp): one EP group per TP
// rank spans both DP indices and both CP ranks, expert-DP is every rank alone. At CP 1 the groups
// are NxD's (EP consecutive DP indices). EP x expert-DP tiles each data x context group.
TEST(ParallelState, ExpertGroupsFoldOverDataAndContext) {
  ps::Layout l = ps::make_layout(8, ps::ParallelSizes{.tensor = 2, .context = 2, .expert = 4});
  EXPECT_EQ(l.ep_groups, (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.expert_dp_groups, (Groups{{0}, {2}, {4}, {6}, {1}, {3}, {5}, {7}}));
  ps::Layout n = ps::make_layout(8, ps::ParallelSizes{.tensor = 1, .expert = 2});  // DP 8
  EXPECT_EQ(n.ep_groups, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(n.expert_dp_groups, (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  for (const ps::ParallelSizes& z :
       {ps::ParallelSizes{.context = 2, .expert = 2}, ps::ParallelSizes{.context = 4, .expert = 2},
        ps::ParallelSizes{.tensor = 2, .pipeline = 2, .context = 2, .expert = 4}}) {
    const ps::Layout x = ps::make_layout(16, z);
    for (const auto& g : x.dp_cp_groups) {
      std::vector<int> seen;
      for (const auto& e : x.ep_groups)
        if (std::find(g.begin(), g.end(), e.front()) != g.end())
          for (const auto& d : x.expert_dp_groups)
            for (int r : d)
              if (std::find(e.begin(), e.end(), r) != e.end()) seen.push_back(r);
      std::sort(seen.begin(), seen.end());
      EXPECT_EQ(seen, g) << "cp " << z.context << " ep " << z.expert;
    }
  }
  sim::launch(8, [] {
    ps::initialize_model_parallel(ps::ParallelSizes{.tensor = 2, .context = 2, .expert = 4});
    const int r = world().rank(), q = r / 2;
    EXPECT_EQ(ps::get_expert_model_parallel_rank(), q % 4) << "rank " << r;
    EXPECT_EQ(ps::get_expert_data_parallel_rank(), q / 4) << "rank " << r;
    EXPECT_EQ(ps::get_expert_data_parallel_size(), 1);
    EXPECT_EQ(ps::get_expert_model_parallel_group().rank(), q % 4) << "rank " << r;
    ps::destroy_model_parallel();
  });
}

TEST(ParallelState, ContextAndExpertSizesThatDoNotDivideAreErrors) {
  EXPECT_THROW(ps::make_layout(8, ps::ParallelSizes{.tensor = 2, .context = 3}), ConfigError);
  try {
    ps::make_layout(8, ps::ParallelSizes{.tensor = 2, .expert = 3});  // DP 4, EP 3
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("expert_model_parallel_size (3)"), std::string::npos) << m;
    EXPECT_NE(m.find("data-parallel size 4"), std::string::npos) << m;
  }
  EXPECT_THROW(ps::make_layout(8, ps::ParallelSizes{.context = 0}), ConfigError);
  // EP divides DP x CP, not DP alone: DP 2 x CP 2 takes EP 4, not EP 3 or 8
  EXPECT_NO_THROW(ps::make_layout(4, ps::ParallelSizes{.context = 2, .expert = 4}));
  EXPECT_THROW(ps::make_layout(4, ps::ParallelSizes{.context = 2, .expert = 8}), ConfigError);
  EXPECT_THROW(ps::make_layout(6, ps::ParallelSizes{.context = 2, .expert = 4}), ConfigError);
}
