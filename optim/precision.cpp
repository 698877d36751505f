#include "nxd/optim/precision.h"

#include <algorithm>

#include "nxd/runtime/rng.h"

namespace nxd::optim {

namespace {
// splitmix64's finalizer: mixes the step into the parameter's stream id.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

RoundingNoise::RoundingNoise(uint64_t seed, const std::string& param_name, int64_t step)
    : key(seed),
      stream(mix(stream_id((param_name + "#stochastic_rounding").c_str()) ^
                 mix(static_cast<uint64_t>(step)))) {}

uint16_t RoundingNoise::bits(int64_t element) const {
  // one Philox block gives 8 x 16 bits: elements 8k .. 8k+7
  const uint64_t e = static_cast<uint64_t>(element);
  const auto r = philox4x32(key, stream, e >> 3);
  const uint32_t w = r[(e >> 1) & 3];
  return static_cast<uint16_t>((e & 1) ? w >> 16 : w & 0xffffu);
}

void round_to_bf16(bf16* dst, const float* src, int64_t n, const RoundingNoise* noise,
                   int64_t first) {
  if (!noise) {
    f32_to_bf16(reinterpret_cast<uint16_t*>(dst), src, n);
    return;
  }
  int64_t i = 0;
  // whole Philox blocks: 8 elements per block
  while (i < n) {
    const uint64_t e = static_cast<uint64_t>(first + i);
    const auto r = philox4x32(noise->key, noise->stream, e >> 3);
    const int64_t end = std::min<int64_t>(n, i + 8 - static_cast<int64_t>(e & 7));
    for (; i < end; ++i) {
      const uint64_t ei = static_cast<uint64_t>(first + i);
      const uint32_t w = r[(ei >> 1) & 3];
      const uint16_t bits = static_cast<uint16_t>((ei & 1) ? w >> 16 : w & 0xffffu);
      dst[i] = bf16::from_bits(bf16::from_f32_stochastic(src[i], bits));
    }
  }
}

}  // namespace nxd::optim
