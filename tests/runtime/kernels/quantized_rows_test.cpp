// The weight-only quantized products (runtime/kernels/gemv_int8.h, gemv_int4.h) through their
// dispatchers: each row of a product of 1 to 32 rows has the bits it gets alone,
// whatever the number of rows, so a serving step's decode rows do not depend on what is batched
// with them (docs/design/inference.md, "Batch invariance").
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nxd/runtime/context.h"
#include "nxd/runtime/kernels/gemv_int4.h"
#include "nxd/runtime/kernels/gemv_int8.h"
#include "support/compare.h"
#include "support/weights.h"

using namespace nxd;

namespace {

using nxd::testing::lcg_values;
using nxd::testing::ThreadsGuard;

constexpr int64_t kRows = 32;  // a serving step's decode rows (runtime/gemv_f32.h: kSmallRows)

// product(c, x, m) computes c [m, n] = x [m, k] @ W^T; each row of the m-row product must equal
// the product of that row alone, for every m up to `max_rows`. Returns the first mismatch.
template <class Product>
void expect_rows_alone(Product&& product, int64_t max_rows, int64_t n, int64_t k) {
  const auto x = lcg_values(max_rows * k, 11);
  std::vector<float> alone(max_rows * n);
  for (int64_t i = 0; i < max_rows; ++i) product(alone.data() + i * n, x.data() + i * k, 1);
  for (int64_t m = 2; m <= max_rows; ++m) {
    std::vector<float> c(m * n);
    product(c.data(), x.data(), m);
    for (int64_t i = 0; i < m * n; ++i)
      ASSERT_EQ(std::memcmp(&c[i], &alone[i], 4), 0) << "m=" << m << " C[" << i / n << "," << i % n
                                                     << "] = " << c[i] << ", alone " << alone[i];
  }
}

}  // namespace

TEST(QuantizedRows, Int8EachRowHasItsBitsAloneUpTo32Rows) {
  ThreadsGuard guard;
  for (int threads : {1, 2})
    for (int64_t k : {40, 256}) {
      SCOPED_TRACE(str("threads=", threads, " k=", k));
      set_num_threads(threads);
      const int64_t n = 67;
      const auto w = lcg_values(n * k, 5, 0.3f);
      std::vector<int8_t> q(n * k);
      std::vector<float> scale(n);
      kernels::quantize_int8_rows(q.data(), scale.data(), w.data(), n, k);
      expect_rows_alone(
          [&](float* c, const float* x, int64_t m) {
            kernels::linear_int8(c, x, q.data(), scale.data(), m, n, k);
          },
          kRows, n, k);
    }
}

// Both activation modes (f32; int8_blocks, which also takes more than 32 rows: 40 here).
TEST(QuantizedRows, Int4EachRowHasItsBitsAloneUpTo32Rows) {
  ThreadsGuard guard;
  for (int threads : {1, 2})
    for (auto act : {kernels::Int4Activations::f32, kernels::Int4Activations::int8_blocks})
      for (kernels::Int4Zero zero : {kernels::Int4Zero::symmetric, kernels::Int4Zero::asymmetric}) {
        SCOPED_TRACE(str("threads=", threads,
                         zero == kernels::Int4Zero::symmetric ? " sym" : " asym",
                         " act=", static_cast<int>(act)));
        set_num_threads(threads);
        const kernels::Int4Layout l{.n = 67, .k = 200, .group = 64, .zero = zero, .act = act};
        const auto w = lcg_values(l.n * l.k, 6, 0.3f);
        std::vector<uint8_t> q(l.value_bytes());
        std::vector<float> scale(l.groups()),
            min(zero == kernels::Int4Zero::asymmetric ? l.groups() : 0);
        float* mins = min.empty() ? nullptr : min.data();
        kernels::quantize_int4(q.data(), scale.data(), mins, w.data(), l);
        expect_rows_alone(
            [&](float* c, const float* x, int64_t m) {
              kernels::linear_int4(c, x, q.data(), scale.data(), mins, l, m);
            },
            act == kernels::Int4Activations::f32 ? kRows : 40, l.n, l.k);
      }
}
