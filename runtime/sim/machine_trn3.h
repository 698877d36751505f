#pragma once
// The Trn3 UltraServers (Trainium3, NeuronCore-v4) as sim machines: what AWS publishes about them
// and how nxd models what it does not (docs/HARDWARE.md, "Trainium3"). Used by sim::machine.
#include <string>

#include "nxd/runtime/sim/machine.h"

namespace nxd::sim {

// "trn3-gen1" (64 chips, one all-to-all switched domain) or "trn3-gen2" (36 servers of 4 chips)
// at `lnc` physical NeuronCore-v4 per logical core (1 or 2).
MachineSpec trn3_ultraserver(const std::string& name, int lnc);

// Throws ConfigError for a trn3 name nxd does not model (every name but the two above): AWS
// publishes no Trn3 instance size, only the two UltraServers.
void refuse_unpublished_trn3(const std::string& name);

}  // namespace nxd::sim
