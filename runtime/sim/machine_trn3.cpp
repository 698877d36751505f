#include "nxd/runtime/sim/machine_trn3.h"

#include "nxd/runtime/error.h"

namespace nxd::sim {
namespace {

// Every number below, its public source and what nxd derives or assumes: docs/HARDWARE.md,
// "Trainium3".
constexpr const char* kSrcTrn3Chip =
    "Trainium3 chip: 8 NeuronCore-v4; 671 BF16/FP16/TF32, 183 FP32 dense TFLOPS; 144 GiB HBM at "
    "4.9 TB/s (per logical core: / (8 / LNC) [derived]); NeuronLink-v4 2.56 TB/s per device: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/"
    "trainium3.html";
constexpr const char* kSrcNcV4 =
    "TensorE 79 BF16/FP16/TF32 and 20 FP32 TFLOPS per NeuronCore-v4, 32 MiB SRAM; a logical "
    "core of LNC physical cores has LNC times both [derived]: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/"
    "neuron-core-v4.html";
constexpr const char* kSrcTrn3 =
    "Trn3 Gen1 UltraServer: 4 servers x 16 Trainium3, all-to-all through NeuronSwitch-v1, "
    "NeuronLink-v4 2,048 GiB/s per device, EFA 12,800 Gbps, 8,192 GiB host memory; Gen2: 36 "
    "servers x 4 Trainium3, 256 GB/s per chip inside a server (PCIe switch), 320 GB/s per chip "
    "between servers (bidirectional; per direction / 2 [derived]), EFA 28,800 Gbps, 27,648 GiB "
    "host memory: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/"
    "neuron-hardware/trn3-arch.html";
constexpr const char* kSrcTrn3Lnc =
    "LNC=1 or 2 on Trn3 (logical-neuroncore-config.html); LNC=2 is nxd's default as in the "
    "published Trn3 tutorial (8 x TP 8 at LNC=2 per Trn3 server): "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/tutorials/"
    "trn3-gpt-oss-120b-tutorial.html";
constexpr const char* kSrcTrn3Coll =
    "Trn3 collectives: Ring, Mesh and RDH (Neuron runtime release notes, "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/"
    "runtime.html); KangaRing not published for Trn3, so not used. Per-hop latency 1.5 us, launch "
    "3 us [assumed: the trn1/trn2 figures; no Trn3 figure is published]; per-rank busbw "
    "[derived, nxd's assumption]: trn1's calibrated 52.83 GiB/s x (HBM bandwidth per Trn3 "
    "logical core / per trn1 core)";
constexpr const char* kHostUnknown =
    "AWS publishes neither the Trainium3 chips' host link nor the Trn3 hosts' memory bandwidth "
    "(trn3-arch.html gives only vCPUs and host memory size)";

constexpr double kTrn1CoreHbmBandwidth = 820.0 * kGiB / 2;

}  // namespace

CoreSpec logical_neuron_core(const std::string& version, int lnc, int64_t chip_hbm_gib,
                             double chip_hbm_bandwidth) {
  CoreSpec c;
  c.name = str(version, " (LNC=", lnc, ")");
  c.bf16_flops = 79e12 * lnc;
  c.fp32_flops = 20e12 * lnc;
  c.hbm_bandwidth = chip_hbm_bandwidth * lnc / 8;
  c.hbm_bytes = (chip_hbm_gib << 30) * lnc / 8;
  return c;
}

MachineSpec trn3_ultraserver(const std::string& name, int lnc) {
  NXD_CHECK_T(ConfigError, lnc == 1 || lnc == 2, "[sim::machine] ", name,
              ": logical NeuronCore config must be lnc=1 or lnc=2, got lnc=", lnc);
  const bool gen1 = name == "trn3-gen1";
  NXD_CHECK_T(ConfigError, gen1 || name == "trn3-gen2", "[sim::machine] '", name,
              "' is not a Trn3 UltraServer (trn3-gen1, trn3-gen2)");
  MachineSpec m;
  m.name = lnc == 2 ? name : str(name, ":lnc=", lnc);
  m.core = logical_neuron_core("NeuronCore-v4", lnc, 144, 4.9e12);
  m.cores_per_chip = 8 / lnc;
  m.topology = Topology::switched;
  m.links_per_chip = 1;  // the switch port: the chip's whole bandwidth to any other chip
  m.hop_latency = 1.5e-6;
  m.launch_latency = 3e-6;
  m.collective_busbw = 52.83 * kGiB * m.core.hbm_bandwidth / kTrn1CoreHbmBandwidth;
  m.kangaring = false;
  m.ultraserver = true;
  m.host_unknown = kHostUnknown;
  if (gen1) {
    // One scale-up domain of 64 chips, all-to-all; no split of the bandwidth between the four
    // servers is published, so nxd models it as one instance.
    m.chips_per_instance = 64;
    m.link_bandwidth = 2048 * kGiB;
    m.efa_bandwidth = 12800e9 / 8;  // unused: clusters of UltraServers are refused
    m.host_memory_bytes = int64_t{8192} << 30;
  } else {
    // 36 servers of 4 chips: a PCIe switch inside a server, the inter-server switches between
    // them (the "instances" of the model, joined by that fabric instead of EFA).
    m.chips_per_instance = 4;
    m.instances = 36;
    m.link_bandwidth = 256e9;
    m.efa_bandwidth = 320e9 / 2 * m.chips_per_instance;
    m.efa_latency = m.hop_latency;
    m.host_memory_bytes = (int64_t{27648} << 30) / 36;
  }
  m.sources = {kSrcTrn3Chip, kSrcNcV4, kSrcTrn3, kSrcTrn3Lnc, kSrcTrn3Coll};
  return m;
}

void refuse_unpublished_trn3(const std::string& name) {
  throw ConfigError(str("[sim::machine] '", name,
                        "': AWS publishes no Trn3 instance size (its chips, topology and EFA per "
                        "instance are unknown); nxd models the Trn3 UltraServers only: trn3-gen1 "
                        "(64 Trainium3), trn3-gen2 (144 Trainium3)"));
}

}  // namespace nxd::sim
