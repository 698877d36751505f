// The simulated Trn3 UltraServers (trn3-gen1, trn3-gen2; LNC=2 and LNC=1) against the published
// figures of docs/HARDWARE.md ("Trainium3"), a modeled collective against the bandwidth formula
// written out from those figures, and the Trn3 names nxd refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>

#include "nxd/collectives/sim/collective_cost.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/sim/host_offload.h"

using namespace nxd;
using namespace nxd::sim;

namespace {
std::vector<int> first_ranks(int p, int from = 0) {
  std::vector<int> r(static_cast<size_t>(p));
  std::iota(r.begin(), r.end(), from);
  return r;
}
// The per-rank busbw nxd derives for a Trainium3 logical core of `lnc` physical cores: trn1's
// calibrated 52.83 GiB/s x (4.9 TB/s x lnc / 8) / (820 GiB/s / 2).
double derived_busbw(int lnc) {
  return 52.83 * kGiB * (4.9e12 * lnc / 8) / (820.0 * kGiB / 2);
}
}  // namespace

TEST(SimTrn3, Gen1UltraServerAgainstPublishedFigures) {
  const MachineSpec m = machine("trn3-gen1");  // LNC=2 by default
  EXPECT_EQ(m.name, "trn3-gen1");
  EXPECT_EQ(m.cores_per_chip, 4);
  EXPECT_EQ(m.chips_per_instance * m.instances, 64);  // "64 Trainium3 devices"
  EXPECT_EQ(m.world_size(), 256);
  EXPECT_EQ(m.topology, Topology::switched);
  EXPECT_TRUE(m.ultraserver);
  EXPECT_FALSE(m.kangaring);
  // trn3-arch.html, Gen1 column: 9,216 GiB device memory at 313.6 TB/s, NeuronLink-v4
  // 2,048 GiB/s per device, 8,192 GiB host memory.
  EXPECT_EQ(m.core.hbm_bytes * m.world_size(), int64_t{9216} << 30);
  EXPECT_NEAR(m.core.hbm_bandwidth * m.world_size(), 313.6e12, 1e6);
  EXPECT_DOUBLE_EQ(m.link_bandwidth * m.links_per_chip, 2048 * kGiB);
  EXPECT_EQ(m.host_memory_bytes, int64_t{8192} << 30);
  // trainium3.html: 144 GiB per chip at 4.9 TB/s; a logical core at LNC=2 has a quarter.
  EXPECT_EQ(m.core.hbm_bytes, int64_t{36} << 30);
  EXPECT_NEAR(m.core.hbm_bandwidth * 4, 4.9e12, 1);
  // The TensorE peak (79 BF16 / 20 FP32 TFLOPS per NeuronCore-v4) against the UltraServer's
  // published 42,944 BF16 and 11,712 FP32 TFLOPS (the chips' 671 and 183 are the whole core's).
  const double bf16 = m.core.bf16_flops * m.world_size(), fp32 = m.core.fp32_flops * m.world_size();
  std::printf("trn3-gen1: %.1f PFLOPS BF16 modeled, 42.9 published; %.2f FP32, 11.71 published\n",
              bf16 / 1e15, fp32 / 1e15);
  EXPECT_NEAR(bf16 / 42944e12, 1.0, 0.06);
  EXPECT_NEAR(fp32 / 11712e12, 1.0, 0.15);
  // All-to-all: one hop between any two chips.
  EXPECT_EQ(m.chip_hops(0, 4 * 63), 1);
  EXPECT_EQ(m.chip_hops(0, 4 * 17), 1);
  EXPECT_EQ(m.chip_hops(0, 3), 0);
}

TEST(SimTrn3, Gen2UltraServerAgainstPublishedFigures) {
  const MachineSpec m = machine("trn3-gen2");
  EXPECT_EQ(m.chips_per_instance, 4);  // "36 servers with 4 Trainium3 devices per server"
  EXPECT_EQ(m.instances, 36);
  EXPECT_EQ(m.world_size(), 576);
  EXPECT_TRUE(m.ultraserver);
  // trn3-arch.html, Gen2 column: 20,736 GiB at 705.6 TB/s, 27,648 GiB host memory.
  EXPECT_EQ(m.core.hbm_bytes * m.world_size(), int64_t{20736} << 30);
  EXPECT_NEAR(m.core.hbm_bandwidth * m.world_size(), 705.6e12, 1e6);
  EXPECT_EQ(m.host_memory_bytes * m.instances, int64_t{27648} << 30);
  // 256 GB/s per chip inside a server; 320 GB/s per chip between servers, both directions
  // together: 160 GB/s per direction, 40 GB/s per rank at LNC=2.
  EXPECT_DOUBLE_EQ(m.link_bandwidth * m.links_per_chip, 256e9);
  EXPECT_DOUBLE_EQ(group_links(m, {0, 16}).inter_bw, 40e9);
  EXPECT_DOUBLE_EQ(group_links(machine("trn3-gen2:lnc=1"), {0, 32}).inter_bw, 20e9);
}

