#include "nxd/runtime/gemm_f32.h"

#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "nxd/runtime/error.h"
#include "nxd/runtime/parallel.h"

namespace nxd::blas::detail {

namespace {

namespace ei = Eigen::internal;
using Index = Eigen::Index;
using Traits = ei::gebp_traits<float, float>;
using Floats = std::vector<float, Eigen::aligned_allocator<float>>;

// Row parts of C start at multiples of 16, so each keeps Eigen's groups of nr rows.
constexpr int64_t kRowBlock = 16;
static_assert(kRowBlock % Traits::nr == 0, "row parts must keep Eigen's groups of nr rows");
// Each K block of the packed op(B) starts on a 64-byte boundary (Eigen packs with aligned stores).
constexpr Index kAlignFloats = 16;

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMat, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class A, class B>
void eigen_product(Map& c, const A& a, const B& b, float alpha, float beta) {
  if (beta == 0.0f) {
    c.noalias() = alpha * (a * b);
  } else {
    if (beta != 1.0f) c *= beta;
    c.noalias() += alpha * (a * b);
  }
}

// Eigen's blocking for this product (computeProductBlockingSizes, as Eigen's own product calls it
// with rows n and columns m of the transposed product). Its kc depends on k and the cache sizes
// only, never on m or n, so every part and chunk blocks K the same way; nc (columns of the
// transposed product per packed block of op(A)) only sets how often a part repacks.
struct Blocking {
  Index kc, nc;
};
Blocking eigen_blocking(Index m, Index n, Index k) {
  Index kc = k, mc = n, nc = m;
  ei::computeProductBlockingSizes<float, float, 1, Index>(kc, mc, nc, 1);
  return {kc, nc};
}

// The product in Eigen's column-major terms: res[n, m] = lhs[n, k] @ rhs[k, m], where lhs is
// op(B)ᵀ and rhs is op(A)ᵀ, with Eigen's own packing routines and kernel.
template <int LhsOrder, int RhsOrder>
struct SharedPack {
  using LhsMapper = ei::const_blas_data_mapper<float, Index, LhsOrder>;
  using RhsMapper = ei::const_blas_data_mapper<float, Index, RhsOrder>;
  using ResMapper = ei::blas_data_mapper<float, Index, Eigen::ColMajor, Eigen::Unaligned, 1>;
  using PackLhs = ei::gemm_pack_lhs<float, Index, LhsMapper, Traits::mr, Traits::LhsProgress,
                                    typename Traits::LhsPacket4Packing, LhsOrder>;
  using PackRhs = ei::gemm_pack_rhs<float, Index, RhsMapper, Traits::nr, RhsOrder>;
  using Kernel =
      ei::gebp_kernel<float, float, Index, ResMapper, Traits::mr, Traits::nr, false, false>;

