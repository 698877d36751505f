#pragma once
// Optimizer offload on the sim clock (docs/design/fsdp.md "Optimizer offload"): each bucket's
// shard goes to the host over the chip's PCIe link, the host updates it at its memory
// bandwidth, and the updated parameters come back over the link. The three are separate
// resources (the link's two directions and the host's memory), so consecutive buckets pipeline:
// bucket k+1 travels to the host while bucket k is updated and bucket k-1 travels back. Every
// core of a chip moves its shard at once (the link is shared by the chip's cores), and every core
// of an instance updates at once (the host's memory bandwidth is shared by the instance's cores).
#include <vector>

#include "nxd/runtime/sim/machine.h"

namespace nxd::sim {

// What one bucket's round trip moves and touches, in bytes.
struct OffloadBucket {
  double to_host = 0;      // device -> host: the gradient shard (and the weights, when the host
                           // holds no copy of them)
  double host_update = 0;  // host memory the update reads and writes
  double to_device = 0;    // host -> device: the updated parameter shard
};

// One rank's per-bucket rates: the chip's link over its cores, the host's memory over the
// instance's cores (bytes/s; 0 where the machine does not model its host).
struct OffloadRates {
  double link = 0, host_memory = 0;
  explicit OffloadRates(const MachineSpec& m);
};

// When each bucket's updated parameters are back in HBM, for round trips starting at `start`
// in bucket order: the pipeline above.
std::vector<double> offload_ready_times(const OffloadRates& rates, double start,
                                        const std::vector<OffloadBucket>& buckets);

}  // namespace nxd::sim
