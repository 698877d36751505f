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

// buf with room for at least `floats` (grown, never shrunk: kept for the thread's next product).
float* grow(Floats& buf, Index floats) {
  if (buf.size() < static_cast<size_t>(floats)) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

// The product in Eigen's column-major terms: res[n, m] = lhs[n, k] @ rhs[k, m], where lhs is
// op(B)ᵀ and rhs is op(A)ᵀ, with Eigen's own packing routines and kernel.
template <int LhsOrder, int RhsOrder>
struct EigenSplit {
  using LhsMapper = ei::const_blas_data_mapper<float, Index, LhsOrder>;
  using RhsMapper = ei::const_blas_data_mapper<float, Index, RhsOrder>;
  using ResMapper = ei::blas_data_mapper<float, Index, Eigen::ColMajor, Eigen::Unaligned, 1>;
  using PackLhs = ei::gemm_pack_lhs<float, Index, LhsMapper, Traits::mr, Traits::LhsProgress,
                                    typename Traits::LhsPacket4Packing, LhsOrder>;
  using PackRhs = ei::gemm_pack_rhs<float, Index, RhsMapper, Traits::nr, RhsOrder>;
  using Kernel =
      ei::gebp_kernel<float, float, Index, ResMapper, Traits::mr, Traits::nr, false, false>;

  // One product: C = alpha * res + beta * C, res = lhs @ rhs in Eigen's terms.
  struct Product {
    Index m, n, k;
    float alpha, beta;
    LhsMapper lhs;
    RhsMapper rhs;
    ResMapper res;
    float* c;
    Index ldc;
  };

  static void run(Index m, Index n, Index k, float alpha, const float* a, Index lda, const float* b,
                  Index ldb, float beta, float* c, Index ldc, const EigenSplitOptions& o) {
    const Product pr{m, n,  k, alpha, beta, LhsMapper(b, ldb), RhsMapper(a, lda), ResMapper(c, ldc),
                     c, ldc};
    if (o.by == SplitBy::columns)
      by_columns(pr, o);
    else
      by_rows(pr, o);
  }

  // Part p computes C's columns in its share of op(B)'s panels, for all rows, as Eigen's
  // sequential product does: per K block, pack its columns of op(B), then all of op(A) in blocks
  // of nc rows, and run the kernel. Nothing is shared, so there is one fork and join per call.
  static void by_columns(const Product& pr, const EigenSplitOptions& o) {
    const auto& [m, n, k, alpha, beta, lhs, rhs, res, c, ldc] = pr;
    const int parts = o.parts;
    const Blocking blocking = eigen_blocking(m, n, k);
    const Index kc = blocking.kc, mr = Traits::mr;
    const Index nc = std::max<Index>(Traits::nr, blocking.nc / Traits::nr * Traits::nr);
    const Index piece = ((n + mr - 1) / mr + parts - 1) / parts * mr;
    const Index chunk = std::max<Index>(mr, o.max_packed_floats / parts / kc / mr * mr);
    parallel::run(parts, [&](int p) {
      const Index i0 = p * piece, i1 = std::min(n, i0 + piece);
      if (i0 >= i1) return;
      scale(c + i0, m, i1 - i0, ldc, beta);
      thread_local Floats packed_lhs, packed_rhs;
      float* const block_a = grow(packed_lhs, std::min(chunk, i1 - i0) * kc);
      float* const block_b = grow(packed_rhs, kc * nc);
      PackLhs pack_lhs;
      PackRhs pack_rhs;
      Kernel gebp;
      for (Index i2 = i0; i2 < i1; i2 += chunk) {
        const Index rows = std::min(chunk, i1 - i2);
        for (Index k2 = 0; k2 < k; k2 += kc) {
          const Index akc = std::min(k2 + kc, k) - k2;
          pack_lhs(block_a, lhs.getSubMapper(i2, k2), akc, rows);
          for (Index j2 = 0; j2 < m; j2 += nc) {
            const Index anc = std::min(j2 + nc, m) - j2;
            pack_rhs(block_b, rhs.getSubMapper(k2, j2), akc, anc);
            gebp(res.getSubMapper(i2, j2), block_a, block_b, rows, akc, anc, alpha);
          }
        }
      }
    });
  }

  // By rows of C, op(B) packed once and shared: all parts pack its panels, then each part runs
  // its rows against all of them.
  static void by_rows(const Product& pr, const EigenSplitOptions& o) {
    const auto& [m, n, k, alpha, beta, lhs, rhs, res, c, ldc] = pr;
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
    float* const block_a = grow(packed, block_stride * k_blocks);

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
        float* const block_b = grow(packed_rhs, kc * nc);
        PackRhs pack;
        Kernel gebp;
        for (Index kb = 0; kb < k_blocks; ++kb) {
          const Index k2 = kb * kc, akc = std::min(k2 + kc, k) - k2;
          for (Index j2 = j0; j2 < j1; j2 += nc) {
            const Index anc = std::min(j2 + nc, j1) - j2;
            pack(block_b, rhs.getSubMapper(k2, j2), akc, anc);
            gebp(res.getSubMapper(i0, j2), block_a + kb * block_stride, block_b, rows, akc, anc,
                 alpha);
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

const int64_t kEigenMr = Traits::mr;

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

void sgemm_eigen_split(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                       float* c, int64_t ldc, const EigenSplitOptions& o) {
  const bool rows = o.by == SplitBy::rows;
  NXD_CHECK(
      o.parts >= 1 && m >= kRowBlock * (rows ? o.parts : 1) && n >= 2 && k >= 1 &&
          m + n + k >= 20 && o.max_packed_floats >= 1,
      "[blas::sgemm_eigen_split] needs m >= 16 (by rows: 16 * parts), n >= 2, k >= 1, m + n + "
      "k >= 20; got m=",
      m, " n=", n, " k=", k, " parts=", o.parts, " by=", rows ? "rows" : "columns",
      " max_packed_floats=", o.max_packed_floats);
  // Eigen's lhs is op(B)ᵀ [n, k]: row-major over B [n, k] when tb, else column-major over B
  // [k, n]. Its rhs is op(A)ᵀ [k, m]: column-major over A [m, k], or row-major over A [k, m] when
  // ta. The result is Cᵀ, column-major [n, m] over C.
  constexpr int R = Eigen::RowMajor, C = Eigen::ColMajor;
  if (!ta && !tb)
    EigenSplit<C, C>::run(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, o);
  else if (!ta && tb)
    EigenSplit<R, C>::run(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, o);
  else if (ta && !tb)
    EigenSplit<C, R>::run(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, o);
  else
    EigenSplit<R, R>::run(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, o);
}

}  // namespace nxd::blas::detail
