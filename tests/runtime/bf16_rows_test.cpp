// The bf16 product of a few rows (kernels::bmm of bf16 activations against a linear layer's bf16
// weight, W [n, k] viewed as W^T: a decode step's shape, up to 32 rows): every element is
// lanes8::dot of its row and column widened to f32, rounded to bf16 once, for any row count,
// thread count and beta, so a decode row's bits are the same alone as in a serving batch; the
// printed digest is the same on the native, x86-64-v3 and x86-64-v2 builds.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nxd/runtime/context.h"
#include "nxd/runtime/dtype.h"
#include "nxd/runtime/kernels/matmul.h"
#include "nxd/runtime/lanes8.h"
#include "nxd/runtime/rng.h"
#include "nxd/runtime/tensor.h"
#include "support/random.h"

using namespace nxd;

namespace {

std::vector<float> widened(const Tensor& t) {
  std::vector<float> v(t.numel());
  bf16_to_f32(v.data(), static_cast<const uint16_t*>(t.raw_data()), t.numel());
  return v;
}

struct ThreadsGuard {
  int prev = num_threads();
  ~ThreadsGuard() { set_num_threads(prev); }
};

}  // namespace

TEST(Bf16Rows, EachElementIsTheLaneOrderDotRoundedOnceForAnyRowCount) {
  ThreadsGuard guard;
  constexpr int64_t kRows = 32;
  uint64_t digest = 14695981039346656037ull;
  int64_t checked = 0;
  for (int64_t k : {16, 33, 200, 768})
    for (int64_t n : {17, 100}) {
      const Tensor x = nxd::testing::randn({kRows, k}, 3, DType::bf16),
                   w = nxd::testing::randn({n, k}, 4, DType::bf16);
      const Tensor c0 = nxd::testing::randn({kRows, n}, 5, DType::bf16);  // beta = 1 adds it
      const std::vector<float> xf = widened(x), wf = widened(w), cf = widened(c0);
      for (double beta : {0.0, 1.0})
        for (int threads : {1, 2})
          for (int64_t m = 1; m <= kRows; ++m) {
            SCOPED_TRACE(str("k=", k, " n=", n, " m=", m, " threads=", threads, " beta=", beta));
            set_num_threads(threads);
            const Tensor c = c0.narrow(0, 0, m).clone();
            kernels::bmm(c, x.narrow(0, 0, m), w.t(), 0.5, beta);
            const auto* got = static_cast<const uint16_t*>(c.raw_data());
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                float v = 0.5f * lanes8::dot(xf.data() + i * k, wf.data() + j * k, k);
                if (beta == 1.0) v += cf[i * n + j];
                ASSERT_EQ(got[i * n + j], bf16::from_f32(v)) << "C[" << i << "," << j << "]";
                digest = (digest ^ got[i * n + j]) * 1099511628211ull;
              }
            checked += m * n;
          }
    }
  std::printf("    %lld bf16 elements bitwise lanes8::dot rounded once, digest %016llx\n",
              static_cast<long long>(checked), static_cast<unsigned long long>(digest));
}
