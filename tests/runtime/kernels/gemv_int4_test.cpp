// The 4-bit group-wise kernels (runtime/kernels/gemv_int4.h): quantization within half a scale
// step for every group size and both zero points, the block layout (llama.cpp's Q4_0 nibble
// order), both product paths against the f64 reference of the dequantized weight at ragged
// shapes, and bitwise the same for any thread count and operand address.
#include "nxd/runtime/kernels/gemv_int4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "nxd/runtime/context.h"
#include "support/compare.h"
#include "support/weights.h"

using namespace nxd;
using kernels::Int4Layout;
using kernels::Int4Zero;

namespace {

using nxd::testing::at_offset;
using nxd::testing::expect_same_bits_over_threads_and_offsets;
using nxd::testing::lcg_values;
using nxd::testing::ThreadsGuard;

struct Q4 {
  Int4Layout l;
  std::vector<uint8_t> q;
  std::vector<float> scale, min;
  const float* mins() const { return min.empty() ? nullptr : min.data(); }
};

Q4 quantize(const std::vector<float>& w, int64_t n, int64_t k, int64_t group, Int4Zero zero) {
  Q4 r;
  r.l = Int4Layout{.n = n, .k = k, .group = group, .zero = zero};
  r.q.resize(r.l.value_bytes());
  r.scale.resize(r.l.groups());
  if (zero == Int4Zero::asymmetric) r.min.resize(r.l.groups());
  kernels::quantize_int4(r.q.data(), r.scale.data(), r.min.empty() ? nullptr : r.min.data(),
                         w.data(), r.l);
  return r;
}

using Path = void (*)(float*, const float*, const uint8_t*, const float*, const float*,
                      const Int4Layout&, int64_t);

// u - offset of input j of weight row `col` (the padding past k holds offset: 0).
int code_minus_offset(const Q4& z, int64_t col, int64_t j) {
  const uint8_t b = z.q[col * z.l.bytes_per_row() + 16 * (j / 32) + (j % 16)];
  return ((j % 32) < 16 ? (b & 15) : (b >> 4)) - (z.l.zero == Int4Zero::symmetric ? 8 : 0);
}

// The minimum's term of group g of weight row `col`: min times the f32 sum of the group's x in
// input order (both product paths' asymmetric part); 0 symmetric.
float min_term(const float* x, const Q4& z, int64_t col, int64_t g) {
  if (z.min.empty()) return 0.0f;
  float xs = 0.0f;
  for (int64_t p = g * z.l.group; p < std::min(z.l.k, (g + 1) * z.l.group); ++p) xs += x[p];
  return z.min[col * z.l.groups_per_row() + g] * xs;
}

using Twin = float (*)(const float* x, const Q4& z, int64_t col);

// c [m, n] equals twin(row i of x, column j) bitwise at every output.
void expect_bitwise_twin(const std::vector<float>& c, const std::vector<float>& x, const Q4& z,
                         int64_t m, Twin twin) {
  const int64_t n = z.l.n, k = z.l.k;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float e = twin(x.data() + i * k, z, j);
      ASSERT_EQ(std::memcmp(&c[i * n + j], &e, 4), 0)
          << "C[" << i << "," << j << "] = " << c[i * n + j] << ", its definition " << e;
    }
}

}  // namespace

