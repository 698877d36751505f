#pragma once
// The simulated AWS Neuron machine: spec tables for NeuronCore-v2 instances (Trn1, Trn1n, Inf2),
// Trainium2 instances (NeuronCore-v3, as logical cores of LNC physical ones), the Trn3
// UltraServers (NeuronCore-v4) and clusters of them, with the public source of every number
// (machine.cpp, machine_trn3.cpp). Ranks map to cores in order: rank r is core
// r % cores_per_chip of chip (r / cores_per_chip) % chips of instance r / cores_per_instance.
// Users can define their own MachineSpec and pass it to sim::launch.
#include <cstdint>
#include <string>
#include <vector>

namespace nxd::sim {

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kGB = 1e9;

struct CoreSpec {
  std::string name = "NeuronCore-v2";
  double bf16_flops = 0;     // dense TensorE FLOP/s for BF16/FP16/TF32 inputs
  double fp32_flops = 0;     // TensorE FLOP/s for FP32 inputs
  double hbm_bandwidth = 0;  // bytes/s of HBM per core
  int64_t hbm_bytes = 0;     // device memory per core
};

// switched: every chip of an instance reaches every other through a switch in one hop (Trn3's
// NeuronSwitch-v1), modeled as one port per chip carrying the chip's whole link bandwidth.
enum class Topology { single_chip, torus_2d, ring, switched };
const char* topology_name(Topology t);

struct MachineSpec {
  std::string name;
  CoreSpec core;
  int cores_per_chip = 2;
  int chips_per_instance = 1;
  int instances = 1;
  Topology topology = Topology::single_chip;
  int torus_cols = 4;           // chips per row of the 2D torus
  double link_bandwidth = 0;    // NeuronLink-v2 bytes/s per link
  int links_per_chip = 0;       // NeuronLink-v2 ports per chip
  double hop_latency = 0;       // s per NeuronLink (or on-chip) ring step
  double collective_busbw = 0;  // achievable per-rank collective bus bandwidth, bytes/s
  double launch_latency = 0;    // fixed start cost of one collective, s
  double efa_bandwidth = 0;     // bytes/s per instance (all EFA devices; in a Trn2 UltraServer
                                // the NeuronLink-v3 ring, in a Trn3 Gen2 one the inter-server
                                // switches, between instances)
  double efa_latency = 0;       // s per inter-instance step
  bool ultraserver = false;     // an UltraServer: one scale-up domain, never clustered
  bool kangaring = true;        // the runtime's KangaRing exists here (not published for Trn3)
  // The host side (optimizer offload, runtime/sim/host_offload.h): each chip's PCIe link to the
  // host, bytes/s per direction, shared by the chip's cores; the host's memory bandwidth, bytes/s
  // per instance, shared by its cores. 0: not modeled (offload costs no time).
  double host_link_bandwidth = 0;
  double host_memory_bandwidth = 0;
  int64_t host_memory_bytes = 0;  // host RAM per instance (what offloaded state must fit)
  // Non-empty: the host link and host memory bandwidth are not published for this machine, and
  // optimizer offload is refused with this reason (rather than charged no time).
  std::string host_unknown;
  std::vector<std::string> sources;  // where every number comes from

  int cores_per_instance() const { return cores_per_chip * chips_per_instance; }
  int world_size() const { return cores_per_instance() * instances; }
  int instance_of(int rank) const { return rank / cores_per_instance(); }
  int chip_of(int rank) const { return rank / cores_per_chip; }  // global chip index
  // NeuronLink hops between the chips of two ranks of one instance (0 on the same chip).
  int chip_hops(int rank_a, int rank_b) const;
  double peak_flops(bool bf16) const { return bf16 ? core.bf16_flops : core.fp32_flops; }
  std::string describe() const;  // multi-line table with sources
};

// Built-in instance types: trn1.2xlarge, trn1.32xlarge, trn1n.32xlarge, trn2.48xlarge,
// trn2u.48xlarge, trn2u (the Trn2 UltraServer: 4 trn2u.48xlarge over NeuronLink-v3), trn3-gen1
// and trn3-gen2 (the Trn3 Gen1 and Gen2 UltraServers; no Trn3 instance size is published, so
// other trn3 names are refused), inf2.xlarge, inf2.8xlarge, inf2.24xlarge, inf2.48xlarge;
// "<N>x<type>" is a cluster of N instances over EFA (e.g. "4xtrn1.32xlarge"; Inf2 clusters and
// clusters of UltraServers are refused: Neuron supports Inf2 collectives on one instance only).
// Trainium2 and Trainium3 types run at LNC=2 (4 logical cores per chip); "<type>:lnc=1" selects
// LNC=1 (8). Throws ConfigError naming the known types.
MachineSpec machine(const std::string& name);
std::vector<std::string> machine_names();
// N instances of `inst` joined by EFA.
MachineSpec cluster(const MachineSpec& inst, int instances);

}  // namespace nxd::sim
