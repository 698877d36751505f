// The simulated Neuron device: machine tables, modeled collective times against the closed-form
// alpha-beta formulas, the roofline clock, HBM capacity and the Chrome-trace timeline.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>

#include "nxd/collectives/algorithms/rdh.h"
#include "nxd/collectives/algorithms/ring.h"
#include "nxd/collectives/communicator.h"
#include "nxd/collectives/sim/collective_cost.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/collectives/sim/nccom_figures.h"

using namespace nxd;
using namespace nxd::sim;

TEST(SimMachine, InstanceTables) {
  MachineSpec t = machine("trn1.32xlarge");
  EXPECT_EQ(t.world_size(), 32);
  EXPECT_EQ(t.core.hbm_bytes, int64_t{16} << 30);
  EXPECT_DOUBLE_EQ(t.core.bf16_flops, 92e12);
  EXPECT_DOUBLE_EQ(t.core.fp32_flops, 23e12);
  EXPECT_EQ(t.topology, Topology::torus_2d);
  EXPECT_DOUBLE_EQ(t.efa_bandwidth, 800e9 / 8);
  EXPECT_FALSE(t.sources.empty());
  EXPECT_EQ(machine("trn1.2xlarge").world_size(), 2);
  EXPECT_EQ(machine("trn1n.32xlarge").efa_bandwidth, 1600e9 / 8);
  EXPECT_EQ(machine("inf2.xlarge").world_size(), 2);
  EXPECT_EQ(machine("inf2.8xlarge").world_size(), 2);
  EXPECT_EQ(machine("inf2.24xlarge").world_size(), 12);
  EXPECT_EQ(machine("inf2.48xlarge").world_size(), 24);
  EXPECT_EQ(machine("inf2.48xlarge").topology, Topology::ring);
  MachineSpec c = machine("4xtrn1.32xlarge");
  EXPECT_EQ(c.world_size(), 128);
  EXPECT_EQ(c.instance_of(127), 3);
  EXPECT_THROW(machine("trn9.huge"), ConfigError);
  EXPECT_THROW(machine("2xinf2.48xlarge"), ConfigError);
  // Torus distances: chip 0 to chip 5 (row 1, col 1) is 2 hops; chip 0 to chip 3 wraps: 1.
  EXPECT_EQ(t.chip_hops(0, 1), 0);
  EXPECT_EQ(t.chip_hops(0, 10), 2);
  EXPECT_EQ(t.chip_hops(0, 6), 1);
  EXPECT_EQ(machine("inf2.48xlarge").chip_hops(0, 22), 1);  // ring wrap: chip 0 to chip 11
}

TEST(SimMachine, TooManyRanksForTheMachineIsAConfigError) {
  LaunchOptions o;
  o.world_size = 4;
  o.instance = "trn1.2xlarge";
  EXPECT_THROW(launch(o, [] {}), ConfigError);
}

// Modeled time of one collective on `p` ranks of trn1.32xlarge with the ring algorithm.
static double modeled(int p, double bytes_per_rank_call,
                      const std::function<void(Communicator&)>& call) {
  LaunchOptions o;
  o.world_size = p;
  o.instance = "trn1.32xlarge";
  o.algorithm = Algorithm::ring;
  LaunchResult res = launch(o, [&] { call(world()); });
  for (auto& r : res.ranks) EXPECT_DOUBLE_EQ(r.sim_seconds, res.ranks[0].sim_seconds);
  return res.sim_seconds();
}

