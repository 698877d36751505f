#pragma once
// Optimizer offload's time (Zero1Options::placement = StatePlacement::host; docs/design/fsdp.md
// "Optimizer offload"): what each bucket's shard moves between HBM and the host and what the
// host's update touches, and the step's schedule of those round trips on the rank's sim clock
// (runtime/sim/host_offload.h). Zero1Optimizer::step and nxd-plan's meta step
// (train_app/plan_step.cpp) both wait on it before each bucket's all-gather, so the plan charges
// the run's time.
#include <cstdint>
#include <vector>

#include "nxd/runtime/dtype.h"
#include "nxd/runtime/sim/host_offload.h"

namespace nxd::optim {

// One bucket's round trip for a shard of `shard_numel` elements: the gradient shard
// (`grad_dtype`) to the host, and the parameters' shard (`param_dtype`) too when the host holds
// no f32 masters of them; the update reads the gradient and reads and writes the f32 weights
// and each of the rule's `state_tensors` f32 state tensors (and writes bf16 parameters as bf16);
// the parameters' shard back to HBM.
sim::OffloadBucket offload_bucket(int64_t shard_numel, DType grad_dtype, DType param_dtype,
                                  int state_tensors, bool host_masters);

// One optimizer step's round trips, from the current sim clock's now (no sim clock, or none
// built with the default constructor: nothing is charged). The all-gather of bucket b, which
// needs its updated parameters in HBM, is preceded by wait(b): the clock moves to the time they
// are back. The all-gathers are blocking and the next forward needs every bucket (the first
// layers are in the last bucket: buckets follow backward's order), so the round trips overlap
// each other and the earlier buckets' all-gathers, never the next step's forward.
class OffloadSchedule {
 public:
  OffloadSchedule() = default;
  explicit OffloadSchedule(const std::vector<sim::OffloadBucket>& buckets);
  // Returns the seconds the clock waited (0 when the parameters were back already).
  double wait(size_t bucket) const;

 private:
  std::vector<double> ready_;
};

}  // namespace nxd::optim