TEST(Int4Weights, QuantizationIsWithinHalfAScaleStep) {
  const int64_t n = 9, k = 301;
  std::vector<float> w = lcg_values(n * k, 1);
  for (int64_t j = 0; j < k; ++j) w[5 * k + j] = 0.0f;   // a zero row
  for (int64_t j = 0; j < k; ++j) w[6 * k + j] = 0.25f;  // a constant one
  for (int64_t group : {32, 64, 128})
    for (Int4Zero zero : {Int4Zero::symmetric, Int4Zero::asymmetric}) {
      const Q4 z = quantize(w, n, k, group, zero);
      std::vector<float> d(n * k);
      kernels::dequantize_int4_rows(d.data(), z.q.data(), z.scale.data(), z.mins(), z.l, 0, n);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < k; ++j) {
          const float s = z.scale[r * z.l.groups_per_row() + j / group];
          ASSERT_LE(std::abs(double(w[r * k + j]) - d[r * k + j]), 0.5 * s * (1 + 1e-5) + 1e-7)
              << "group " << group << " row " << r << " col " << j;
        }
      for (int64_t j = 0; j < k; ++j) EXPECT_EQ(d[5 * k + j], 0.0f);
      if (zero == Int4Zero::asymmetric) {  // a constant group is exact
        for (int64_t j = 0; j < k; ++j) EXPECT_EQ(d[6 * k + j], 0.25f);
      }
    }
  std::vector<float> bad = lcg_values(2 * 40, 2);
  bad[1 * 40 + 33] = INFINITY;
  try {
    quantize(bad, 2, 40, 32, Int4Zero::symmetric);
    FAIL() << "an infinite weight was quantized";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("weight [1,33]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize(bad, 2, 40, 48, Int4Zero::symmetric), InvalidArgument);
}

// Byte l of a block: input l in the low nibble, input 16 + l in the high one (Q4_0's order).
TEST(Int4Weights, BlockLayoutIsQ40s) {
  std::vector<float> w(32);
  for (int j = 0; j < 32; ++j) w[j] = static_cast<float>((j % 15) - 7);  // exact at scale 1
  const Q4 z = quantize(w, 1, 32, 32, Int4Zero::symmetric);
  ASSERT_EQ(z.scale[0], 1.0f);
  for (int l = 0; l < 16; ++l) {
    EXPECT_EQ(z.q[l] & 15, (l % 15) - 7 + 8) << l;
    EXPECT_EQ(z.q[l] >> 4, ((16 + l) % 15) - 7 + 8) << l;
  }
}

TEST(Int4Weights, BothPathsMatchTheReferenceAtRaggedShapes) {
  ThreadsGuard guard;
  set_num_threads(2);
  double worst = 0;
  for (Path path : {&kernels::gemv_int4, &kernels::gemm_int4_weight_blocks, &kernels::linear_int4})
    for (Int4Zero zero : {Int4Zero::symmetric, Int4Zero::asymmetric})
      for (int64_t group : {32, 64, 128})
        for (int64_t m : {1, 3, 9})
          for (int64_t n : {1, 7, 130})
            for (int64_t k : {1, 5, 31, 64, 77, 300}) {
              SCOPED_TRACE(str("m=", m, " n=", n, " k=", k, " group=", group));
              const auto x = lcg_values(m * k, 3), w = lcg_values(n * k, 4, 0.2f);
              const Q4 z = quantize(w, n, k, group, zero);
              std::vector<float> c(m * n, std::nanf("")), r(m * n), d(n * k);
              path(c.data(), x.data(), z.q.data(), z.scale.data(), z.mins(), z.l, m);
              kernels::ref::linear_int4(r.data(), x.data(), z.q.data(), z.scale.data(), z.mins(),
                                        z.l, m);
              kernels::dequantize_int4_rows(d.data(), z.q.data(), z.scale.data(), z.mins(), z.l, 0,
                                            n);
              for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < n; ++j) {
                  double mag = 0;
                  for (int64_t p = 0; p < k; ++p) {
                    mag += std::abs(double(x[i * k + p]) * d[j * k + p]);
                    if (zero == Int4Zero::asymmetric)  // the minimum's term, summed apart
                      mag += std::abs(double(x[i * k + p]) *
                                      z.min[j * z.l.groups_per_row() + p / group]);
                  }
                  const double err = std::abs(double(c[i * n + j]) - r[i * n + j]) / (mag + 1e-30);
                  worst = std::max(worst, err);
                  // k products and sums in f32 plus the group scalings: (k + 4) u sum |x w|
                  ASSERT_LE(err, static_cast<double>(k + 4) * 0x1p-24)
                      << "C[" << i << "," << j << "] = " << c[i * n + j] << ", reference "
                      << r[i * n + j];
                }
            }
  std::printf("    largest error relative to sum |x w|: %.3g (bound (k + 4) 2^-24)\n", worst);
}

