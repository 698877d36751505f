#pragma once
// log sigmoid(x) for the preference losses (DPO's sigmoid loss, ORPO's odds-ratio term): computed
// as -(relu(-x) + log(1 + exp(-|x|))), finite for any x, with the derivative sigmoid(-x) at every
// x. Composed from relu and abs, autograd would take their zero subgradients at x = 0 and give a
// zero gradient exactly where a policy equal to its reference starts DPO (h = 0 in every pair).
#include "nxd/runtime/tensor.h"

namespace nxd::train_app {

Tensor log_sigmoid(const Tensor& x);

}  // namespace nxd::train_app