  static void run(Index m, Index n, Index k, float alpha, const float* a, Index lda, const float* b,
                  Index ldb, float beta, float* c, Index ldc, const SharedPackOptions& o) {
    const LhsMapper lhs(b, ldb);
    const RhsMapper rhs(a, lda);
    const ResMapper res(c, ldc);
    const int parts = o.parts;
    const Index row_block = m / parts / kRowBlock * kRowBlock;
    const Index kc = eigen_blocking(m, n, k).kc;
    const Index k_blocks = (k + kc - 1) / kc;
    // Columns of C (rows of lhs) per chunk: whole panels of mr, at most max_packed_floats packed.
    const Index mr = Traits::mr;
    Index chunk = std::max<Index>(mr, o.max_packed_floats / k / mr * mr);
    const Index chunks = (n + chunk - 1) / chunk;
    chunk = ((n + chunks - 1) / chunks + mr - 1) / mr * mr;
    const Index block_stride =
        (std::min(chunk, n) * kc + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    thread_local Floats packed;  // owned by the calling thread, read by every part
    if (packed.size() < static_cast<size_t>(block_stride * k_blocks))
      packed.resize(static_cast<size_t>(block_stride * k_blocks));
    float* const block_a = packed.data();

    for (Index i0 = 0; i0 < n; i0 += chunk) {
      const Index rows = std::min(chunk, n - i0);
      // 1. Pack op(B)'s columns [i0, i0 + rows) for every K block, in pieces of whole panels.
      const Index panels = (rows + mr - 1) / mr;
      const Index piece = (panels + parts - 1) / parts * mr;
      parallel::run(parts, [&](int p) {
        const Index r0 = p * piece, r1 = std::min(rows, r0 + piece);
        if (r0 >= r1) return;
        PackLhs pack;
        for (Index kb = 0; kb < k_blocks; ++kb) {
          const Index k2 = kb * kc, akc = std::min(k2 + kc, k) - k2;
          pack(block_a + kb * block_stride + r0 * akc, lhs.getSubMapper(i0 + r0, k2), akc, r1 - r0);
        }
      });
      // 2. Each part: its rows of C (columns of res) against the shared packed op(B).
      parallel::run(parts, [&](int p) {
        const Index j0 = p * row_block, j1 = p == parts - 1 ? m : j0 + row_block;
        scale(c + j0 * ldc + i0, j1 - j0, rows, ldc, beta);
        const Index nc =
            std::max<Index>(Traits::nr, eigen_blocking(j1 - j0, n, k).nc / Traits::nr * Traits::nr);
        thread_local Floats packed_rhs;
        if (packed_rhs.size() < static_cast<size_t>(kc * nc))
          packed_rhs.resize(static_cast<size_t>(kc * nc));
        PackRhs pack;
        Kernel gebp;
        for (Index kb = 0; kb < k_blocks; ++kb) {
          const Index k2 = kb * kc, akc = std::min(k2 + kc, k) - k2;
          for (Index j2 = j0; j2 < j1; j2 += nc) {
            const Index anc = std::min(j2 + nc, j1) - j2;
            pack(packed_rhs.data(), rhs.getSubMapper(k2, j2), akc, anc);
            gebp(res.getSubMapper(i0, j2), block_a + kb * block_stride, packed_rhs.data(), rows,
                 akc, anc, alpha);
          }
        }
      });
    }
  }

  // C's block [rows x cols] (ldc apart) times beta, as Eigen's product does first: zero for
  // beta == 0 (whatever C held, NaN included), unchanged for 1.
  static void scale(float* c, Index rows, Index cols, Index ldc, float beta) {
    if (beta == 1.0f) return;
    for (Index r = 0; r < rows; ++r) {
      float* cr = c + r * ldc;
      if (beta == 0.0f)
        std::fill(cr, cr + cols, 0.0f);
      else
        for (Index j = 0; j < cols; ++j) cr[j] *= beta;
    }
  }
};

}  // namespace

void sgemm_eigen(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  Map cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (beta == 0.0f)
      cm.setZero();
    else
      cm *= beta;
    return;
  }
  ConstMap am(a, ta ? k : m, ta ? m : k, Eigen::OuterStride<>(lda));
  ConstMap bm(b, tb ? n : k, tb ? k : n, Eigen::OuterStride<>(ldb));
  if (!ta && !tb)
    eigen_product(cm, am, bm, alpha, beta);
  else if (!ta && tb)
    eigen_product(cm, am, bm.transpose(), alpha, beta);
  else if (ta && !tb)
    eigen_product(cm, am.transpose(), bm, alpha, beta);
  else
    eigen_product(cm, am.transpose(), bm.transpose(), alpha, beta);
}

void sgemm_eigen_shared_pack(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                             const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                             float* c, int64_t ldc, const SharedPackOptions& o) {
  NXD_CHECK(o.parts >= 1 && m >= kRowBlock * o.parts && n >= 2 && k >= 1 && m + n + k >= 20 &&
                o.max_packed_floats >= 1,
            "[blas::sgemm_eigen_shared_pack] needs m >= 16 * parts, n >= 2, k >= 1, m + n + k >= "
            "20; got m=",
            m, " n=", n, " k=", k, " parts=", o.parts, " max_packed_floats=", o.max_packed_floats);
  // Eigen's lhs is op(B)ᵀ [n, k]: row-major over B [n, k] when tb, else column-major over B
  // [k, n]. Its rhs is op(A)ᵀ [k, m]: column-major over A [m, k], or row-major over A [k, m] when
  // ta. The result is Cᵀ, column-major [n, m] over C.
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  if (!ta && !tb)
    SharedPack<C, C>::run(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, o);
  else if (!ta && tb)
    SharedPack<R, C>::run(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, o);
  else if (ta && !tb)
    SharedPack<C, R>::run(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, o);
  else
    SharedPack<R, R>::run(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, o);
}

}  // namespace nxd::blas::detail
