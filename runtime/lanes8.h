#pragma once
// Internal (runtime/gemv_f32.cpp, runtime/kernels/gemv_int8.cpp): eight f32 lanes (one AVX
// register, two SSE registers on an x86-64-v2 build) and the fixed-order dot product of the
// few-rows kernels. The arithmetic is written once; the compiler maps it to the build's
// instructions, and the order of every sum is the same on each. Internal linkage (an unnamed
// namespace): the vector types must not cross a call boundary whose ABI depends on the ISA.
#include <cstdint>
#include <cstring>

namespace nxd::lanes8 {
namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef int8_t I8 __attribute__((vector_size(8)));
typedef int32_t I32x8 __attribute__((vector_size(32)));

inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// Eight int8 values widened to f32 (exactly), through int32: GCC 12 scalarizes a direct
// int8 -> float vector conversion (eight scalar converts), but not int8 -> int32 (vpmovsxbd)
// followed by int32 -> float (vcvtdq2ps).
inline V8 load8(const int8_t* p) {
  I8 v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(__builtin_convertvector(v, I32x8), V8);
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