TEST(SimCost, RingCollectivesMatchClosedForms) {
  MachineSpec m = machine("trn1.32xlarge");
  for (int p : {2, 4, 8}) {
    std::vector<int> ranks(p);
    for (int i = 0; i < p; ++i) ranks[i] = i;
    GroupLinks g = group_links(m, ranks);
    // ranks 0..p-1: one chip (p = 2: the calibrated busbw), two neighbouring chips (p = 4: one
    // NeuronLink between them, 96 GiB/s / 2 directions / 2 cores), a torus row of four chips
    // (p = 8: two links per chip, 48 GiB/s per core, under the 52.83 calibrated)
    const double alpha = m.hop_latency,
                 B = p == 2 ? m.collective_busbw : m.link_bandwidth * (p == 4 ? 1 : 2) / 2 / 2;
    EXPECT_DOUBLE_EQ(g.alpha, alpha);
    EXPECT_DOUBLE_EQ(g.bw, B) << "p=" << p;
    const int64_t n = 1 << 16;  // f32 elements per rank call
    const double bytes = 4.0 * n;
    // all-reduce: 2(p-1) alpha + 2 (p-1)/p n/B, plus the launch latency.
    double t_ar = modeled(p, bytes, [&](Communicator& c) {
      Tensor x = ones({n});
      c.all_reduce(x);
    });
    double want_ar = m.launch_latency + 2.0 * (p - 1) * alpha + 2.0 * (p - 1) / p * bytes / B;
    EXPECT_NEAR(t_ar, want_ar, 1e-12) << "p=" << p;
    EXPECT_DOUBLE_EQ(ring_all_reduce_time(p, bytes, alpha, B), want_ar - m.launch_latency);
    // all-gather of n per rank: n_total = p*n; (p-1) alpha + (p-1)/p n_total/B.
    double t_ag = modeled(p, bytes, [&](Communicator& c) { c.all_gather(ones({n}), 0); });
    double want_ag = m.launch_latency + (p - 1) * alpha + double(p - 1) / p * (p * bytes) / B;
    EXPECT_NEAR(t_ag, want_ag, 1e-12) << "p=" << p;
    // reduce-scatter of n total: (p-1) alpha + (p-1)/p n/B.
    double t_rs = modeled(p, bytes, [&](Communicator& c) { c.reduce_scatter(ones({n}), 0); });
    double want_rs = m.launch_latency + (p - 1) * alpha + double(p - 1) / p * bytes / B;
    EXPECT_NEAR(t_rs, want_rs, 1e-12) << "p=" << p;
    std::printf(
        "p=%d ring modeled: all_reduce %.3f us, all_gather %.3f us, reduce_scatter %.3f us\n", p,
        t_ar * 1e6, t_ag * 1e6, t_rs * 1e6);
  }
}