TEST(SimTrn3, LogicalCoreConfigOne) {
  const MachineSpec two = machine("trn3-gen1"), one = machine("trn3-gen1:lnc=1");
  EXPECT_EQ(one.name, "trn3-gen1:lnc=1");
  EXPECT_EQ(machine("trn3-gen1:lnc=2").name, "trn3-gen1");
  EXPECT_EQ(one.world_size(), 512);
  EXPECT_EQ(one.core.hbm_bytes, int64_t{18} << 30);
  EXPECT_DOUBLE_EQ(one.core.bf16_flops * 2, two.core.bf16_flops);
  EXPECT_EQ(one.core.hbm_bytes * one.world_size(), two.core.hbm_bytes * two.world_size());
  EXPECT_DOUBLE_EQ(one.collective_busbw, derived_busbw(1));
  EXPECT_DOUBLE_EQ(two.collective_busbw, derived_busbw(2));
  EXPECT_THROW(machine("trn3-gen1:lnc=4"), ConfigError);
}

// A 16-rank ring all-gather (4 whole chips) against (p-1)a + (p-1)/p n/B + launch, with B the
// smaller of the derived busbw and the chip's link share (link bandwidth / 2 / 4 ranks).
TEST(SimTrn3, RingAllGatherAgainstTheBandwidthFormula) {
  const double n = 256.0 * (1 << 20), alpha = 1.5e-6, launch = 3e-6;
  const int p = 16;
  struct Case {
    const char* name;
    double link;  // the chip's published link bandwidth, both directions
  };
  for (const Case& c : {Case{"trn3-gen1", 2048 * kGiB}, Case{"trn3-gen2", 256e9}}) {
    const MachineSpec m = machine(c.name);
    const double bw = std::min(derived_busbw(2), c.link / 2 / 4);
    const double want = (p - 1) * alpha + double(p - 1) / p * n / bw + launch;
    const CollCost got =
        collective_cost(m, CollKind::all_gather, first_ranks(p), n, Algorithm::ring);
    std::printf(
        "%s 16-rank ring all-gather of 256 MiB: %.1f us modeled, %.1f us by formula "
        "(B = %.1f GB/s)\n",
        c.name, got.seconds * 1e6, want * 1e6, bw / 1e9);
    EXPECT_NEAR(got.seconds / want, 1.0, 1e-12) << c.name;
  }
  // Gen1's link share (275 GB/s per rank) exceeds the busbw, Gen2's (32 GB/s) binds.
  EXPECT_LT(derived_busbw(2), 2048 * kGiB / 8);
  EXPECT_GT(derived_busbw(2), 256e9 / 8);
}

// No KangaRing on Trn3 (not published): a large whole-chip all-reduce runs Ring where trn2 runs
// KangaRing; Mesh and RDH (published for Trn3) keep their size ranges.
TEST(SimTrn3, AlgorithmsByMessageSize) {
  const MachineSpec t3 = machine("trn3-gen1"), t2 = machine("trn2.48xlarge");
  const std::vector<int> r = first_ranks(16);
  EXPECT_EQ(collective_cost(t3, CollKind::all_reduce, r, 128 << 10).algorithm, Algorithm::mesh);
  EXPECT_EQ(collective_cost(t3, CollKind::all_reduce, r, 2 << 20).algorithm, Algorithm::rdh);
  EXPECT_EQ(collective_cost(t3, CollKind::all_reduce, r, 512 << 20).algorithm, Algorithm::ring);
  EXPECT_EQ(collective_cost(t2, CollKind::all_reduce, r, 512 << 20).algorithm,
            Algorithm::kangaring);
  // Gen2: across two servers the all-reduce is hierarchical (reduce-scatter in each server, the
  // servers' all-reduce, all-gather), so slower than the same buffer inside one server.
  const MachineSpec g2 = machine("trn3-gen2");
  const CollCost two = collective_cost(g2, CollKind::all_reduce, first_ranks(32), 64 << 20);
  EXPECT_EQ(two.algorithm, Algorithm::hierarchical);
  EXPECT_GT(two.seconds,
            collective_cost(g2, CollKind::all_reduce, first_ranks(16), 64 << 20).seconds);
}

TEST(SimTrn3, UnpublishedNamesAndClustersAreRefused) {
  for (const char* name : {"trn3.48xlarge", "trn3u", "trn3.48xlarge:lnc=1"}) {
    try {
      machine(name);
      FAIL() << name << ": no error";
    } catch (const ConfigError& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("AWS publishes no Trn3 instance size"), std::string::npos) << w;
      EXPECT_NE(w.find("trn3-gen1"), std::string::npos) << w;
    }
  }
  EXPECT_THROW(machine("2xtrn3-gen1"), ConfigError);
  EXPECT_THROW(cluster(machine("trn3-gen2"), 2), ConfigError);
  EXPECT_EQ(cluster(machine("trn3-gen2"), 1).world_size(), 576);
  // The host side is not published: optimizer offload is refused, naming why.
  try {
    OffloadRates rates(machine("trn3-gen1"));
    FAIL() << "offload on trn3 was modeled";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("host link"), std::string::npos) << e.what();
  }
}
