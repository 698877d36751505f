#include "nxd/optim/meta_update.h"

#include "nxd/runtime/context.h"

namespace nxd::optim::detail {

void charge_update(const char* kind, const UpdateTraffic& t) {
  if (t.numel == 0) return;
  const double n = static_cast<double>(t.numel);
  // the working values: f64 for an f64 parameter, f32 otherwise (a bf16 parameter's master or
  // copy); read and written, as is each state tensor; the gradient read once
  const double w = t.param_dtype == DType::f64 ? 8.0 : 4.0;
  double bytes = n * (2.0 * w + w + 2.0 * w * t.state_tensors);
  if (t.param_dtype == DType::bf16) bytes += n * 2.0;  // rounded into the parameter
  charge_compute(kind, n * static_cast<double>(t.flops_per_element), bytes,
                 t.param_dtype == DType::f64 ? DType::f64 : DType::f32);
}

}  // namespace nxd::optim::detail
