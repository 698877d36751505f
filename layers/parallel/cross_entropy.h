#pragma once
// Vocabulary-parallel cross entropy (NxD parallel_layers/loss_functions.py parallel_cross_entropy).
//
// logits [..., V/tp] hold this rank's contiguous slice [r*V/tp, (r+1)*V/tp) of the vocabulary
// (the output of a ColumnParallelLinear with gather_output=false); targets [...] (i32/i64) are
// global ids, the same on every rank. Returns the loss per token [...] (reduction none, NxD's
// behaviour), or its sum / mean over non-ignored tokens. The result is the same on every rank and
// equals nxd::cross_entropy on the gathered logits with the same options.
//
// Math, per token with target t and smoothing a over the FULL vocabulary V:
//   m = max_j z_j        (all-reduce MAX over TP)
//   S = sum_j e^(z_j-m), P = z_t - m, Z = sum_j (z_j - m)  (one all-reduce SUM of [N,3])
//   lse = log S;  loss = (1-a)(lse - P) + a(lse - Z/V)  (PyTorch's label smoothing); ignored: 0
//   dz_j = dL * (softmax_j - a/V - (1-a)[j == t])  (no collective in backward)
// Computed in f32 (f64 for f64 logits); the loss is f32 for bf16 logits (as Hugging Face upcasts
// logits before the loss), the gradient has the logits' dtype.
//
// Departures from NxD (both are NxD bugs, docs/NXD_INTERNALS.md): the caller's logits are never
// modified (NxD subtracts the max in place), and smoothing uses the global mean over all V classes
// in forward and backward (NxD averages over the local shard only and its smoothing backward
// subtracts at the wrong ranks). nxd also supports ignore_index (NxD leaves it to the caller).
// A target outside [0, V) that is not ignore_index throws naming it and V.
#include <cstdint>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/communicator.h"

namespace nxd {

struct ParallelCrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::none;  // none: per-token loss (NxD); mean: over non-ignored
};

Tensor parallel_cross_entropy(const Tensor& vocab_parallel_logits, const Tensor& targets,
                              const ParallelCrossEntropyOptions& opts = {});
Tensor parallel_cross_entropy(const Tensor& vocab_parallel_logits, const Tensor& targets,
                              const ParallelCrossEntropyOptions& opts, Communicator& group);

}  // namespace nxd