TEST(Int4Weights, BitwiseOverThreadCountsAndAddresses) {
  struct Shape3 {
    int64_t m, n, k;
  };
  for (auto act : {kernels::Int4Activations::f32, kernels::Int4Activations::int8_blocks})
    for (Int4Zero zero : {Int4Zero::symmetric, Int4Zero::asymmetric})
      for (Shape3 s : {Shape3{1, 3000, 768}, Shape3{4, 2048, 333}, Shape3{20, 1100, 300},
                       Shape3{40, 300, 200}}) {
        SCOPED_TRACE(str("m=", s.m, " n=", s.n, " k=", s.k, " act=", static_cast<int>(act)));
        const auto x = lcg_values(s.m * s.k, 5), w = lcg_values(s.n * s.k, 6, 0.1f);
        Q4 z = quantize(w, s.n, s.k, 64, zero);
        z.l.act = act;
        expect_same_bits_over_threads_and_offsets([&](size_t off) {
          auto xb = at_offset(x, off), sb = at_offset(z.scale, off), mb = at_offset(z.min, off);
          auto qb = at_offset(z.q, off);
          std::vector<float> cb(s.m * s.n + 8);
          kernels::linear_int4(cb.data() + off, xb.data() + off, qb.data() + off, sb.data() + off,
                               z.min.empty() ? nullptr : mb.data() + off, z.l, s.m);
          return std::vector<float>(cb.begin() + off, cb.begin() + off + s.m * s.n);
        });
      }
}

namespace {

// The decode kernel's order written as scalar loops (runtime/kernels/gemv_int4.cpp): per group,
// lane l of register r accumulates x * (nibble - offset) over the group's whole 32-blocks
// (registers 0, 1: the low nibbles of bytes 0-7, 8-15; registers 2, 3: the high ones), the
// registers are added pairwise and the sum, times the group's scale, is added to 8 running lanes;
// the partial block is summed apart (times the scale, then the minimum's term, into a scalar);
// at the end the scalar plus the 8 lanes added pairwise.
float lane_order_int4(const float* x, const Q4& z, int64_t col) {
  const Int4Layout& l = z.l;
  const int64_t G = l.groups_per_row();
  auto nib = [&](int64_t j) { return static_cast<float>(code_minus_offset(z, col, j)); };
  float lanes[8] = {}, acc = 0.0f;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t j0 = g * l.group, j1 = std::min(l.k, j0 + l.group);
    float s[4][8] = {};
    int64_t j = j0;
    for (; j + 32 <= j1; j += 32)
      for (int r = 0; r < 4; ++r)
        for (int e = 0; e < 8; ++e) s[r][e] += x[j + 8 * r + e] * nib(j + 8 * r + e);
    float t = 0.0f;
    for (; j < j1; ++j) t += x[j] * nib(j);
    const float sc = z.scale[col * G + g];
    for (int e = 0; e < 8; ++e) lanes[e] += ((s[0][e] + s[1][e]) + (s[2][e] + s[3][e])) * sc;
    acc += sc * t;
    if (!z.min.empty()) acc += min_term(x, z, col, g);
  }
  return acc + (((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7])));
}

}  // namespace

TEST(Int4Weights, GemvEqualsItsLaneOrderLoopBitwise) {
  ThreadsGuard guard;
  for (int threads : {1, 2})
    for (Int4Zero zero : {Int4Zero::symmetric, Int4Zero::asymmetric})
      for (int64_t group : {32, 64, 128})
        for (int64_t m : {1, 3, 8})
          for (int64_t n : {1, 9, 131})
            for (int64_t k : {1, 7, 31, 32, 33, 64, 100, 300, 768}) {
              SCOPED_TRACE(
                  str("threads=", threads, " m=", m, " n=", n, " k=", k, " group=", group));
              set_num_threads(threads);
              const auto x = lcg_values(m * k, 7), w = lcg_values(n * k, 8, 0.3f);
              const Q4 z = quantize(w, n, k, group, zero);
              std::vector<float> c(m * n, std::nanf(""));
              kernels::gemv_int4(c.data(), x.data(), z.q.data(), z.scale.data(), z.mins(), z.l, m);
              expect_bitwise_twin(c, x, z, m, &lane_order_int4);
            }
}

