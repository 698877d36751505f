#pragma once
// Counter-based randomness (Philox4x32-10, Salmon et al., SC'11). Every random element is a pure
// function of (seed, stream, element index), so any range of a tensor can be generated on its
// own: a rank initializing its shard of a weight gets exactly that slice of the weight one rank
// would initialize, for any partition, and nothing depends on call order across ranks.
#include <array>
#include <cstdint>

namespace nxd {

// 4 x 32 random bits for counter (c_hi, c_lo) under a 64-bit key.
std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t c_hi, uint64_t c_lo);

// A named sequence of random numbers: element i of the stream is philox(seed, {stream, i}).
struct RngStream {
  uint64_t seed = 0;
  uint64_t stream = 0;

  // uniform in [0, 1) with 24 random bits (exactly representable in f32)
  float uniform(uint64_t i) const;
  // uniform in [0, 1) with 53 random bits
  double uniform_f64(uint64_t i) const;
  // standard normal (Box-Muller on two 32-bit uniforms of the same counter)
  double normal(uint64_t i) const;
};

// Derives a stream id from a name (FNV-1a), e.g. a parameter's hierarchical name, so that the
// same parameter gets the same values however the model is built or sharded.
uint64_t stream_id(const char* name);

// A rank's source of fresh streams (for dropout masks and the like): next() returns a new
// stream each call, deterministically from the seed.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  void set_seed(uint64_t s) { seed_ = s, counter_ = 0; }
  RngStream next() { return RngStream{seed_, (1ull << 63) | counter_++}; }
  uint64_t counter() const { return counter_; }  // for checkpointing the generator state
  void set_counter(uint64_t c) { counter_ = c; }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace nxd
