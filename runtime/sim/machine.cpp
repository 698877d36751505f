#include "nxd/runtime/sim/machine.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "nxd/runtime/error.h"
#include "nxd/runtime/sim/machine_trn3.h"

namespace nxd::sim {
namespace {

// Every number below, its public source and whether nxd derived or calibrated it: docs/HARDWARE.md.
constexpr const char* kSrcNki =
    "TensorE 92 TFLOPS BF16 / 23 TFLOPS FP32 per NeuronCore-v2: NKI architecture guide, "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/arch/"
    "trainium_inferentia2_arch.html";
constexpr const char* kSrcHbm =
    "16 GiB per Inferentia2/Trainium1 NeuronCore: aws-neuron-sdk@81ce03a "
    "about-neuron/transformers/generative-llm-inference-with-neuron.rst line 218";
constexpr const char* kSrcHbmBw =
    "HBM 820 GiB/s per chip (trainium.html, inferentia2.html); per core 410 GiB/s [derived: /2]";
constexpr const char* kSrcTrn1 =
    "trn1 instances: chips, cores, NeuronLink-v2 384 GiB/s per chip (4 ports -> 96 GB/s per link "
    "[derived]), 800 Gbps EFA (1600 on trn1n), 2D 4x4 torus: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/"
    "trn1-arch.html";
constexpr const char* kSrcInf2 =
    "inf2 instances: chips, cores, NeuronLink-v2 192 GiB/s per chip (2 ports x 96 GiB/s), ring "
    "topology: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/"
    "neuron-hardware/inf2-arch.html";
constexpr const char* kSrcHop =
    "ring/KangaRing per-hop latency 1-2 us (1.5 us used): "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/"
    "intranode-collective-comm.html";
constexpr const char* kSrcBusbw =
    "achievable per-rank busbw 52.83 GiB/s: nccom-test 2-rank fp32 all-reduce, 1 GiB in 18,930 us "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/neuron-sys-tools/"
    "nccom-test.html";
constexpr const char* kSrcLaunch =
    "collective launch floor 3 us [calibrated: the model then gives 6.0 us for the nccom-test "
    "32-rank all-gather measured at 6.16 us at 1 KiB] "
    "(newer SDK output on the nccom-test page)";
constexpr const char* kSrcKanga =
    "KangaRing (whole-chip groups, > 56 MB) at the ring busbw x 4/3 (all-gather) and x 3/2 "
    "(reduce-scatter): its HBM touches per byte, 3 instead of 4 and 4 instead of 6 [nxd assumes "
    "the ring busbw is bound by them], capped by the chip's NeuronLinks: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/"
    "intranode-collective-comm.html";
constexpr const char* kSrcEfa =
    "EFA per-hop latency ~15 us: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/"
    "internode-collective-comm.html";
constexpr const char* kSrcInfNet =
    "inf2 network 15/25/50/100 Gbps: third-party table citing AWS product pages (unverified)";
constexpr const char* kSrcNcV3 =
    "TensorE 79 BF16/FP16/TF32 TFLOPS per NeuronCore-v3 (NeuronCore-v3 page); 20 FP32 TFLOPS "
    "(NKI Trainium2 architecture guide); a logical core of LNC physical cores has LNC times "
    "both [derived]: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/"
    "neuron-core-v3.html";
constexpr const char* kSrcTrn2Chip =
    "Trainium2 chip: 8 NeuronCore-v3, 96 GiB HBM at 2.9 TB/s (per logical core: / (8 / LNC) "
    "[derived]), NeuronLink-v3 1.28 TB/s per chip: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/"
    "trainium2.html; 4 NeuronLink-v3 ports per chip (NKI Trainium2 architecture guide)";
constexpr const char* kSrcTrn2 =
    "trn2.48xlarge / trn2u.48xlarge: 16 Trainium2 chips in a 4x4 2D torus, NeuronLink-v3 "
    "1,024 GB/s per chip inside the instance (4 ports -> 256 GB/s per link [derived]), EFAv3 "
    "3,200 Gbps; Trn2 UltraServer: 4 trn2u.48xlarge, chips at the same coordinates in a "
    "NeuronLink-v3 ring, 256 GB/s per chip between instances: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/"
    "trn2-arch.html";
constexpr const char* kSrcLnc =
    "LNC=2 by default on Trn2 (each visible NeuronCore is two physical ones), LNC=1 selectable: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/tutorials/"
    "trn2-llama3.1-405b-tutorial.html; 4 ranks per chip at LNC=2: "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/about/collectives.html";
constexpr const char* kSrcTrn2Busbw =
    "trn2 per-rank busbw [derived, nxd's assumption]: trn1's calibrated 52.83 GiB/s times the "
    "ratio of HBM bandwidth per core (trn2 logical core 2.9 TB/s x LNC / 8 against trn1's "
    "820 GiB/s / 2): the ring is taken to be bound by HBM traffic, as for KangaRing";
constexpr const char* kSrcTrn2Efa =
    "EFA ~15 us per hop measured on trn2.48xl (ib_write_lat HBM to HBM): "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/about/collectives.html";

constexpr const char* kSrcHostTrn1 =
    "host side [assumed: AWS publishes neither the chips' host link nor the host CPU's memory]: "
    "PCIe 4.0 x16 per Trainium/Inferentia2 chip, 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s per "
    "direction (PCI-SIG PCIe 4.0 rate); host memory 409.6 GB/s per 16-chip host (2 sockets x 8 "
    "channels of DDR4-3200 at 25.6 GB/s, JEDEC rate), a smaller instance its chips' share; "
    "128 vCPUs and 512 GiB of host memory per trn1.32xlarge: trn1-arch.html";
constexpr const char* kSrcHostTrn2 =
    "host side [assumed: not published]: PCIe 5.0 x16 per Trainium2 chip, 32 GT/s x 16 x 128/130 "
    "= 63.0 GB/s per direction (PCI-SIG PCIe 5.0 rate); host memory 614.4 GB/s per instance (2 "
    "sockets x 8 channels of DDR5-4800 at 38.4 GB/s, JEDEC rate); 192 vCPUs and 2 TiB of host "
    "memory per trn2.48xlarge: trn2-arch.html";
constexpr double kPcie4x16 = 16e9 * 16 * 128 / 130 / 8;  // bytes/s per direction
constexpr double kPcie5x16 = 2 * kPcie4x16;

CoreSpec neuron_core_v2() {
  CoreSpec c;
  c.name = "NeuronCore-v2";
  c.bf16_flops = 92e12;
  c.fp32_flops = 23e12;
  c.hbm_bandwidth = 820.0 * kGiB / 2;
  c.hbm_bytes = int64_t{16} << 30;
  return c;
}

MachineSpec base(const std::string& name, int chips) {
  MachineSpec m;
  m.name = name;
  m.core = neuron_core_v2();
  m.cores_per_chip = 2;
  m.chips_per_instance = chips;
  m.hop_latency = 1.5e-6;
  m.collective_busbw = 52.83 * kGiB;
  m.launch_latency = 3e-6;
  m.efa_latency = 15e-6;
  m.link_bandwidth = 96 * kGiB;
  m.host_link_bandwidth = kPcie4x16;
  m.host_memory_bandwidth = 409.6e9 * chips / 16;
  m.host_memory_bytes = (int64_t{32} << 30) * chips;  // trn1: 32 GiB per chip (trn1-arch.html)
  m.sources = {kSrcNki,    kSrcHbm,   kSrcHbmBw, kSrcHop,     kSrcBusbw,
               kSrcLaunch, kSrcKanga, kSrcEfa,   kSrcHostTrn1};
  return m;
}

MachineSpec trn1(const std::string& name, int chips, double efa_gbps) {
  MachineSpec m = base(name, chips);
  m.topology = chips == 16 ? Topology::torus_2d : Topology::single_chip;
  m.links_per_chip = chips == 16 ? 4 : 0;
  m.efa_bandwidth = efa_gbps * 1e9 / 8;
  m.sources.push_back(kSrcTrn1);
  return m;
}

MachineSpec inf2(const std::string& name, int chips, double net_gbps, int64_t host_gib) {
  MachineSpec m = base(name, chips);
  m.host_memory_bytes = host_gib << 30;  // inf2-arch.html
  m.topology = chips > 1 ? Topology::ring : Topology::single_chip;
  m.links_per_chip = chips > 1 ? 2 : 0;
  m.efa_bandwidth = net_gbps * 1e9 / 8;
  m.sources.push_back(kSrcInf2);
  m.sources.push_back(kSrcInfNet);
  return m;
}

// Trainium2: a logical NeuronCore of `lnc` physical NeuronCore-v3 (LNC=2 by default, 1
// selectable); the chip's 8 physical cores give 8 / lnc logical ones.
CoreSpec neuron_core_v3(int lnc) {
  return logical_neuron_core("NeuronCore-v3", lnc, 96, 2.9e12);
}

constexpr double kTrn1CoreHbmBandwidth = 820.0 * kGiB / 2;

MachineSpec trn2(const std::string& name, int lnc) {
  NXD_CHECK_T(ConfigError, lnc == 1 || lnc == 2, "[sim::machine] ", name,
              ": logical NeuronCore config must be lnc=1 or lnc=2, got lnc=", lnc);
  MachineSpec m = base(name, 16);
  m.core = neuron_core_v3(lnc);
  m.cores_per_chip = 8 / lnc;
  m.topology = Topology::torus_2d;
  m.links_per_chip = 4;
  m.link_bandwidth = 1024e9 / 4;
  m.collective_busbw = 52.83 * kGiB * m.core.hbm_bandwidth / kTrn1CoreHbmBandwidth;
  m.efa_bandwidth = 3200e9 / 8;
  m.host_link_bandwidth = kPcie5x16;
  m.host_memory_bandwidth = 614.4e9;
  m.host_memory_bytes = int64_t{2048} << 30;
  m.sources = {kSrcNcV3,   kSrcTrn2Chip,  kSrcTrn2,  kSrcLnc,     kSrcHop,     kSrcBusbw,
               kSrcLaunch, kSrcTrn2Busbw, kSrcKanga, kSrcTrn2Efa, kSrcHostTrn2};
  if (lnc != 2) m.name = str(name, ":lnc=", lnc);
  return m;
}

// The Trn2 UltraServer: 4 trn2u.48xlarge joined by NeuronLink-v3 (a ring through the chips at
// the same torus coordinates, 256 GB/s per chip): nxd models it as 4 instances whose
// inter-instance fabric is that ring instead of EFA.
MachineSpec trn2_ultraserver(int lnc) {
  MachineSpec m = trn2("trn2u", lnc);
  m.instances = 4;
  m.efa_bandwidth = 256e9 * m.chips_per_instance;
  m.efa_latency = m.hop_latency;
  m.ultraserver = true;
  return m;
}

// "<type>" or "<type>:lnc=<1|2>" (Trainium2 and Trainium3 only).
int parse_lnc(const std::string& full, std::string* type) {
  const auto colon = full.find(':');
  *type = full.substr(0, colon);
  if (colon == std::string::npos) return 0;
  const std::string opt = full.substr(colon + 1);
  NXD_CHECK_T(ConfigError, opt == "lnc=1" || opt == "lnc=2", "[sim::machine] '", full,
              "': the only instance option is :lnc=1 or :lnc=2 (Trainium2, Trainium3)");
  NXD_CHECK_T(ConfigError, type->rfind("trn2", 0) == 0 || type->rfind("trn3", 0) == 0,
              "[sim::machine] '", full,
              "': logical NeuronCores (:lnc=) exist on Trainium2 and Trainium3 only");
  return opt == "lnc=1" ? 1 : 2;
}

MachineSpec builtin(const std::string& full) {
  std::string n;
  const int lnc = parse_lnc(full, &n);
  if (n == "trn2.48xlarge" || n == "trn2u.48xlarge") return trn2(n, lnc == 0 ? 2 : lnc);
  if (n == "trn2u") return trn2_ultraserver(lnc == 0 ? 2 : lnc);
  if (n == "trn3-gen1" || n == "trn3-gen2") return trn3_ultraserver(n, lnc == 0 ? 2 : lnc);
  if (n.rfind("trn3", 0) == 0) refuse_unpublished_trn3(n);
  if (n == "trn1.2xlarge") return trn1(n, 1, 25);
  if (n == "trn1.32xlarge") return trn1(n, 16, 800);
  if (n == "trn1n.32xlarge") {
    MachineSpec m = trn1(n, 16, 1600);
    m.link_bandwidth = 192 * kGiB;  // 768 GiB/s per chip as documented (see caution in notes)
    return m;
  }
  if (n == "inf2.xlarge") return inf2(n, 1, 15, 16);
  if (n == "inf2.8xlarge") return inf2(n, 1, 25, 128);
  if (n == "inf2.24xlarge") return inf2(n, 6, 50, 384);
  if (n == "inf2.48xlarge") return inf2(n, 12, 100, 768);
  std::string known;
  for (auto& k : machine_names()) known += " " + k;
  throw ConfigError(str("[sim::machine] unknown instance type '", n, "'; known:", known,
                        " (<N>x<type> clusters of trn1 and trn2 types; :lnc=1 on trn2 and trn3 "
                        "types)"));
}

}  // namespace

const char* topology_name(Topology t) {
  switch (t) {
    case Topology::single_chip:
      return "single chip";
    case Topology::torus_2d:
      return "2D torus";
    case Topology::ring:
      return "ring";
    case Topology::switched:
      return "all-to-all switch";
  }
  return "?";
}

std::vector<std::string> machine_names() {
  return {"trn1.2xlarge",   "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge",
          "trn2u.48xlarge", "trn2u",         "trn3-gen1",      "trn3-gen2",
          "inf2.xlarge",    "inf2.8xlarge",  "inf2.24xlarge",  "inf2.48xlarge"};
}

MachineSpec cluster(const MachineSpec& inst, int instances) {
  NXD_CHECK_T(ConfigError, instances >= 1, "[sim::cluster] need >= 1 instances, got ", instances);
  NXD_CHECK_T(ConfigError, instances == 1 || inst.name.rfind("inf2", 0) != 0, "[sim::cluster] ",
              inst.name,
              ": Neuron supports Inf2 collectives on a single instance only (nccom-test docs)");
  NXD_CHECK_T(ConfigError, instances == 1 || !inst.ultraserver, "[sim::cluster] ", inst.name,
              " is an UltraServer (one scale-up domain); clusters of UltraServers are not "
              "modeled (for Trn2: <N>xtrn2u.48xlarge, EFA between instances)");
  MachineSpec m = inst;
  if (inst.ultraserver) return m;
  m.instances = instances;
  if (instances > 1) m.name = str(instances, "x", inst.name);
  return m;
}

MachineSpec machine(const std::string& name) {
  auto x = name.find('x');
  if (x != std::string::npos && x > 0 &&
      std::all_of(name.begin(), name.begin() + x, [](char c) { return c >= '0' && c <= '9'; })) {
    return cluster(builtin(name.substr(x + 1)), std::atoi(name.substr(0, x).c_str()));
  }
  return builtin(name);
}

int MachineSpec::chip_hops(int a, int b) const {
  int ca = (a % cores_per_instance()) / cores_per_chip;
  int cb = (b % cores_per_instance()) / cores_per_chip;
  if (ca == cb) return 0;
  switch (topology) {
    case Topology::single_chip:
    case Topology::switched:
      return 1;
    case Topology::ring: {
      int d = std::abs(ca - cb);
      return std::min(d, chips_per_instance - d);
    }
    case Topology::torus_2d: {
      int cols = torus_cols, rows = std::max(1, chips_per_instance / torus_cols);
      int dx = std::abs(ca % cols - cb % cols), dy = std::abs(ca / cols - cb / cols);
      return std::min(dx, cols - dx) + std::min(dy, rows - dy);
    }
  }
  return 1;
}

std::string MachineSpec::describe() const {
  std::ostringstream os;
  os << name << ": " << instances << " instance(s) x " << chips_per_instance << " chips x "
     << cores_per_chip << " " << core.name << " = " << world_size() << " cores; "
     << topology_name(topology) << "\n";
  os << "  per core: " << core.bf16_flops / 1e12 << " TFLOPS bf16, " << core.fp32_flops / 1e12
     << " TFLOPS fp32, HBM " << core.hbm_bytes / kGiB << " GiB at " << core.hbm_bandwidth / kGiB
     << " GiB/s\n";
  os << "  NeuronLink: " << links_per_chip << " x " << link_bandwidth / kGiB
     << " GiB/s per chip, hop " << hop_latency * 1e6 << " us; collective busbw "
     << collective_busbw / kGiB << " GiB/s, launch " << launch_latency * 1e6 << " us\n";
  os << (ultraserver && instances > 1 ? "  between instances (UltraServer fabric): " : "  EFA: ")
     << efa_bandwidth * 8 / 1e9 << " Gbps per instance, " << efa_latency * 1e6 << " us per hop\n";
  os << "  host: PCIe " << host_link_bandwidth / kGB << " GB/s per chip per direction, memory "
     << host_memory_bytes / kGiB << " GiB at " << host_memory_bandwidth / kGB
     << " GB/s per instance" << (host_unknown.empty() ? "" : " (not published)") << "\n";
  os << "  sources:\n";
  for (auto& s : sources) os << "   - " << s << "\n";
  return os.str();
}

}  // namespace nxd::sim
