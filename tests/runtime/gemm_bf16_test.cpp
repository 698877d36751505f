// The bf16 matmul precision of blas::sgemm: every available kernel against a double-precision
// reference computed from bf16-rounded inputs, the mode switch, determinism over threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/dtype.h"
#include "nxd/runtime/gemm_bf16.h"

using namespace nxd;
using blas::Bf16Kernel;
using blas::MatmulPrecision;

namespace {

constexpr Bf16Kernel kKernels[] = {Bf16Kernel::amx, Bf16Kernel::avx512_bf16, Bf16Kernel::portable};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float round_bf16(float x) {
  return bf16::to_f32(bf16::from_f32(x));
}

// Deterministic values in [-1, 1) with full f32 mantissas (mostly not representable in bf16).
std::vector<float> values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(s >> 40) / static_cast<double>(1 << 23) - 1.0);
  }
  return v;
}

// A stored operand: rows x cols used, leading dimension ld > cols, padding filled with NaN so a
// kernel that reads outside the operand poisons the result.
struct Operand {
  int64_t rows, cols, ld;
  std::vector<float> data;
  Operand(int64_t r, int64_t c, int64_t pad, uint32_t seed) : rows(r), cols(c), ld(c + pad) {
    data.assign(static_cast<size_t>(std::max<int64_t>(1, rows * ld)), kNaN);
    auto v = values(static_cast<size_t>(rows * cols), seed);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) data[i * ld + j] = v[i * cols + j];
  }
  float at(int64_t i, int64_t j) const { return data[i * ld + j]; }
};

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  float alpha, beta;
};

// Runs sgemm (current precision and kernel) on strided operands and checks every element of C
// against a double reference from bf16-rounded (or, with round = false, unrounded) inputs.
// Bound: every product of two bf16 values is exact in f32, so only the K additions of the f32
// accumulation (in whatever order) and the alpha/beta epilogue round: |err| <= (k + 3) u
// (|alpha| sum_p |a_p b_p| + |beta c|), u = 2^-24.
::testing::AssertionResult check_case(const Case& t, bool round = true) {
  const int64_t pad = 3;
  Operand a(t.ta ? t.k : t.m, t.ta ? t.m : t.k, pad, 11);
  Operand b(t.tb ? t.n : t.k, t.tb ? t.k : t.n, pad, 12);
  Operand c(t.m, t.n, pad, 13);
  if (t.beta == 0.0f)  // beta == 0 must ignore C, NaN included
    for (int64_t i = 0; i < t.m; ++i)
      for (int64_t j = 0; j < t.n; ++j) c.data[i * c.ld + j] = kNaN;
  const std::vector<float> c0 = c.data;
  blas::sgemm(t.ta, t.tb, t.m, t.n, t.k, t.alpha, a.data.data(), a.ld, b.data.data(), b.ld, t.beta,
              c.data.data(), c.ld);
  const double u = std::ldexp(1.0, -24);
  // op(A) as [m][k] and op(B) as [n][k] in double, rounded to bf16 first unless round is off
  std::vector<double> ar(static_cast<size_t>(t.m * t.k)), br(static_cast<size_t>(t.n * t.k));
  for (int64_t p = 0; p < t.k; ++p) {
    for (int64_t i = 0; i < t.m; ++i) {
      const float x = t.ta ? a.at(p, i) : a.at(i, p);
      ar[i * t.k + p] = round ? round_bf16(x) : x;
    }
    for (int64_t j = 0; j < t.n; ++j) {
      const float y = t.tb ? b.at(j, p) : b.at(p, j);
      br[j * t.k + p] = round ? round_bf16(y) : y;
    }
  }
  double worst = 0;  // largest |err| / bound
  int64_t wi = -1, wj = -1;
  double w_got = 0, w_ref = 0, w_bound = 0;
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = 0; j < t.n; ++j) {
      double s = 0, mag = 0;
      const double* x = ar.data() + i * t.k;
      const double* y = br.data() + j * t.k;
      for (int64_t p = 0; p < t.k; ++p) {
        s += x[p] * y[p];
        mag += std::fabs(x[p] * y[p]);
      }
      double ref = t.alpha * s, bound_mag = std::fabs(t.alpha) * mag;
      if (t.beta != 0.0f) {
        ref += t.beta * static_cast<double>(c0[i * c.ld + j]);
        bound_mag += std::fabs(t.beta * static_cast<double>(c0[i * c.ld + j]));
      }
      const double bound = (t.k + 3) * u * bound_mag + 1e-30;
      const double got = c.data[i * c.ld + j];
      const double r = std::isfinite(got) ? std::fabs(got - ref) / bound : INFINITY;
      if (!(r <= worst)) worst = r, wi = i, wj = j, w_got = got, w_ref = ref, w_bound = bound;
    }
  // the padding of C is untouched
  for (int64_t i = 0; i < t.m; ++i)
    for (int64_t j = t.n; j < c.ld; ++j)
      if (!std::isnan(c.data[i * c.ld + j]))
        return ::testing::AssertionFailure() << "wrote C padding at " << i << "," << j;
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "largest error at C[" << wi << "," << wj << "]: got " << w_got << " reference " << w_ref
         << " |diff| " << std::fabs(w_got - w_ref) << " > bound " << w_bound << " (" << worst
         << "x)";
}

