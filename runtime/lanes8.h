#pragma once
// Internal (runtime/gemv_f32.cpp, runtime/kernels/gemv_int8.cpp): eight f32 lanes (one AVX
// register, two SSE registers on an x86-64-v2 build) and the fixed-order dot product of the
// few-rows kernels. The arithmetic is written once; the compiler maps it to the build's
// instructions, and the order of every sum is the same on each; the files that use it are built
// with -ffp-contract=off (runtime/CMakeLists.txt), so no product and sum is fused into an FMA on
// one instruction set and not on another. Internal linkage (an unnamed
// namespace): the vector types must not cross a call boundary whose ABI depends on the ISA.
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE4_1__)
#include <immintrin.h>
#endif

namespace nxd::lanes8 {
namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef int32_t I32x8 __attribute__((vector_size(32)));

inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// Eight int8 (or uint8: Byte) values widened to int32 lanes, exactly. Through the build's widening
// instruction (vpmovsxbd / vpmovzxbd, or two SSE4.1 pmovsxbd): GCC 12 keeps an 8-byte vector in a
// general register and scalarizes its conversion (about 25 instructions per 8 values, which made
// the int8 GEMV compute bound at ~1 weight per cycle). The values are the same on every path.
template <class Byte>
inline I32x8 widen8(const Byte* p) {
  static_assert(sizeof(Byte) == 1);
  constexpr bool sign = std::is_signed_v<Byte>;
#if defined(__AVX2__)
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return (I32x8)(sign ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
#elif defined(__SSE4_1__)
  int32_t lo, hi;
  std::memcpy(&lo, p, 4);
  std::memcpy(&hi, p + 4, 4);
  const __m128i vl = _mm_cvtsi32_si128(lo), vh = _mm_cvtsi32_si128(hi);
  const __m128i a = sign ? _mm_cvtepi8_epi32(vl) : _mm_cvtepu8_epi32(vl);
  const __m128i b = sign ? _mm_cvtepi8_epi32(vh) : _mm_cvtepu8_epi32(vh);
  I32x8 r;
  std::memcpy(&r, &a, 16);
  std::memcpy(reinterpret_cast<char*>(&r) + 16, &b, 16);
  return r;
#else
  I32x8 r;
  for (int l = 0; l < 8; ++l) r[l] = p[l];
  return r;
#endif
}
// Eight int8 values as f32 (exact): widened to int32, then vcvtdq2ps.
inline V8 load8(const int8_t* p) {
  return __builtin_convertvector(widen8(p), V8);
}
inline void store8(float* p, V8 v) {
  std::memcpy(p, &v, sizeof v);
}

// sum_k x[k] * w[k] (w f32 or int8): 32 lanes (four registers, so four loads are in flight), the
// registers added pairwise, the 8 lanes pairwise, then the tail in order.
template <class W>
inline float dot(const float* __restrict x, const W* __restrict w, int64_t k) {
  V8 s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    s0 += load8(x + i) * load8(w + i);
    s1 += load8(x + i + 8) * load8(w + i + 8);
    s2 += load8(x + i + 16) * load8(w + i + 16);
    s3 += load8(x + i + 24) * load8(w + i + 24);
  }
  for (; i + 8 <= k; i += 8) s0 += load8(x + i) * load8(w + i);
  const V8 s = (s0 + s1) + (s2 + s3);
  float r = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  for (; i < k; ++i) r += x[i] * static_cast<float>(w[i]);
  return r;
}

}  // namespace
}  // namespace nxd::lanes8