TEST(SimCost, AlgorithmChoiceAndHierarchy) {
  MachineSpec m = machine("trn1.32xlarge");
  std::vector<int> r32(32);
  for (int i = 0; i < 32; ++i) r32[i] = i;
  EXPECT_EQ(collective_cost(m, CollKind::all_reduce, r32, 64e3).algorithm, Algorithm::mesh);
  EXPECT_EQ(collective_cost(m, CollKind::all_reduce, r32, 16e6).algorithm, Algorithm::rdh);
  EXPECT_EQ(collective_cost(m, CollKind::all_reduce, r32, 256e6).algorithm, Algorithm::kangaring);
  // KangaRing (whole chips, large): the ring's busbw x 4/3 for an all-gather (3 HBM touches per
  // byte instead of 4) and x 3/2 for a reduce-scatter (4 instead of 6), under the chip's links.
  {
    const GroupLinks g = group_links(m, r32);
    const double n = 256.0 * (1 << 20), moved = 31.0 / 32 * n, B = m.collective_busbw;
    EXPECT_NEAR(collective_cost(m, CollKind::all_gather, r32, n).seconds,
                m.launch_latency + 16 * g.alpha + moved / (B * 4 / 3), 1e-12);
    EXPECT_NEAR(collective_cost(m, CollKind::reduce_scatter, r32, n).seconds,
                m.launch_latency + 16 * g.alpha + moved / (B * 3 / 2), 1e-12);
    EXPECT_NEAR(collective_cost(m, CollKind::all_reduce, r32, n).seconds,
                m.launch_latency + 32 * g.alpha + moved / (B * 4 / 3) + moved / (B * 3 / 2), 1e-12);
    EXPECT_LE(g.kanga_rs_bw, m.link_bandwidth * m.links_per_chip / 2);
  }
  // A strided group (one core per chip) cannot use KangaRing.
  std::vector<int> strided;
  for (int i = 0; i < 32; i += 2) strided.push_back(i);
  EXPECT_EQ(collective_cost(m, CollKind::all_reduce, strided, 256e6).algorithm, Algorithm::ring);
  // Two instances: hierarchical = intra RS + inter AR on n/Y + intra AG.
  MachineSpec c = machine("2xtrn1.32xlarge");
  std::vector<int> r64(64);
  for (int i = 0; i < 64; ++i) r64[i] = i;
  const double n = double(1 << 30);
  CollCost h = collective_cost(c, CollKind::all_reduce, r64, n, Algorithm::ring);
  GroupLinks g = group_links(c, r64);
  EXPECT_EQ(h.algorithm, Algorithm::hierarchical);
  EXPECT_EQ(g.instances, 2);
  EXPECT_EQ(g.per_instance, 32);
  // three stages, each with its launch
  double want = 3 * c.launch_latency + 2 * ring_reduce_scatter_time(32, n, g.alpha, g.bw) +
                ring_all_reduce_time(2, n / 32, c.efa_latency, c.efa_bandwidth / 32);
  EXPECT_NEAR(h.seconds, want, 1e-12);
  // busbw factors of nccl-tests.
  EXPECT_DOUBLE_EQ(busbw_factor(CollKind::all_reduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(CollKind::all_gather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(CollKind::broadcast, 8), 1.0);
}

TEST(SimClock, RooflineAndCommonFinishTime) {
  LaunchOptions o;
  o.world_size = 2;
  o.instance = "trn1.2xlarge";
  MachineSpec m = resolve_machine(o);
  LaunchResult res = launch(o, [&] {
    SimClock* clk = current_sim_clock();
    ASSERT_NE(clk, nullptr);
    // Compute-bound bf16 matmul 1024^3: 2*1024^3 FLOP at 92 TFLOPS.
    double flops = 2.0 * 1024 * 1024 * 1024;
    if (world().rank() == 1) {
      charge_compute("matmul", flops, 3.0 * 1024 * 1024 * 2, DType::bf16);
      EXPECT_DOUBLE_EQ(clk->now(), flops / 92e12);
      // Memory-bound f32 add: 3 x 4 MiB through HBM.
      double before = clk->now();
      charge_compute("add", 1 << 20, 12.0 * (1 << 20), DType::f32);
      EXPECT_DOUBLE_EQ(clk->now() - before, 12.0 * (1 << 20) / m.core.hbm_bandwidth);
    }
    Tensor x = ones({256});
    world().all_reduce(x);
  });
  const double compute = 2.0 * 1024 * 1024 * 1024 / 92e12 + 12.0 * (1 << 20) / m.core.hbm_bandwidth;
  const double ar = collective_cost(m, CollKind::all_reduce, {0, 1}, 1024).seconds;
  EXPECT_NEAR(res.ranks[0].sim_seconds, compute + ar, 1e-15);
  EXPECT_NEAR(res.ranks[1].sim_seconds, compute + ar, 1e-15);
  EXPECT_NEAR(res.ranks[0].wait_seconds, compute, 1e-15);  // rank 0 waited for rank 1
  EXPECT_NEAR(res.ranks[1].compute_seconds, compute, 1e-15);
}

TEST(SimClock, AsyncCommunicationOverlapsCompute) {
  LaunchOptions o;
  o.world_size = 2;
  o.instance = "trn1.2xlarge";
  MachineSpec m = resolve_machine(o);
  const int64_t n = 1 << 20;
  const double ar = collective_cost(m, CollKind::all_reduce, {0, 1}, 4.0 * n).seconds;
  LaunchResult res = launch(o, [&] {
    Tensor x = ones({n});
    Work w = world().iall_reduce(x);
    charge_compute("matmul", ar * 0.5 * 92e12, 0, DType::bf16);  // half the comm time
    w.wait();
    EXPECT_NEAR(current_sim_clock()->now(), ar, 1e-15);  // overlapped: max, not sum
    charge_compute("matmul", ar * 2 * 92e12, 0, DType::bf16);
    Work w2 = world().iall_reduce(x);
    charge_compute("matmul", ar * 2 * 92e12, 0, DType::bf16);  // longer than the comm
    w2.wait();
    EXPECT_NEAR(current_sim_clock()->now(), 5 * ar, 1e-12);
  });
  EXPECT_NEAR(res.sim_seconds(), 5 * ar, 1e-12);
}

TEST(SimDevice, HbmCapacityAndPeakBytes) {
  LaunchOptions o;
  o.world_size = 2;
  LaunchResult res = launch(o, [] {
    EXPECT_EQ(current_context().memory().capacity(), int64_t{16} << 30);
    // Meta tensors are counted against the core's HBM without allocating host memory.
    Tensor a = empty({int64_t{3} << 30}, DType::f32, Device::meta);  // 12 GiB
    if (world().rank() == 1) {
      try {
        Tensor b = empty({int64_t{5} << 28}, DType::f32, Device::meta);  // +5 GiB > 16 GiB
        ADD_FAILURE() << "expected OutOfDeviceMemory";
      } catch (const OutOfDeviceMemory& e) {
        std::string m = e.what();
        EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
        EXPECT_NE(m.find(std::to_string(int64_t{5} << 30)), std::string::npos) << m;
        EXPECT_NE(m.find(std::to_string(int64_t{16} << 30)), std::string::npos) << m;
      }
    }
  });
  EXPECT_EQ(res.ranks[0].peak_bytes, int64_t{12} << 30);
}

TEST(SimDevice, TimelineIsChromeTraceJson) {
  std::string path = ::testing::TempDir() + "nxd_sim_timeline.json";
  LaunchOptions o;
  o.world_size = 2;
  o.timeline_path = path;
  LaunchResult res = launch(o, [] {
    charge_compute("matmul", 1e9, 1e6, DType::bf16);
    Tensor x = ones({64});
    world().all_reduce(x);
    world().iall_reduce(x).wait();
  });
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string j = ss.str();
  EXPECT_NE(j.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(j.find("\"name\":\"matmul\""), std::string::npos);
  EXPECT_NE(j.find("\"name\":\"all_reduce\""), std::string::npos);
  EXPECT_NE(j.find("\"cat\":\"comm-async\""), std::string::npos);
  EXPECT_NE(j.find("\"tid\":3"), std::string::npos);  // rank 1's async lane
  EXPECT_EQ(res.timeline->events(0).front().name, "matmul");
  std::remove(path.c_str());
}

TEST(SimDevice, TimelineIsRecordedOnlyWhenAskedFor) {
  auto body = [] {
    charge_compute("matmul", 1e9, 1e6, DType::bf16);
    Tensor x = ones({64});
    world().all_reduce(x);
  };
  LaunchOptions o;
  o.world_size = 2;
  LaunchResult quiet = launch(o, body);
  EXPECT_EQ(quiet.timeline, nullptr);
  EXPECT_GT(quiet.ranks[0].sim_seconds, 0);  // the clock runs either way
  o.record_timeline = true;
  LaunchResult rec = launch(o, body);
  ASSERT_NE(rec.timeline, nullptr);
  ASSERT_EQ(rec.timeline->ranks(), 2);
  EXPECT_EQ(rec.timeline->events(1).front().name, "matmul");
  EXPECT_EQ(rec.timeline->events(1).back().name, "all_reduce");
  EXPECT_NE(rec.timeline->events(1).back().args.find("group=[0,1]"), std::string::npos)
      << rec.timeline->events(1).back().args;
  EXPECT_EQ(rec.ranks[0].sim_seconds, quiet.ranks[0].sim_seconds);
}

TEST(SimCost, ModelAgainstPublishedNccomTestFigures) {
  // nccom-test examples (collectives/sim/nccom_figures.h): the large all-reduces where bandwidth
  // dominates and the all-gathers (latency-bound and Mesh sizes), each within its tolerance.
  for (const NccomFigure& r : kNccomFigures) {
    if (r.test_tolerance <= 0) continue;
    const double t = nccom_model_us(r) * 1e-6;
    double err = t * 1e6 / r.us - 1;
    std::printf("%s %d ranks %s %.0f B: published %.2f us, modeled %.2f us (%+.1f%%)%s\n",
                r.instance, r.ranks, coll_kind_name(r.kind), r.bytes, r.us, t * 1e6, err * 100,
                r.calibration ? " (calibration)" : "");
    EXPECT_LT(std::abs(err), r.test_tolerance) << r.instance << " " << r.ranks << " ranks "
                                               << coll_kind_name(r.kind) << " " << r.bytes << " B";
  }
}

// The point-to-point algorithms on the sim backend advance the clock by their closed forms: on
// a machine with every rank on one chip each step costs hop_latency + bytes / busbw, so
// rdh_all_reduce takes 2 lg p alpha + 2(p-1)/p n/B (rdh_all_reduce_time) and ring_all_reduce
// 2(p-1) alpha + 2(p-1)/p n/B; the modeled collective with Algorithm::rdh is that plus the
// launch latency.
TEST(SimCost, RecursiveHalvingDoublingMatchesClosedForm) {
  MachineSpec m = machine("trn1.32xlarge");
  m.cores_per_chip = 8;
  m.chips_per_instance = 1;
  const double alpha = m.hop_latency, B = m.collective_busbw;
  for (int p : {2, 4, 8}) {
    const int64_t n = 3 * 1024;  // f32 elements, divisible by p
    const double bytes = 4.0 * n;
    auto run = [&](Algorithm a, const std::function<void(Communicator&, Tensor&)>& f) {
      LaunchOptions o;
      o.world_size = p;
      o.machine = m;
      o.algorithm = a;
      LaunchResult res = launch(o, [&] {
        Tensor x = full({n}, 1.0 + world().rank());
        f(world(), x);
        EXPECT_EQ(x.to_vector(), std::vector<double>(n, p * (p + 1) / 2.0));
      });
      for (auto& r : res.ranks) EXPECT_NEAR(r.sim_seconds, res.ranks[0].sim_seconds, 1e-15);
      return res.sim_seconds();
    };
    const double t_rdh = run(Algorithm::automatic, [&](Communicator& c, Tensor& x) {
      algorithms::rdh_all_reduce(c, {x.raw_data(), x.raw_data(), n, DType::f32});
    });
    EXPECT_NEAR(t_rdh, rdh_all_reduce_time(p, bytes, alpha, B), 1e-12) << "p=" << p;
    EXPECT_DOUBLE_EQ(rdh_all_reduce_time(p, bytes, alpha, B),
                     2 * std::log2(p) * alpha + 2.0 * (p - 1) / p * bytes / B);
    const double t_ring = run(Algorithm::automatic, [&](Communicator& c, Tensor& x) {
      algorithms::ring_all_reduce(c, {x.raw_data(), x.raw_data(), n, DType::f32});
    });
    EXPECT_NEAR(t_ring, ring_all_reduce_time(p, bytes, alpha, B), 1e-12) << "p=" << p;
    const double t_model =
        run(Algorithm::rdh, [&](Communicator& c, Tensor& x) { c.all_reduce(x); });
    EXPECT_NEAR(t_model, m.launch_latency + rdh_all_reduce_time(p, bytes, alpha, B), 1e-12);
    std::printf("p=%d: rdh over p2p %.3f us, ring over p2p %.3f us, modeled rdh %.3f us\n", p,
                t_rdh * 1e6, t_ring * 1e6, t_model * 1e6);
  }
}

// All-to-all priced pair by pair over the topology: on one chip p-1 rounds of hop latency + n/p
// at the core bandwidth (hand formula), slower across chips and slowest across instances; the
// modeled time of a sim all_to_all is that plus the launch latency.
TEST(SimCost, AllToAllIsPricedPairByPair) {
  MachineSpec m = machine("trn1.32xlarge");
  const double n = 4.0 * (1 << 16);
  EXPECT_NEAR(pairwise_all_to_all_time(m, {0, 1}, n), m.hop_latency + n / 2 / m.collective_busbw,
              1e-15);
  const double one_chip = pairwise_all_to_all_time(m, {0, 1}, n);
  const double two_chips = pairwise_all_to_all_time(m, {0, 2}, n);
  std::vector<int> r8(8), strided8;
  for (int i = 0; i < 8; ++i) r8[i] = i, strided8.push_back(4 * i);
  EXPECT_LE(one_chip, two_chips);  // one hop between neighbour chips costs as much on trn1
  EXPECT_LT(pairwise_all_to_all_time(m, r8, n), pairwise_all_to_all_time(m, strided8, n));
  MachineSpec c = machine("2xtrn1.32xlarge");
  EXPECT_LT(pairwise_all_to_all_time(c, {0, 2}, n), pairwise_all_to_all_time(c, {0, 32}, n));
  const int64_t count = 1 << 14;  // f32 per member, 4 members
  double t = modeled(4, 0, [&](Communicator& g) {
    Tensor x = ones({4 * count}), y = empty({4 * count});
    g.all_to_all(x.raw_data(), y.raw_data(), count, DType::f32);
  });
  EXPECT_NEAR(t, m.launch_latency + pairwise_all_to_all_time(m, {0, 1, 2, 3}, 4.0 * 4 * count),
              1e-12);
  std::printf(
      "all_to_all of 256 KiB per rank: 2 cores of a chip %.2f us, 2 chips %.2f us, 8 "
      "cores %.2f us, 8 chips %.2f us\n",
      one_chip * 1e6, two_chips * 1e6, pairwise_all_to_all_time(m, r8, n) * 1e6,
      pairwise_all_to_all_time(m, strided8, n) * 1e6);
}
