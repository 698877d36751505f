#pragma once
// Causal scaled-dot-product attention with grouped-query heads. Per (batch, query head) two
// GEMMs (S = scale Q K^T, O = P V) with the softmax and mask fused in between; the backward uses
// the saved probabilities:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = scale dS K,
//   dK = scale dS^T Q,
// with dK and dV summed over the query heads that share a kv head (head h reads kv head
// h / (Hq / Hkv)). Operands may be strided views (e.g. [B, S, H, D] transposed to
// [B, H, S, D]) as long as the last dim has unit stride: BLAS takes them without copies.
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// The dtype the sim device prices the attention kernels' products and bytes at. The kernels run
// on f32 copies of bf16 inputs (the op converts them), which a NeuronCore would multiply at its
// bf16 rate from bf16 operands: the op of bf16 attention sets bf16 for its kernel calls. Scoped
// and thread-local (sim ranks are threads); undefined outside a scope: the operands' own dtype.
class AttentionPricing {
 public:
  explicit AttentionPricing(DType priced_as);
  ~AttentionPricing();
  AttentionPricing(const AttentionPricing&) = delete;
  AttentionPricing& operator=(const AttentionPricing&) = delete;
  // `operand` (the kernel's q dtype), or the scope's dtype inside one.
  static DType dtype(DType operand);

 private:
  int prev_;
};

// out: [B, Hq, Sq, D] (any layout with unit last stride); probs: [B, Hq, Sq, Sk] contiguous, or
// undefined when the probabilities need not be kept (inference); q: [B, Hq, Sq, D];
// k, v: [B, Hkv, Sk, D] with Hkv dividing Hq and Sk >= Sq when causal (query i sits at key
// position i + Sk - Sq and sees keys j <= that). scale <= 0 means 1/sqrt(D).
void attention_forward(const Tensor& out, const Tensor& probs, const Tensor& q, const Tensor& k,
                       const Tensor& v, bool causal, double scale);
// dq: [B, Hq, Sq, D]; dk, dv: [B, Hkv, Sk, D] (all overwritten; unit last stride); dout, q, k,
// v, out, probs as in the forward.
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& probs, bool causal, double scale);

namespace ref {
void attention_forward(const Tensor& out, const Tensor& probs, const Tensor& q, const Tensor& k,
                       const Tensor& v, bool causal, double scale);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& probs, bool causal, double scale);
}  // namespace ref

}  // namespace nxd::kernels
