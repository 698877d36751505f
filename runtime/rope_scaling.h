#pragma once
// Rotary frequency scaling (transformers' rope_scaling) for models trained or extended to longer
// contexts than their rotary base gives:
//   linear (transformers' "linear", position interpolation): inv_freq / factor
//   llama3 (Llama 3.1): with wavelength w = 2 pi / inv_freq, low = original_max_position_embeddings
//     / low_freq_factor and high = original_max_position_embeddings / high_freq_factor:
//       w > low  (low frequencies):  inv_freq / factor
//       w < high (high frequencies): inv_freq
//       otherwise: (1 - s) inv_freq / factor + s inv_freq,
//                  s = (original_max_position_embeddings / w - low_freq_factor) /
//                      (high_freq_factor - low_freq_factor)
// (transformers' modeling_rope_utils: _compute_linear_scaling_rope_parameters,
// _compute_llama3_parameters), computed in the kernel's precision as transformers does in f32.
#include <cmath>
#include <cstdint>

namespace nxd {

struct RopeScaling {
  enum class Kind : uint8_t { none, linear, llama3 };
  Kind kind = Kind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
  bool operator==(const RopeScaling&) const = default;

  template <class T>
  T apply(T inv_freq) const {
    if (kind == Kind::none) return inv_freq;
    const T f = static_cast<T>(factor);
    if (kind == Kind::linear) return inv_freq / f;
    const T old = static_cast<T>(original_max_position_embeddings);
    const T lo = static_cast<T>(low_freq_factor), hi = static_cast<T>(high_freq_factor);
    const T wavelen = static_cast<T>(2 * M_PI) / inv_freq;
    if (wavelen > old / lo) return inv_freq / f;
    if (wavelen < old / hi) return inv_freq;
    const T s = (old / wavelen - lo) / (hi - lo);
    return (T(1) - s) * inv_freq / f + s * inv_freq;
  }
};

inline const char* rope_scaling_name(RopeScaling::Kind k) {
  return k == RopeScaling::Kind::linear   ? "linear"
         : k == RopeScaling::Kind::llama3 ? "llama3"
                                          : "none";
}

}  // namespace nxd