struct Restore {
  MatmulPrecision precision = blas::matmul_precision();
  Bf16Kernel kernel = blas::bf16_kernel();
  int threads = num_threads();
  ~Restore() {
    blas::set_matmul_precision(precision);
    blas::set_bf16_kernel(kernel);
    set_num_threads(threads);
  }
};

// Calls fn(kernel) for every available kernel (the portable one always exists).
template <class F>
void for_each_kernel(F&& fn) {
  for (Bf16Kernel k : kKernels) {
    if (!blas::bf16_kernel_available(k)) {
      std::printf("[ note ] bf16 kernel %s is not available here: skipped\n",
                  blas::bf16_kernel_name(k));
      continue;
    }
    SCOPED_TRACE(blas::bf16_kernel_name(k));
    blas::set_bf16_kernel(k);
    fn(k);
  }
}

}  // namespace

TEST(GemmBf16, NamesAndParsing) {
  EXPECT_STREQ(blas::matmul_precision_name(MatmulPrecision::fp32), "fp32");
  EXPECT_STREQ(blas::matmul_precision_name(MatmulPrecision::bf16), "bf16");
  EXPECT_EQ(blas::parse_matmul_precision("bf16"), MatmulPrecision::bf16);
  EXPECT_EQ(blas::parse_matmul_precision("fp32"), MatmulPrecision::fp32);
  EXPECT_EQ(blas::parse_matmul_precision("medium"), MatmulPrecision::bf16);
  EXPECT_FALSE(blas::parse_matmul_precision("tf32").has_value());
  EXPECT_STREQ(blas::bf16_kernel_name(Bf16Kernel::amx), "amx");
  EXPECT_STREQ(blas::bf16_kernel_name(Bf16Kernel::avx512_bf16), "avx512_bf16");
  EXPECT_STREQ(blas::bf16_kernel_name(Bf16Kernel::portable), "portable");
  EXPECT_TRUE(blas::bf16_kernel_available(Bf16Kernel::portable));
  EXPECT_EQ(blas::matmul_precision(), MatmulPrecision::fp32);  // the default
  {
    blas::MatmulPrecisionScope scope(MatmulPrecision::bf16);
    EXPECT_EQ(blas::matmul_precision(), MatmulPrecision::bf16);
  }
  EXPECT_EQ(blas::matmul_precision(), MatmulPrecision::fp32);
  std::printf("[ note ] bf16 kernel in use: %s\n", blas::bf16_kernel_name(blas::bf16_kernel()));
}

