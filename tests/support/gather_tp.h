#pragma once
// gather_tp: a parameter or gradient gathered over the TP group to the whole model's shape (a
// tensor that is not tensor-parallel is returned as it is), for comparing a parallel run with one
// rank. Collective over the TP group.
#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/attributes.h"

namespace nxd::testing {

inline Tensor gather_tp(const Tensor& t, const ParallelAttrs& a) {
  if (!a.tensor_model_parallel) return t.detach();
  return parallel_state::get_tensor_model_parallel_group().all_gather(t.detach().contiguous(),
                                                                      a.partition_dim);
}

}  // namespace nxd::testing
