#pragma once
// Inverted dropout driven by the counter-based RNG: element i (row-major index into the
// tensor) is kept iff stream.uniform(i) >= p and then scaled by 1 / (1 - p). The mask is a pure
// function of (stream, i), so the backward regenerates it instead of storing it.
#include "nxd/runtime/rng.h"
#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

// y, x: [...] (same shape). y[i] = keep(i) ? x[i] / (1 - p) : 0; p in [0, 1] (p = 1 zeroes all).
// The backward is the same call on the gradient: dx = dropout_apply(dy).
void dropout_apply(const Tensor& y, const Tensor& x, double p, const RngStream& stream);

namespace ref {
void dropout_apply(const Tensor& y, const Tensor& x, double p, const RngStream& stream);
}  // namespace ref

}  // namespace nxd::kernels
