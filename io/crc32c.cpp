#include "nxd/io/crc32c.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace nxd::io {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

static uint32_t crc_table_update(uint32_t c, const unsigned char* p, size_t n) {
  const auto& t = tables().t;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
        t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^
        t[0][(w >> 56) & 0xff];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

namespace {

#if defined(__SSE4_2__)
// The CRC register is linear over GF(2): the register after `len` zero bytes is M_len * c for a
// 32x32 bit matrix (column i = image of bit i). Built once by squaring (zlib's crc32_combine).
using Matrix = std::array<uint32_t, 32>;

uint32_t times(const Matrix& m, uint32_t v) {
  uint32_t sum = 0;
  for (int i = 0; v; ++i, v >>= 1)
    if (v & 1) sum ^= m[i];
  return sum;
}

Matrix square(const Matrix& m) {
  Matrix r;
  for (int n = 0; n < 32; ++n) r[n] = times(m, m[n]);
  return r;
}

Matrix zeros_operator(size_t len) {
  Matrix bit;  // one zero bit
  bit[0] = kPoly;
  for (int n = 1; n < 32; ++n) bit[n] = 1u << (n - 1);
  Matrix byte = square(square(square(bit)));  // 8 zero bits
  Matrix acc;
  for (int n = 0; n < 32; ++n) acc[n] = 1u << n;  // identity
  for (; len; len >>= 1, byte = square(byte))
    if (len & 1) {
      Matrix r;
      for (int n = 0; n < 32; ++n) r[n] = times(byte, acc[n]);
      acc = r;
    }
  return acc;
}

constexpr size_t kBlock = 8192;

uint32_t crc_hw(uint32_t c, const unsigned char* p, size_t n) {
  // Three independent streams over consecutive blocks hide the instruction's 3-cycle latency;
  // reg(A|B|D from c) = M(M(a)^b)^d with a = reg(A from c), b = reg(B from 0), d = reg(D from 0).
  static const Matrix shift = zeros_operator(kBlock);
  while (n >= 3 * kBlock) {
    uint64_t a = c, b = 0, d = 0;
    const unsigned char* pb = p + kBlock;
    const unsigned char* pd = p + 2 * kBlock;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t wa, wb, wd;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, pb + i, 8);
      std::memcpy(&wd, pd + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      d = _mm_crc32_u64(d, wd);
    }
    uint32_t r = times(shift, static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b);
    c = times(shift, r) ^ static_cast<uint32_t>(d);
    p += 3 * kBlock;
    n -= 3 * kBlock;
  }
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__SSE4_2__)
  c = crc_hw(c, p, n);
#else
  c = crc_table_update(c, p, n);
#endif
  return ~c;
}

uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
  return ~crc_table_update(~crc, static_cast<const unsigned char*>(data), n);
}

std::string crc_hex(uint32_t crc) {
  static const char* d = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, crc >>= 4) s[i] = d[crc & 0xf];
  return s;
}

bool parse_crc_hex(const std::string& s, uint32_t* out) {
  if (s.size() != 8) return false;
  uint32_t v = 0;
  for (char ch : s) {
    int x;
    if (ch >= '0' && ch <= '9')
      x = ch - '0';
    else if (ch >= 'a' && ch <= 'f')
      x = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F')
      x = ch - 'A' + 10;
    else
      return false;
    v = (v << 4) | static_cast<uint32_t>(x);
  }
  *out = v;
  return true;
}

}  // namespace nxd::io