TEST(GemmBf16, EveryKernelMatchesTheRoundedReference) {
  Restore restore;
  blas::set_matmul_precision(MatmulPrecision::bf16);
  const int64_t sizes[] = {1, 3, 15, 16, 17, 31, 33, 100};
  const std::pair<float, float> scales[] = {{1, 0}, {0.5f, 0}, {1, 1}, {-0.75f, 0.25f}};
  for_each_kernel([&](Bf16Kernel) {
    int idx = 0;
    std::vector<Case> cases;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        for (int64_t m : {1, 3, 16, 17, 33})
          for (int64_t n : {1, 15, 16, 31, 33})
            for (int64_t k : {1, 15, 16, 17, 33, 100}) {
              auto [al, be] = scales[idx++ % 4];
              cases.push_back({ta, tb, m, n, k, al, be});
            }
        for (int i = 0; i < 8; ++i) {  // mixes with 100 in every position
          auto [al, be] = scales[idx++ % 4];
          cases.push_back({ta, tb, sizes[i], sizes[(i + 3) % 8], sizes[(i + 5) % 8], al, be});
        }
        for (auto [al, be] : scales) cases.push_back({ta, tb, 130, 70, 65, al, be});
        // K split into several chunks (AMX: 256 per chunk), whole and edge blocks
        for (auto [al, be] : scales) cases.push_back({ta, tb, 40, 47, 300, al, be});
        cases.push_back({ta, tb, 100, 100, 100, 1, 0});
        cases.push_back({ta, tb, 17, 33, 0, 1, 0});  // k == 0: C = beta C
        cases.push_back({ta, tb, 17, 33, 0, 1, 0.5f});
      }
    for (const Case& t : cases) {
      ASSERT_TRUE(check_case(t)) << "ta=" << t.ta << " tb=" << t.tb << " m=" << t.m << " n=" << t.n
                                 << " k=" << t.k << " alpha=" << t.alpha << " beta=" << t.beta;
    }
  });
}

TEST(GemmBf16, TheModeRounds) {
  Restore restore;
  // 1 + 2^-12 is not representable in bf16 (it rounds to 1): a row of them times ones sums to
  // 16 (1 + 2^-12) in f32 and to exactly 16 with bf16 inputs.
  const int64_t m = 5, n = 7, k = 16;
  std::vector<float> a(m * k, 1.0f + std::ldexp(1.0f, -12)), b(k * n, 1.0f), c(m * n);
  blas::set_matmul_precision(MatmulPrecision::fp32);
  blas::sgemm(false, false, m, n, k, 1, a.data(), k, b.data(), n, 0, c.data(), n);
  for (float x : c) ASSERT_EQ(x, 16.0f * (1.0f + std::ldexp(1.0f, -12)));
  blas::set_matmul_precision(MatmulPrecision::bf16);
  for_each_kernel([&](Bf16Kernel) {
    std::fill(c.begin(), c.end(), kNaN);
    blas::sgemm(false, false, m, n, k, 1, a.data(), k, b.data(), n, 0, c.data(), n);
    for (float x : c) ASSERT_EQ(x, 16.0f);
  });
  // Random operands: fp32 mode is the f32 path (close to the unrounded reference and not to the
  // rounded one), bf16 mode matches the rounded reference.
  blas::set_matmul_precision(MatmulPrecision::fp32);
  EXPECT_TRUE(check_case({false, true, 40, 50, 200, 1, 0}, /*round=*/false));
  EXPECT_FALSE(check_case({false, true, 40, 50, 200, 1, 0}, /*round=*/true));
  blas::set_matmul_precision(MatmulPrecision::bf16);
  for_each_kernel([&](Bf16Kernel) {
    EXPECT_TRUE(check_case({false, true, 40, 50, 200, 1, 0}, /*round=*/true));
    EXPECT_FALSE(check_case({false, true, 40, 50, 200, 1, 0}, /*round=*/false));
  });
  // On bf16-representable inputs the portable kernel is exactly the f32 path.
  auto ra = values(64 * 48, 3), rb = values(48 * 32, 4);
  for (auto& x : ra) x = round_bf16(x);
  for (auto& x : rb) x = round_bf16(x);
  std::vector<float> c32(64 * 32), c16(64 * 32);
  blas::set_matmul_precision(MatmulPrecision::fp32);
  blas::sgemm(false, false, 64, 32, 48, 1, ra.data(), 48, rb.data(), 32, 0, c32.data(), 32);
  blas::set_matmul_precision(MatmulPrecision::bf16);
  blas::set_bf16_kernel(Bf16Kernel::portable);
  blas::sgemm(false, false, 64, 32, 48, 1, ra.data(), 48, rb.data(), 32, 0, c16.data(), 32);
  EXPECT_EQ(std::memcmp(c32.data(), c16.data(), c32.size() * sizeof(float)), 0);
}

