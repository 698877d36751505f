#pragma once
// The Trn3 UltraServers (Trainium3, NeuronCore-v4) as sim machines: what AWS publishes about them
// and how nxd models what it does not (docs/HARDWARE.md, "Trainium3"). Used by sim::machine.
#include <string>

#include "nxd/runtime/sim/machine.h"

namespace nxd::sim {

// A logical NeuronCore of `lnc` physical ones of an 8-core Trainium2 or Trainium3 chip whose
// HBM is `chip_hbm_gib` GiB at `chip_hbm_bandwidth` bytes/s: LNC times a physical core's TensorE
// (79 BF16 and 20 FP32 TFLOPS on NeuronCore-v3 and -v4 alike) and the chip's HBM / (8 / lnc).
CoreSpec logical_neuron_core(const std::string& version, int lnc, int64_t chip_hbm_gib,
                             double chip_hbm_bandwidth);

// "trn3-gen1" (64 chips, one all-to-all switched domain) or "trn3-gen2" (36 servers of 4 chips)
// at `lnc` physical NeuronCore-v4 per logical core (1 or 2).
MachineSpec trn3_ultraserver(const std::string& name, int lnc);

// Throws ConfigError for a trn3 name nxd does not model (every name but the two above): AWS
// publishes no Trn3 instance size, only the two UltraServers.
void refuse_unpublished_trn3(const std::string& name);

}  // namespace nxd::sim
