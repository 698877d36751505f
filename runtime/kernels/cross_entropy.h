#pragma once
// Cross-entropy over logits with ignore_index and label smoothing, with PyTorch's exact formula:
//   loss_i = (1 - ls) * (lse_i - x_i[t_i]) + ls * mean_v(lse_i - x_i[v])
// for rows whose target is not ignore_index (ignored rows: loss 0, gradient 0). The logits are
// only read, never modified.
#include <cstdint>

#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// loss, lse: [N] (logits' dtype); logits: [N, V]; targets: [N] i32/i64. Writes the per-row loss
// (0 on ignored rows) and the row log-sum-exp; returns the number of non-ignored rows. A target
// outside [0, V) that is not ignore_index throws naming it.
int64_t cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                              const Tensor& targets, int64_t ignore_index, double label_smoothing);
// dlogits: [N, V]; dloss: [N] (the gradient of each row's loss, e.g. 1/count for the mean);
// logits, lse, targets as in the forward.
// dlogits[i, v] = dloss[i] * (softmax_i[v] - ls / V - (1 - ls) * [v == t_i]).
void cross_entropy_backward(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t ignore_index,
                            double label_smoothing);

namespace ref {
int64_t cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                              const Tensor& targets, int64_t ignore_index, double label_smoothing);
void cross_entropy_backward(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t ignore_index,
                            double label_smoothing);
}  // namespace ref

}  // namespace nxd::kernels