TEST(GemmBf16, BitwiseIdenticalOverThreadsAndRuns) {
  Restore restore;
  blas::set_matmul_precision(MatmulPrecision::bf16);
  // Big enough for the 2-thread split (m*n*k >= 2^23), odd sizes, split by rows and by columns.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{257, 190, 333}, {100, 301, 400}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for_each_kernel([&](Bf16Kernel kernel) {
          // The portable kernel is the f32 engine on rounded copies, which splits by rows only
          // (bitwise the unsplit result).
          SCOPED_TRACE(::testing::Message()
                       << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb);
          auto a = values(static_cast<size_t>(m * k), 5), b = values(static_cast<size_t>(k * n), 6);
          auto c0 = values(static_cast<size_t>(m * n), 7);
          std::vector<std::vector<float>> results;
          for (int threads : {1, 2, 2, 1}) {
            set_num_threads(threads);
            std::vector<float> c = c0;
            blas::sgemm(ta, tb, m, n, k, 0.5f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.25f,
                        c.data(), n);
            results.push_back(std::move(c));
          }
          for (size_t r = 1; r < results.size(); ++r)
            EXPECT_EQ(std::memcmp(results[0].data(), results[r].data(),
                                  results[0].size() * sizeof(float)),
                      0)
                << "run " << r << " differs from run 0";
        });
}

TEST(GemmBf16, UnavailableKernelThrowsNamingIt) {
  Restore restore;
  for (Bf16Kernel k : {Bf16Kernel::amx, Bf16Kernel::avx512_bf16}) {
    const bool real = blas::bf16_kernel_available(k);
    blas::detail::hide_bf16_kernel_for_testing(k, true);
    EXPECT_FALSE(blas::bf16_kernel_available(k));
    try {
      blas::set_bf16_kernel(k);
      ADD_FAILURE() << "set_bf16_kernel(" << blas::bf16_kernel_name(k) << ") did not throw";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(blas::bf16_kernel_name(k)), std::string::npos)
          << e.what();
    }
    blas::detail::hide_bf16_kernel_for_testing(k, false);
    EXPECT_EQ(blas::bf16_kernel_available(k), real);
  }
}

TEST(GemmBf16, DefaultIsAmxOrElsePortable) {
  // avx512_bf16 is never the default: without AMX the portable kernel measured faster.
  Restore restore;
  const Bf16Kernel expect =
      blas::bf16_kernel_available(Bf16Kernel::amx) ? Bf16Kernel::amx : Bf16Kernel::portable;
  if (std::getenv("NXD_BF16_KERNEL") == nullptr) {
    EXPECT_EQ(blas::bf16_kernel(), expect);
  }
}

TEST(GemmBf16, PortableRoundingIsBitwiseFromF32AtAnyThreadCount) {
  // The portable kernel's vectorized, row-parallel rounding against bf16::from_f32 value by value:
  // A @ I returns the rounded A exactly (each C element is one product by 1 plus exact zeros).
  // Ties to even both ways, subnormals, values that round up into the next binade, signs (no
  // values that round to -0: -0 + 0 products sums to +0).
  Restore restore;
  blas::set_matmul_precision(MatmulPrecision::bf16);
  blas::set_bf16_kernel(Bf16Kernel::portable);
  const int64_t m = 300, k = 64;
  std::vector<float> a = values(static_cast<size_t>(m * k), 9);
  const uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x3fffffffu,
                               0x00012345u, 0x80018000u, 0x00000000u, 0x00008000u, 0x7f000000u};
  for (size_t i = 0; i < std::size(specials); ++i) std::memcpy(&a[i * 7], &specials[i], 4);
  std::vector<float> eye(static_cast<size_t>(k * k), 0.0f);
  for (int64_t i = 0; i < k; ++i) eye[static_cast<size_t>(i * k + i)] = 1.0f;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> c(static_cast<size_t>(m * k), kNaN);
    blas::sgemm(false, false, m, k, k, 1.0f, a.data(), k, eye.data(), k, 0.0f, c.data(), k);
    for (size_t i = 0; i < a.size(); ++i) {
      const float want = round_bf16(a[i]);
      ASSERT_EQ(std::memcmp(&c[i], &want, 4), 0)
          << "threads=" << threads << " a[" << i << "]=" << a[i] << " got " << c[i] << " want "
          << want;
    }
  }
}
