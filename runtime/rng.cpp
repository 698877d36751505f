#include "nxd/runtime/rng.h"

#include <cmath>

namespace nxd {

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t c_hi, uint64_t c_lo) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(c_lo), c1 = static_cast<uint32_t>(c_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(c_hi), c3 = static_cast<uint32_t>(c_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0, k1 += kW1;
  }
  return {c0, c1, c2, c3};
}

float RngStream::uniform(uint64_t i) const {
  auto r = philox4x32(seed, stream, i);
  return static_cast<float>(r[0] >> 8) * (1.0f / 16777216.0f);
}

double RngStream::uniform_f64(uint64_t i) const {
  auto r = philox4x32(seed, stream, i);
  uint64_t bits = (static_cast<uint64_t>(r[0]) << 21) ^ (r[1] >> 11);
  return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

double RngStream::normal(uint64_t i) const {
  auto r = philox4x32(seed, stream, i);
  // u1 in (0, 1], u2 in [0, 1)
  double u1 = (static_cast<double>(r[0]) + 1.0) * (1.0 / 4294967296.0);
  double u2 = static_cast<double>(r[1]) * (1.0 / 4294967296.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t stream_id(const char* name) {
  uint64_t h = 1469598103934665603ull;
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return h & ~(1ull << 63);  // the top bit marks Generator streams; named streams never collide
}

}  // namespace nxd
