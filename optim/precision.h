#pragma once
// How optimizers update bf16 parameters (mixed precision). f32 and f64 parameters are always
// updated in place with torch's arithmetic; these rules matter only for bf16 ones:
//
//   master weights (NxD's use_master_weights): an f32 copy of every bf16 parameter lives in the
//       optimizer's state ("<name>.master"); the update runs on the copy and the parameter becomes
//       its rounding to bf16. Small updates accumulate in the copy instead of vanishing below
//       bf16's 8-bit mantissa.
//   pure bf16 (no master weights): the update runs in f32 on the parameter's value and is rounded
//       back to bf16 every step, to nearest even or, with stochastic rounding (bf16SR, NxD's
//       XLA_USE_BF16 with the device's stochastic rounding), up or down with probability equal to
//       the distance, so updates smaller than an ulp still move the parameter on average.
// The optimizer state of a bf16 parameter (exp_avg, exp_avg_sq, momentum) is f32 either way (NxDT's
// adamw_fp32OptState), and f32 gradients (GradSync's fp32_grad_acc) are used as they are.
//
// Stochastic rounding noise is counter-based: the 16 random bits of element e of parameter `name`
// at its optimizer step t are a function of (seed, name, t, e) only (Philox), never of threads,
// shards or call order, so a run is bitwise reproducible and ZeRO-1 rounds each element exactly
// as the unsharded optimizer does.
#include <cstdint>
#include <string>

#include "nxd/runtime/dtype.h"

namespace nxd::optim {

struct PrecisionOptions {
  bool master_weights = false;
  bool stochastic_rounding = false;
  uint64_t seed = 0;  // of the stochastic rounding noise
};

// The noise of one parameter at one step.
struct RoundingNoise {
  uint64_t key = 0;     // the seed
  uint64_t stream = 0;  // (parameter name, step)
  RoundingNoise() = default;
  RoundingNoise(uint64_t seed, const std::string& param_name, int64_t step);
  uint16_t bits(int64_t element) const;  // 16 random bits for this element
};

// dst[i] = bf16(src[i]) for i in [0, n): to nearest even when noise is null, else stochastically
// with the noise of elements first + i.
void round_to_bf16(bf16* dst, const float* src, int64_t n, const RoundingNoise* noise,
                   int64_t first = 0);

}  // namespace nxd::optim
