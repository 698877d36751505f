#include "nxd/optim/offload.h"

#include "nxd/runtime/error.h"
#include "nxd/runtime/sim/clock.h"

namespace nxd::optim {

sim::OffloadBucket offload_bucket(int64_t shard_numel, DType grad_dtype, DType param_dtype,
                                  int state_tensors, bool host_masters) {
  const double n = static_cast<double>(shard_numel);
  const double g = static_cast<double>(dtype_size(grad_dtype));
  const double p = static_cast<double>(dtype_size(param_dtype));
  sim::OffloadBucket b;
  b.to_host = n * (g + (host_masters ? 0.0 : p));
  b.host_update = n * (g + 8.0 * (state_tensors + 1) + (param_dtype == DType::bf16 ? 2.0 : 0.0));
  b.to_device = n * p;
  return b;
}

OffloadSchedule::OffloadSchedule(const std::vector<sim::OffloadBucket>& buckets) {
  if (const sim::SimClock* clock = sim::current_sim_clock())
    ready_ = sim::offload_ready_times(sim::OffloadRates(clock->machine()), clock->now(), buckets);
}

double OffloadSchedule::wait(size_t bucket) const {
  if (ready_.empty()) return 0;
  NXD_INTERNAL_CHECK(bucket < ready_.size(), "[OffloadSchedule] bucket ", bucket, " of ",
                     ready_.size());
  sim::SimClock* clock = sim::current_sim_clock();
  const double before = clock->now();
  clock->wait_until(ready_[bucket], "optimizer offload");
  return clock->now() - before;
}

}  // namespace nxd::optim
