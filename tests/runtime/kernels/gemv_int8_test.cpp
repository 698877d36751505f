// The int8 weight-only kernels (runtime/kernels/gemv_int8.h): quantization within half a scale
// step, both product paths against the f64 reference of the dequantized weight at ragged shapes,
// and bitwise the same for any thread count and operand address.
#include "nxd/runtime/kernels/gemv_int8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "nxd/runtime/context.h"
#include "nxd/runtime/lanes8.h"
#include "support/compare.h"
#include "support/weights.h"

using namespace nxd;

namespace {

using nxd::testing::at_offset;
using nxd::testing::expect_same_bits_over_threads_and_offsets;
using nxd::testing::lcg_values;
using nxd::testing::ThreadsGuard;

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scale;
};

Quantized quantize(const std::vector<float>& w, int64_t n, int64_t k) {
  Quantized r{std::vector<int8_t>(n * k), std::vector<float>(n)};
  kernels::quantize_int8_rows(r.q.data(), r.scale.data(), w.data(), n, k);
  return r;
}

using Path = void (*)(float*, const float*, const int8_t*, const float*, int64_t, int64_t, int64_t);

}  // namespace

TEST(Int8Weights, QuantizationIsWithinHalfAScaleStep) {
  const int64_t n = 37, k = 301;
  std::vector<float> w = lcg_values(n * k, 1);
  for (int64_t j = 0; j < k; ++j) w[5 * k + j] = 0.0f;              // a zero row
  for (int64_t j = 0; j < k; ++j) w[6 * k + j] = 1e-30f * (j % 7);  // a tiny one
  const Quantized z = quantize(w, n, k);
  for (int64_t r = 0; r < n; ++r) {
    double amax = 0;
    int qmax = 0;
    for (int64_t j = 0; j < k; ++j) {
      amax = std::max(amax, std::abs(double(w[r * k + j])));
      qmax = std::max(qmax, std::abs(int(z.q[r * k + j])));
      ASSERT_LE(std::abs(double(w[r * k + j]) - double(z.q[r * k + j]) * z.scale[r]),
                0.5 * z.scale[r] * (1 + 1e-6))
          << "row " << r << " col " << j;
    }
    if (amax == 0) {
      EXPECT_EQ(z.scale[r], 0.0f);
      EXPECT_EQ(qmax, 0);
    } else {
      EXPECT_EQ(qmax, 127) << "row " << r << ": the largest weight maps to +-127";
      EXPECT_FLOAT_EQ(z.scale[r], static_cast<float>(amax / 127));
    }
  }
  std::vector<float> bad = lcg_values(4 * 8, 2);
  bad[2 * 8 + 3] = std::nanf("");
  std::vector<int8_t> q(32);
  std::vector<float> s(4);
  try {
    kernels::quantize_int8_rows(q.data(), s.data(), bad.data(), 4, 8);
    FAIL() << "a NaN weight was quantized";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("weight [2,3]"), std::string::npos) << e.what();
  }
}

TEST(Int8Weights, BothPathsMatchTheReferenceAtRaggedShapes) {
  ThreadsGuard guard;
  set_num_threads(2);
  double worst = 0;
  for (Path path : {&kernels::gemv_int8, &kernels::gemm_int8_weight_blocks, &kernels::linear_int8})
    for (int64_t m : {1, 3, 8, 9, 33})
      for (int64_t n : {1, 7, 130, 1031})
        for (int64_t k : {1, 5, 31, 64, 77, 1000}) {
          SCOPED_TRACE(str("m=", m, " n=", n, " k=", k));
          const auto x = lcg_values(m * k, 3), w = lcg_values(n * k, 4, 0.2f);
          const Quantized z = quantize(w, n, k);
          std::vector<float> c(m * n, std::nanf("")), r(m * n);
          path(c.data(), x.data(), z.q.data(), z.scale.data(), m, n, k);
          kernels::ref::linear_int8(r.data(), x.data(), z.q.data(), z.scale.data(), m, n, k);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double mag = 0;
              for (int64_t p = 0; p < k; ++p)
                mag += std::abs(double(x[i * k + p]) * z.q[j * k + p] * z.scale[j]);
              const double err = std::abs(double(c[i * n + j]) - r[i * n + j]) / (mag + 1e-30);
              worst = std::max(worst, err);
              // k products summed in f32 (k u sum |x w|), plus one rounding of either the scale
              // product (decode) or of each dequantized weight (prefill): (k + 2) u sum |x w|
              ASSERT_LE(err, static_cast<double>(k + 2) * 0x1p-24)
                  << "C[" << i << "," << j << "] = " << c[i * n + j] << ", reference "
                  << r[i * n + j];
            }
        }
  std::printf("    largest error relative to sum |x w|: %.3g (bound (k + 2) 2^-24)\n", worst);
}

