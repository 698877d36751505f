#pragma once
// Random initialization on top of the counter-based RNG. Every function takes the RngStream and,
// optionally, where `t` sits inside a larger logical tensor (Region): element values depend only
// on (stream, index in the full tensor), so a shard initialized on its own equals the same slice
// of the full tensor initialized at once.
#include <cmath>

#include "nxd/runtime/rng.h"
#include "nxd/runtime/tensor.h"

namespace nxd::init {

// `t` is the block of a full tensor of shape `full_shape` starting at `start` (one per dim).
struct Region {
  Shape full_shape;
  Shape start;
};

void uniform(const Tensor& t, const RngStream& s, double lo, double hi,
             const Region* region = nullptr);
void normal(const Tensor& t, const RngStream& s, double mean, double std,
            const Region* region = nullptr);
// PyTorch's kaiming_uniform_(a): bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)).
void kaiming_uniform(const Tensor& t, const RngStream& s, int64_t fan_in, double a = std::sqrt(5.0),
                     const Region* region = nullptr);
// Glorot: bound = gain * sqrt(6 / (fan_in + fan_out)).
void xavier_uniform(const Tensor& t, const RngStream& s, int64_t fan_in, int64_t fan_out,
                    double gain = 1.0, const Region* region = nullptr);

}  // namespace nxd::init
