#include "nxd/runtime/sim/host_offload.h"

#include <algorithm>

#include "nxd/runtime/error.h"

namespace nxd::sim {

OffloadRates::OffloadRates(const MachineSpec& m)
    : link(m.host_link_bandwidth / m.cores_per_chip),
      host_memory(m.host_memory_bandwidth / m.cores_per_instance()) {
  NXD_CHECK_T(ConfigError, m.host_unknown.empty(), "[sim] optimizer offload on ", m.name,
              " is not modeled: ", m.host_unknown);
}

namespace {
double seconds(double bytes, double rate) {
  return rate > 0 ? bytes / rate : 0.0;
}
}  // namespace

std::vector<double> offload_ready_times(const OffloadRates& rates, double start,
                                        const std::vector<OffloadBucket>& buckets) {
  std::vector<double> ready;
  ready.reserve(buckets.size());
  double down = start, update = start, up = start;  // when each resource is free
  for (const OffloadBucket& b : buckets) {
    down += seconds(b.to_host, rates.link);
    update = std::max(update, down) + seconds(b.host_update, rates.host_memory);
    up = std::max(up, update) + seconds(b.to_device, rates.link);
    ready.push_back(up);
  }
  return ready;
}

}  // namespace nxd::sim