TEST(Int8Weights, BitwiseOverThreadCountsAndAddresses) {
  struct Shape3 {
    int64_t m, n, k;
  };
  for (Shape3 s : {Shape3{1, 3000, 768}, Shape3{4, 2048, 333}, Shape3{8, 1500, 257},
                   Shape3{20, 1100, 300}, Shape3{64, 700, 129}}) {
    SCOPED_TRACE(str("m=", s.m, " n=", s.n, " k=", s.k));
    const auto x = lcg_values(s.m * s.k, 5), w = lcg_values(s.n * s.k, 6, 0.1f);
    const Quantized z = quantize(w, s.n, s.k);
    expect_same_bits_over_threads_and_offsets([&](size_t off) {
      auto xb = at_offset(x, off), sb = at_offset(z.scale, off);
      auto qb = at_offset(z.q, off);
      std::vector<float> cb(s.m * s.n + 8);
      kernels::linear_int8(cb.data() + off, xb.data() + off, qb.data() + off, sb.data() + off, s.m,
                           s.n, s.k);
      return std::vector<float>(cb.begin() + off, cb.begin() + off + s.m * s.n);
    });
  }
}

namespace {

// The decode kernel's order (runtime/lanes8.h, dot), as the kernel was written before its int8
// widening instruction (an 8-byte vector converted by the compiler, which GCC 12 scalarizes): lane
// l of register r accumulates x[i + 8 r + l] q[i + 8 r + l] over whole 32-blocks, then register 0
// over whole 8-blocks; the registers are added pairwise, the 8 lanes pairwise, then the tail in
// order, times the row's scale. The same expressions and loops as the kernel, so that the
// compiler's contraction of products and sums into FMAs (an FMA build's, tuning dependent) is the
// same on both sides; only the widening of the int8 values differs, which is exact.
typedef int8_t I8 __attribute__((vector_size(8)));
inline lanes8::V8 load8_scalarized(const int8_t* p) {
  I8 v;
  std::memcpy(&v, p, sizeof v);
  return __builtin_convertvector(__builtin_convertvector(v, lanes8::I32x8), lanes8::V8);
}
float lane_order_int8(const float* __restrict x, const int8_t* __restrict w, float scale,
                      int64_t k) {
  using lanes8::load8;
  using lanes8::V8;
  V8 s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    s0 += load8(x + i) * load8_scalarized(w + i);
    s1 += load8(x + i + 8) * load8_scalarized(w + i + 8);
    s2 += load8(x + i + 16) * load8_scalarized(w + i + 16);
    s3 += load8(x + i + 24) * load8_scalarized(w + i + 24);
  }
  for (; i + 8 <= k; i += 8) s0 += load8(x + i) * load8_scalarized(w + i);
  const V8 s = (s0 + s1) + (s2 + s3);
  float r = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  for (; i < k; ++i) r += x[i] * static_cast<float>(w[i]);
  return scale * r;
}

}  // namespace

TEST(Int8Weights, GemvEqualsItsLaneOrderLoopBitwise) {
  ThreadsGuard guard;
  for (int threads : {1, 2})
    for (int64_t m : {1, 2, 5, 8, 13, 32})
      for (int64_t n : {1, 9, 131})
        for (int64_t k : {1, 7, 8, 31, 32, 33, 40, 63, 72, 300, 768, 1001}) {
          SCOPED_TRACE(str("threads=", threads, " m=", m, " n=", n, " k=", k));
          set_num_threads(threads);
          const auto x = lcg_values(m * k, 7), w = lcg_values(n * k, 8, 0.3f);
          const Quantized z = quantize(w, n, k);
          std::vector<float> c(m * n, std::nanf(""));
          kernels::gemv_int8(c.data(), x.data(), z.q.data(), z.scale.data(), m, n, k);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              const float e = lane_order_int8(x.data() + i * k, z.q.data() + j * k, z.scale[j], k);
              ASSERT_EQ(std::memcmp(&c[i * n + j], &e, 4), 0)
                  << "C[" << i << "," << j << "] = " << c[i * n + j] << ", lane order " << e;
            }
        }
}
