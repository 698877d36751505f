#pragma once
// LayerNorm and RMSNorm over the last dim, forward (saving the per-row statistics) and fused
// backward (input, weight and bias gradients in one pass over the rows).
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// y, x: [..., D]; mean, rstd: [...] (x's dtype); weight, bias: [D] or undefined.
// y = (x - mean) * rstd * weight + bias with rstd = 1 / sqrt(var + eps) (biased variance).
void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, double eps);
// dx, dy, x: [..., D]; dweight, dbias: [D] (overwritten; either may be undefined);
// mean, rstd: [...] from the forward.
void layer_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight);

// y, x: [..., D]; rstd: [...]; weight: [D] or undefined (Llama's RMSNorm, as HF computes it):
// y = (x * rstd) * weight with rstd = 1 / sqrt(mean(x^2) + eps).
void rms_norm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                      double eps);
// dx, dy, x: [..., D]; dweight: [D] (overwritten; may be undefined); rstd from the forward.
void rms_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                       const Tensor& rstd, const Tensor& weight);

namespace ref {
void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, double eps);
void layer_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight);
void rms_norm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                      double eps);
void rms_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                       const Tensor& rstd, const Tensor& weight);
}  // namespace ref

}  // namespace nxd::kernels
