// ggml's F16, Q8_0 and Q4_0 codecs (gguf.h): f32 <-> half and the 32-value blocks of a scale and
// codes, rounded as ggml's reference quantizers round.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "nxd/io/gguf.h"
#include "nxd/runtime/error.h"

namespace nxd::io {

uint16_t f32_to_f16(float x) {
  const uint32_t b = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t abs = b & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // a subnormal half (or zero): units of 2^-24, nearest even
    const float a = std::bit_cast<float>(abs) * 16777216.0f;  // exact: a power-of-two scale
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a)));
  }
  // normal: drop 13 mantissa bits, nearest even
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 0x1p-24f;
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}

std::vector<uint8_t> ggml_encode(GgmlType type, const float* x, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(ggml_nbytes(type, n)));
  uint8_t* o = out.data();
  switch (type) {
    case GgmlType::f32:
      std::memcpy(o, x, out.size());
      break;
    case GgmlType::f16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        std::memcpy(o + 2 * i, &h, 2);
      }
      break;
    case GgmlType::bf16:
      for (int64_t i = 0; i < n; ++i) {  // round to nearest even, NaN kept quiet (ggml's)
        const uint32_t b = std::bit_cast<uint32_t>(x[i]);
        const uint16_t h = (b & 0x7fffffffu) > 0x7f800000u
                               ? static_cast<uint16_t>((b >> 16) | 64)
                               : static_cast<uint16_t>((b + (0x7fffu + ((b >> 16) & 1u))) >> 16);
        std::memcpy(o + 2 * i, &h, 2);
      }
      break;
    case GgmlType::q8_0:
    case GgmlType::q4_0: {
      NXD_CHECK(n % 32 == 0, "[gguf] ", ggml_type_name(static_cast<uint32_t>(type)),
                " needs a multiple of 32 values, got ", n);
      const bool q8 = type == GgmlType::q8_0;
      for (int64_t b = 0; b < n / 32; ++b) {
        const float* v = x + 32 * b;
        uint8_t* blk = o + b * (q8 ? 34 : 18);
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; ++j)
          if (q8) {
            amax = std::max(amax, std::fabs(v[j]));
          } else if (amax < std::fabs(v[j])) {
            amax = std::fabs(v[j]);
            max = v[j];
          }
        const float d = q8 ? amax / 127 : max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = f32_to_f16(d);
        std::memcpy(blk, &dh, 2);
        if (q8) {
          for (int j = 0; j < 32; ++j)
            blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(v[j] * id)));
        } else {
          for (int j = 0; j < 16; ++j) {
            const auto q = [&](float y) {
              return static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(y * id + 8.5f)));
            };
            blk[2 + j] = static_cast<uint8_t>(q(v[j]) | (q(v[16 + j]) << 4));
          }
        }
      }
      break;
    }
  }
  return out;
}

void ggml_decode(GgmlType type, const uint8_t* b, int64_t n, float* out) {
  switch (type) {
    case GgmlType::f32:
      std::memcpy(out, b, static_cast<size_t>(4 * n));
      return;
    case GgmlType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    case GgmlType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b + 2 * i, 2);
        out[i] = std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
      }
      return;
    case GgmlType::q8_0:
    case GgmlType::q4_0: {
      const bool q8 = type == GgmlType::q8_0;
      for (int64_t k = 0; k < n / 32; ++k) {
        const uint8_t* blk = b + k * (q8 ? 34 : 18);
        uint16_t dh;
        std::memcpy(&dh, blk, 2);
        const float d = f16_to_f32(dh);
        float* o = out + 32 * k;
        if (q8)
          for (int j = 0; j < 32; ++j)
            o[j] = static_cast<float>(static_cast<int8_t>(blk[2 + j])) * d;
        else
          for (int j = 0; j < 16; ++j) {
            o[j] = static_cast<float>((blk[2 + j] & 15) - 8) * d;
            o[16 + j] = static_cast<float>((blk[2 + j] >> 4) - 8) * d;
          }
      }
      return;
    }
  }
  throw InvalidArgument(str("[gguf] cannot decode type ", static_cast<uint32_t>(type)));
}

}  // namespace nxd::io