// The prefill path's dequantization (a block of 32 inputs at a time) gives each weight the bits
// of (u - offset) * scale (+ min) computed one input at a time, at ragged k and every group.
TEST(Int4Weights, DequantizedRowsEqualTheScalarFormulaBitwise) {
  for (Int4Zero zero : {Int4Zero::symmetric, Int4Zero::asymmetric})
    for (int64_t group : {32, 64, 128})
      for (int64_t k : {1, 5, 31, 32, 33, 64, 100, 300, 768}) {
        SCOPED_TRACE(str("k=", k, " group=", group));
        const int64_t n = 5, r0 = 1, r1 = 4;
        const Q4 z = quantize(lcg_values(n * k, 9, 0.4f), n, k, group, zero);
        const int64_t G = z.l.groups_per_row();
        std::vector<float> d((r1 - r0) * k + 1, std::nanf(""));
        kernels::dequantize_int4_rows(d.data(), z.q.data(), z.scale.data(), z.mins(), z.l, r0, r1);
        EXPECT_TRUE(std::isnan(d.back())) << "wrote past its rows";
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t j = 0; j < k; ++j) {
            float e = static_cast<float>(code_minus_offset(z, r, j)) * z.scale[r * G + j / group];
            if (zero == Int4Zero::asymmetric) e = e + z.min[r * G + j / group];
            const float got = d[(r - r0) * k + j];
            ASSERT_EQ(std::memcmp(&got, &e, 4), 0)
                << "row " << r << " col " << j << ": " << got << " against " << e;
          }
      }
}

namespace {

// The int8_blocks product's definition (gemv_int4.h: gemv_int4_q8) as scalar loops: x quantized
// per 32-input block (d = max |x| / 127, q = x / d rounded to nearest even), each block's exact
// integer sum of q * (u - offset), per group float(sum) * d summed over its blocks, times the
// scale, into a running sum; asymmetric, the minimums' terms (min times the f32 sum of the
// group's x) into another, added first.
float lane_order_int4_q8(const float* x, const Q4& z, int64_t col) {
  const Int4Layout& l = z.l;
  const int64_t nb = l.blocks_per_row(), G = l.groups_per_row(), per = l.group / 32;
  std::vector<int> q(32 * nb, 0);
  std::vector<float> d(nb);
  for (int64_t b = 0; b < nb; ++b) {
    float amax = 0.0f;
    for (int64_t j = 32 * b; j < std::min(l.k, 32 * b + 32); ++j)
      amax = std::max(amax, std::abs(x[j]));
    d[b] = amax / 127.0f;
    for (int64_t j = 32 * b; j < std::min(l.k, 32 * b + 32) && d[b] != 0.0f; ++j)
      q[j] = static_cast<int>(std::clamp(std::nearbyint(x[j] / d[b]), -127.0f, 127.0f));
  }
  auto code = [&](int64_t j) { return code_minus_offset(z, col, j); };
  float sum = 0.0f, acc = 0.0f;
  for (int64_t g = 0; g < G; ++g) {
    float gs = 0.0f;
    for (int64_t b = g * per; b < std::min(nb, g * per + per); ++b) {
      int s = 0;
      for (int64_t j = 32 * b; j < 32 * b + 32; ++j) s += q[j] * code(j);
      const float f = static_cast<float>(s) * d[b];
      gs = b == g * per ? f : gs + f;
    }
    sum += gs * z.scale[col * G + g];
    if (!z.min.empty()) acc += min_term(x, z, col, g);
  }
  return z.min.empty() ? sum : acc + sum;
}

}  // namespace

// Each row's outputs are the definition's for that row alone, bitwise: any m (row tiles of 32
// included), thread count, group, zero point and ragged k. The same scalar loops on every build
// (native VNNI, x86-64-v3 AVX2, x86-64-v2 SSSE3) make the builds' bits the same.
TEST(Int4Weights, Int8ActivationsEqualTheirDefinitionBitwise) {
  ThreadsGuard guard;
  for (int threads : {1, 2})
    for (Int4Zero zero : {Int4Zero::symmetric, Int4Zero::asymmetric})
      for (int64_t group : {32, 64, 128})
        for (int64_t m : {1, 3, 32, 33})
          for (int64_t n : {1, 9, 131})
            for (int64_t k : {1, 7, 31, 32, 33, 64, 100, 300, 768}) {
              SCOPED_TRACE(
                  str("threads=", threads, " m=", m, " n=", n, " k=", k, " group=", group));
              set_num_threads(threads);
              const auto x = lcg_values(m * k, 10), w = lcg_values(n * k, 11, 0.3f);
              Q4 z = quantize(w, n, k, group, zero);
              z.l.act = kernels::Int4Activations::int8_blocks;
              std::vector<float> c(m * n, std::nanf(""));
              kernels::linear_int4(c.data(), x.data(), z.q.data(), z.scale.data(), z.mins(), z.l,
                                   m);
              expect_bitwise_twin(c, x, z, m, &lane_order_int4_q8);
            }
}

