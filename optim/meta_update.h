#pragma once
// The modeled cost of an optimizer's update, and its meta form (internal to nxd_optim).
//
// Every optimizer (SGD, AdamW, any ElementwiseOptimizer, ZeRO-1) charges its update's elementwise
// pass on the rank's cost model (the sim clock, runtime/context.h) as a kernel does: one call per
// parameter (ZeRO-1: per bucket shard) with the bytes the pass reads and writes and rule.cost
// flops per element. On meta parameters (nxd-plan's meta model, train_app/plan_step.cpp) the
// optimizers do no arithmetic but charge the same, through the same call, so the planned step
// holds the run's update time. Without a sim clock the charge is nothing.
#include <cstdint>

#include "nxd/runtime/dtype.h"

namespace nxd::optim::detail {

// What one update pass over `numel` elements touches: the f32 (f64) working values read and
// written, the gradient read, each of `state_tensors` state tensors read and written, and, for a
// bf16 parameter (`param_dtype`), the rounding into it.
struct UpdateTraffic {
  int64_t numel = 0;
  int state_tensors = 0;
  int64_t flops_per_element = 1;  // the rule's relative cost (ElementwiseRule::cost)
  DType param_dtype = DType::f32;
};

// Charges the pass on the current Context's cost model (nothing for numel 0).
void charge_update(const char* kind, const UpdateTraffic& t);

}  // namespace nxd::optim::detail
