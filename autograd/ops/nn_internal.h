#pragma once
// Internal helpers of the nn op family (autograd/ops/{softmax,norm,...}.cpp; not installed API):
// bf16 is a storage type, so an op converts bf16 inputs to f32, runs the f32/f64 kernel, and
// rounds its result once.
#include "nxd/autograd/graph.h"

namespace nxd::nn_detail {

inline void check_float(const char* op, const char* what, const Tensor& x) {
  NXD_CHECK(x.defined(), "[", op, "] ", what, " is undefined");
  NXD_CHECK(is_floating(x.dtype()), "[", op, "] ", what, " must be floating, got ", x.desc());
}
inline DType compute_dtype(DType t) {
  return t == DType::bf16 ? DType::f32 : t;
}
// A detached handle in the compute dtype (a copy only for bf16).
inline Tensor compute(const Tensor& x) {
  if (!x.defined()) return x;
  Tensor d = x.detach();
  return d.dtype() == DType::bf16 ? d.to(DType::f32) : d;
}
// What an op keeps for backward of an input it computes on: a bf16 input itself (half the bytes
// of its f32 compute copy xc, which backward gets back exactly with compute()), else xc (the same
// tensor as the input's detached handle, or its copy). Activations of a bf16 model then stay bf16.
inline Tensor keep(const Tensor& x, const Tensor& xc) {
  return x.defined() && x.dtype() == DType::bf16 ? x.detach() : xc;
}
// y in dtype `dt` (rounds once when dt is bf16).
inline Tensor to_dtype(const Tensor& y, DType dt) {
  return !y.defined() || y.dtype() == dt ? y : y.to(dt);
}
// An uninitialized [B, H, S, D] tensor in [B, S, H, D] memory when x is such a view (the usual
// q/k projections), so the layout flows through rotary to attention; else contiguous.
inline Tensor empty_like_layout(const Tensor& x, DType dt) {
  if (x.dim() == 4 && !x.is_contiguous() && x.transpose(1, 2).is_contiguous())
    return empty({x.size(0), x.size(2), x.size(1), x.size(3)}, dt, x.device()).transpose(1, 2);
  return empty(x.shape(), dt, x.device());
}
inline Device device_of(std::initializer_list<Tensor> ts) {
  for (const Tensor& t : ts)
    if (t.defined() && t.is_meta()) return Device::meta;
  return Device::host;
}

}  // namespace nxd::nn_detail
