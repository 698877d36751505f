#pragma once
// Elementwise activations, forward and backward: GELU (erf form, as GPT-NeoX's "gelu", and the
// tanh approximation, HF's "gelu_new"), SiLU, and SwiGLU = silu(gate) * up fused.
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// y, x: [...] (same shape). tanh_approx: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
// else 0.5 x (1 + erf(x / sqrt(2))).
void gelu_forward(const Tensor& y, const Tensor& x, bool tanh_approx);
// dx, dy, x: [...]
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, bool tanh_approx);
// y, x: [...]. y = x * sigmoid(x).
void silu_forward(const Tensor& y, const Tensor& x);
void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
// y, gate, up: [...]. y = silu(gate) * up.
void swiglu_forward(const Tensor& y, const Tensor& gate, const Tensor& up);
// dgate, dup, dy, gate, up: [...]. Either output may be undefined.
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                     const Tensor& up);

namespace ref {
void gelu_forward(const Tensor& y, const Tensor& x, bool tanh_approx);
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, bool tanh_approx);
void silu_forward(const Tensor& y, const Tensor& x);
void silu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(const Tensor& y, const Tensor& gate, const Tensor& up);
void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dy, const Tensor& gate,
                     const Tensor& up);
}  // namespace ref

}  // namespace nxd::kernels
