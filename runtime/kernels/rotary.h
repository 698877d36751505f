#pragma once
// Rotary position embeddings in the rotate-half convention of HF Llama and GPT-NeoX:
//   inv_freq[i] = base^(-2i / rotary_dim), theta[p, i] = p * inv_freq[i],  i < rotary_dim / 2
//   y[i]        = x[i] cos(theta) - x[i + r/2] sin(theta)
//   y[i + r/2]  = x[i + r/2] cos(theta) + x[i] sin(theta)
// for the first rotary_dim features of each head (GPT-NeoX's partial rotary rotates
// rotary_pct * head_dim of them; Llama all); the others pass through. The backward is the
// rotation by -theta. f32 computes the angles in f32 as HF does; f64 in f64.
#include <cstdint>

#include "nxd/runtime/rope_scaling.h"
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// Which way rotary_forward turns: by theta (the embedding), or by -theta (its backward; dy in,
// dx out).
enum class RotaryDirection { forward, inverse };

// y, x: [B, H, S, D], any layouts with unit last stride (e.g. [B, S, H, D] memory), not
// overlapping. Position of sequence index s is position_offset + s. rotary_dim even,
// 0 < rotary_dim <= D (0 means D). scaling: inv_freq scaled as rope_scaling.h says (Llama 3.1's
// llama3, linear).
void rotary_forward(const Tensor& y, const Tensor& x, int64_t rotary_dim, double base,
                    int64_t position_offset, RotaryDirection direction = RotaryDirection::forward,
                    const RopeScaling& scaling = {});

// The same at per-token positions: row (b, s) at positions[b, s] (i32/i64 [B, S], >= 0), with
// exactly the angles rotary_forward gives position p (packed documents: positions restart at 0
// in every document, so each is rotated as it would be alone).
void rotary_positions_forward(const Tensor& y, const Tensor& x, const Tensor& positions,
                              int64_t rotary_dim, double base,
                              RotaryDirection direction = RotaryDirection::forward,
                              const RopeScaling& scaling = {});

namespace ref {
void rotary_forward(const Tensor& y, const Tensor& x, int64_t rotary_dim, double base,
                    int64_t position_offset, RotaryDirection direction = RotaryDirection::forward,
                    const RopeScaling& scaling = {});
}  // namespace ref

}  // namespace nxd::kernels