// Against the f64 product of the f32 activations and the dequantized weight: within the
// activations' rounding (each moves by at most d / 2 of its block, on the u * scale part of its
// weight) plus the f32 roundings of the block sums' scalings and additions.
TEST(Int4Weights, Int8ActivationsStayWithinTheirRounding) {
  ThreadsGuard guard;
  set_num_threads(2);
  double worst = 0;
  for (Int4Zero zero : {Int4Zero::symmetric, Int4Zero::asymmetric})
    for (int64_t group : {32, 128})
      for (int64_t k : {5, 77, 300, 768}) {
        const int64_t m = 4, n = 37;
        SCOPED_TRACE(str("k=", k, " group=", group));
        const auto x = lcg_values(m * k, 12), w = lcg_values(n * k, 13, 0.2f);
        Q4 z = quantize(w, n, k, group, zero);
        z.l.act = kernels::Int4Activations::int8_blocks;
        const int64_t G = z.l.groups_per_row();
        std::vector<float> c(m * n), r(m * n), dq(n * k);
        kernels::linear_int4(c.data(), x.data(), z.q.data(), z.scale.data(), z.mins(), z.l, m);
        kernels::ref::linear_int4(r.data(), x.data(), z.q.data(), z.scale.data(), z.mins(), z.l, m);
        kernels::dequantize_int4_rows(dq.data(), z.q.data(), z.scale.data(), z.mins(), z.l, 0, n);
        for (int64_t i = 0; i < m; ++i) {
          std::vector<int8_t> q(32 * z.l.blocks_per_row());
          std::vector<float> d(z.l.blocks_per_row());
          kernels::quantize_int4_activations(q.data(), d.data(), x.data() + i * k, k);
          for (int64_t j = 0; j < n; ++j) {
            double act = 0, mag = 0;
            for (int64_t p = 0; p < k; ++p) {
              const double mn = z.min.empty() ? 0.0 : std::abs(z.min[j * G + p / group]);
              const double wu = std::abs(double(dq[j * k + p])) + mn;  // bounds |u * scale|
              act += wu * d[p / 32] * 0.5000001;
              mag += (std::abs(double(x[i * k + p])) + d[p / 32]) * (wu + mn);
            }
            const double bound = act + static_cast<double>(G + group + 16) * 0x1p-24 * mag;
            const double err = std::abs(double(c[i * n + j]) - r[i * n + j]);
            worst = std::max(worst, err / bound);
            ASSERT_LE(err, bound) << "C[" << i << "," << j << "] = " << c[i * n + j]
                                  << ", f64 reference " << r[i * n + j];
          }
        }
      }
  std::printf("    largest error over its bound: %.3g\n", worst);
}

// A non-finite activation makes its row's outputs NaN (its block's scale is NaN), as the f32
// path's products do, and leaves the other rows as they are alone.
TEST(Int4Weights, Int8ActivationsOfANonFiniteRowAreNaNAndStayInTheirRow) {
  const int64_t m = 3, n = 20, k = 96;
  auto x = lcg_values(m * k, 14);
  Q4 z = quantize(lcg_values(n * k, 15, 0.3f), n, k, 32, Int4Zero::symmetric);
  z.l.act = kernels::Int4Activations::int8_blocks;
  x[1 * k + 40] = INFINITY;
  std::vector<float> c(m * n), alone(n);
  kernels::linear_int4(c.data(), x.data(), z.q.data(), z.scale.data(), nullptr, z.l, m);
  for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(c[1 * n + j])) << j;
  for (int64_t i : {0, 2}) {
    kernels::linear_int4(alone.data(), x.data() + i * k, z.q.data(), z.scale.data(), nullptr, z.l,
                         1);
    EXPECT_EQ(std::memcmp(alone.data(), c.data() + i * n, n * 4), 0) << "row " << i;
  }
}
