#include "nxd/runtime/dtype.h"

#include <ostream>

namespace nxd {

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f64:
      return 8;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  throw InternalError("dtype_size: bad dtype");
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "f32" || n == "float32" || n == "fp32" || n == "float") return DType::f32;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "f64" || n == "float64" || n == "fp64" || n == "double") return DType::f64;
  if (n == "i32" || n == "int32") return DType::i32;
  if (n == "i64" || n == "int64") return DType::i64;
  throw InvalidArgument(str("[dtype] unknown dtype '", n, "' (expected f32, bf16, f64, i32, i64)"));
}

std::ostream& operator<<(std::ostream& os, DType t) {
  return os << dtype_name(t);
}

void bf16_to_f32(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

void f32_to_bf16(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16::from_f32(src[i]);
}

void convert(void* dst, DType dt, const void* src, DType st, int64_t n) {
  if (dt == st) {
    std::memcpy(dst, src, static_cast<size_t>(n * dtype_size(dt)));
    return;
  }
  if (dt == DType::f32 && st == DType::bf16) {
    bf16_to_f32(static_cast<float*>(dst), static_cast<const uint16_t*>(src), n);
    return;
  }
  if (dt == DType::bf16 && st == DType::f32) {
    f32_to_bf16(static_cast<uint16_t*>(dst), static_cast<const float*>(src), n);
    return;
  }
  dispatch(dt, [&]<class D>() {
    dispatch(st, [&]<class S>() {
      D* d = static_cast<D*>(dst);
      const S* s = static_cast<const S*>(src);
      if constexpr (std::is_same_v<D, bf16>) {
        for (int64_t i = 0; i < n; ++i) d[i] = bf16(static_cast<float>(to_double(s[i])));
      } else if constexpr (std::is_same_v<S, bf16>) {
        for (int64_t i = 0; i < n; ++i) d[i] = static_cast<D>(static_cast<float>(s[i]));
      } else {
        for (int64_t i = 0; i < n; ++i) d[i] = static_cast<D>(s[i]);
      }
    });
  });
}

}  // namespace nxd
