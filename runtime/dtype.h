#pragma once
// Element types. bf16 is a storage type: kernels load it into f32, compute, and round back.
#include <cstdint>
#include <cstring>
#include <string>

#include "nxd/runtime/error.h"

namespace nxd {

enum class DType : uint8_t { f32, bf16, f64, i32, i64 };

int64_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // "f32", "float32", "bf16", ... (throws)
inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f64;
}
std::ostream& operator<<(std::ostream& os, DType t);

// bfloat16: the top 16 bits of an IEEE f32.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(from_f32(f)) {}
  explicit operator float() const { return to_f32(bits); }

  static uint16_t from_f32(
      float f) {  // round to nearest even; NaN stays NaN (quiet), Inf stays Inf
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  // Stochastic rounding (bf16SR): adds 16 bits of noise below the kept bits and truncates, so a
  // value between two bf16 neighbours rounds away from zero with probability equal to its
  // distance from the nearer-to-zero one (in units of the last place): E[round(x)] = x. NaN stays
  // NaN (quiet), Inf stays Inf; like round to nearest, the largest finite magnitudes may round to
  // Inf.
  static uint16_t from_f32_stochastic(float f, uint16_t noise) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    if ((u & 0x7fffffffu) == 0x7f800000u) return static_cast<uint16_t>(u >> 16);
    u += noise;
    return static_cast<uint16_t>(u >> 16);
  }
  static float to_f32(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static bf16 from_bits(uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
};
static_assert(sizeof(bf16) == 2);

// Converts n elements between any two dtypes (float -> int truncates toward zero).
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);
// bf16 <-> f32 helpers used by kernels (vectorized).
void bf16_to_f32(float* dst, const uint16_t* src, int64_t n);
void f32_to_bf16(uint16_t* dst, const float* src, int64_t n);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}

// Calls f.template operator()<T>() with T the C++ type of `t`: dispatch(t, [&]<class T>() {...}).
template <class F>
decltype(auto) dispatch(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f.template operator()<float>();
    case DType::bf16:
      return f.template operator()<bf16>();
    case DType::f64:
      return f.template operator()<double>();
    case DType::i32:
      return f.template operator()<int32_t>();
    case DType::i64:
      return f.template operator()<int64_t>();
  }
  throw InternalError("dispatch: bad dtype");
}

// Value conversions used by element access and fills.
template <class T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}
template <class T>
inline double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16>)
    return static_cast<float>(v);
  else
    return static_cast<double>(v);
}

}  // namespace nxd
