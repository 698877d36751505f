#pragma once
// Tensor-parallel mappings (NxD parallel_layers/mappings.py): autograd-aware collectives over a
// group, by default the current parallel_state TP group. Every one is the identity (no node, no
// copy) when the group has one rank. The table (forward -> backward):
//
//   copy_to_tensor_model_parallel_region       identity              -> all-reduce SUM
//   reduce_from_tensor_model_parallel_region   all-reduce SUM        -> identity
//   scatter_to_tensor_model_parallel_region    keep own chunk of the -> all-gather last dim
//                                              last dim
//   gather_from_tensor_model_parallel_region   all-gather last dim   -> keep own chunk
//   scatter_to_sequence_parallel_region        keep own chunk of     -> all-gather seq_dim
//                                              seq_dim
//   gather_from_sequence_parallel_region       all-gather seq_dim    -> reduce-scatter seq_dim if
//                                                                       to_model_parallel, else
//                                                                       keep own chunk
//   reduce_scatter_to_sequence_parallel_region reduce-scatter SUM    -> all-gather seq_dim
//                                              along seq_dim
//
// Chunks are contiguous: member r of a group of P takes [r*n/P, (r+1)*n/P); a dimension that
// does not divide by P throws ShapeError naming the op, the tensor and the TP size.
//
// Reductions (all-reduce and reduce-scatter, forward or backward) of bf16 tensors run in f32 and
// round once (NxD's reduce_dtype=fp32), whatever the backend: the result equals the f32 sum of
// the bf16 values rounded to bf16. Gathers and splits move the tensor's own dtype.
//
// The `Communicator&` forms keep a pointer to the group in the backward closure: the group must
// outlive the graph (the parallel_state groups and the layers' groups do).
//
// Departure from NxD: seq_dim has no default. NxD's default is 0 (its SP models are [S,B,H]);
// nxd's models are batch-first [B,S,H], where the sequence dimension is 1.
#include <cstdint>

#include "nxd/collectives/communicator.h"
#include "nxd/runtime/tensor.h"

namespace nxd {

Tensor copy_to_tensor_model_parallel_region(const Tensor& x);
Tensor copy_to_tensor_model_parallel_region(const Tensor& x, Communicator& group);
Tensor reduce_from_tensor_model_parallel_region(const Tensor& x);
Tensor reduce_from_tensor_model_parallel_region(const Tensor& x, Communicator& group);
Tensor scatter_to_tensor_model_parallel_region(const Tensor& x);
Tensor scatter_to_tensor_model_parallel_region(const Tensor& x, Communicator& group);
Tensor gather_from_tensor_model_parallel_region(const Tensor& x);
Tensor gather_from_tensor_model_parallel_region(const Tensor& x, Communicator& group);

Tensor scatter_to_sequence_parallel_region(const Tensor& x, int64_t seq_dim);
Tensor scatter_to_sequence_parallel_region(const Tensor& x, int64_t seq_dim, Communicator& group);
Tensor gather_from_sequence_parallel_region(const Tensor& x, int64_t seq_dim,
                                            bool to_model_parallel = true);
Tensor gather_from_sequence_parallel_region(const Tensor& x, int64_t seq_dim,
                                            bool to_model_parallel, Communicator& group);
Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, int64_t seq_dim);
Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, int64_t seq_dim,
                                                  Communicator& group);

// Raw (non-differentiable) helpers shared by the parallel layers; `op` names the caller in errors.
namespace tp_detail {
// Sum over the group into a new tensor of x's dtype (bf16 reduced in f32, rounded once).
Tensor all_reduce_sum(Communicator& g, const Tensor& x);
// Reduce-scatter SUM along dim (bf16 in f32); throws ShapeError naming op if dim does not divide.
Tensor reduce_scatter_sum(Communicator& g, const Tensor& x, int64_t dim, const char* op);
// All-gather along dim (the tensor's own dtype).
Tensor all_gather(Communicator& g, const Tensor& x, int64_t dim);
// This member's contiguous chunk of dim, as a new contiguous tensor.
Tensor split_own(Communicator& g, const Tensor& x, int64_t dim, const char* op);
// Throws ShapeError: "[op] <what> <n> is not divisible by tensor parallel size <tp>".
void check_divisible(const char* op, const char* what, int64_t n, int tp);
}  // namespace tp_detail

}  // namespace nxd
