#include "nxd/runtime/kernels/flash_attention.h"

#include <atomic>
#include <cmath>
#include <limits>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/kernels/attention.h"
#include "nxd/runtime/kernels/attention_common.h"

namespace nxd::kernels {

using namespace detail;

namespace {

constexpr int64_t kBq = kFlashQueryBlock, kBk = kFlashKeyBlock;

std::atomic<FlashBackwardSchedule> g_schedule{FlashBackwardSchedule::one_pass};

// Which keys a query row sees: all (not causal), keys j <= i + Sk - Sq (causal), and with
// document positions (packed sequences) only keys j >= i - pos[b, i] too: the keys of its own
// document. pos is [B, Sq] contiguous (Sq == Sk), a row's documents contiguous, so the first key
// a row sees never decreases down the rows.
struct Mask {
  bool causal;
  const int64_t* pos = nullptr;  // null: no documents
  int64_t sq = 0;
  int64_t start(int64_t b, int64_t i) const { return pos ? i - pos[b * sq + i] : 0; }
};

// Keys [lo, hi) of block [j0, j0 + cols) that query row i of batch b sees (block-relative).
struct Span {
  int64_t lo, hi;
};
// The first key row i of batch b sees under a causal mask: its document's first, and with a
// sliding window (d.window > 0) at least p - window + 1 for its key position p.
inline int64_t first_key(const Dims& d, const Mask& m, int64_t b, int64_t i) {
  const int64_t s = m.start(b, i);
  return d.window > 0 ? std::max<int64_t>(s, i + d.sk - d.sq - d.window + 1) : s;
}
inline Span visible(const Dims& d, const Mask& m, int64_t b, int64_t i, int64_t j0, int64_t cols) {
  if (!m.causal) return {0, cols};
  const int64_t hi = std::clamp<int64_t>(i + d.sk - d.sq + 1 - j0, 0, cols);
  return {std::clamp<int64_t>(first_key(d, m, b, i) - j0, 0, hi), hi};
}

// Keys [0, end) some row of the query block [i0, i0 + rows) sees.
inline int64_t key_end(const Dims& d, bool causal, int64_t i0, int64_t rows) {
  return causal ? std::min(d.sk, i0 + rows + d.sk - d.sq) : d.sk;
}
// The first key block some row of the query block starting at i0 sees (its first row's document
// and window start first).
inline int64_t first_key_block(const Dims& d, const Mask& m, int64_t b, int64_t i0) {
  return m.causal ? std::max<int64_t>(0, first_key(d, m, b, i0)) / kBk * kBk : 0;
}

// Score entries (rows x columns of the block pairs) the forward computes: every query block
// against the keys [0, key_end) it sees, in key blocks (the last one cut at key_end). Under a
// causal mask the blocks right of the diagonal are skipped: about half of Sq x Sk at long
// sequence, (n + 1) / 2n of it for n aligned square blocks.
// With documents, the key blocks before a query block's first document are skipped too (the
// mean over the batch rows).
double forward_scores(const Dims& d, const Mask& m) {
  if (!m.causal) return double(d.sq) * double(d.sk);
  double n = 0;
  for (int64_t b = 0; b < (m.pos ? d.b : 1); ++b)
    for (int64_t i0 = 0; i0 < d.sq; i0 += kBq) {
      const int64_t rows = std::min(kBq, d.sq - i0);
      n += double(rows) * double(key_end(d, m.causal, i0, rows) - first_key_block(d, m, b, i0));
    }
  return m.pos ? n / double(d.b) : n;
}

// The first query block with a row that sees key j0.
inline int64_t first_query_block(const Dims& d, bool causal, int64_t j0) {
  return causal ? std::max<int64_t>(0, j0 - (d.sk - d.sq)) / kBq * kBq : 0;
}

// The end of the query blocks that see key block [j0, j0 + cols): with documents, the first
// query block whose first row's document starts after the block (every later row's does too).
// With a sliding window likewise the first query block whose first row's window starts after it.
inline int64_t query_end(const Dims& d, const Mask& m, int64_t b, int64_t j0, int64_t cols) {
  if (!m.causal || (!m.pos && d.window <= 0)) return d.sq;
  int64_t i0 = first_query_block(d, m.causal, j0);
  while (i0 < d.sq && first_key(d, m, b, i0) < j0 + cols) i0 += kBq;
  return i0;
}

// Score entries the backward recomputes: every key block against the query blocks from the
// first that sees it, whole blocks (with documents up to the last that sees it; the batch mean).
double backward_scores(const Dims& d, const Mask& m) {
  if (!m.causal) return double(d.sq) * double(d.sk);
  double n = 0;
  for (int64_t b = 0; b < (m.pos ? d.b : 1); ++b)
    for (int64_t j0 = 0; j0 < d.sk; j0 += kBk) {
      const int64_t cols = std::min(kBk, d.sk - j0);
      n += double(cols) * double(std::max<int64_t>(0, query_end(d, m, b, j0, cols) -
                                                          first_query_block(d, m.causal, j0)));
    }
  return m.pos ? n / double(d.b) : n;
}

// The u-th of n blocks in the order 0, n-1, 1, n-2, ...: under causal masking the work of a
// block grows (query blocks) or shrinks (key blocks) with its index, and the pool splits units
// into contiguous ranges, so this order gives every range about the same work.
inline int64_t zigzag(int64_t u, int64_t n) {
  return u % 2 == 0 ? u / 2 : n - 1 - u / 2;
}

template <class T>
struct Operands {
  Mat<T> q, k, v, o;
};

// A [kBq, kBk] block in memory from Eigen's aligned allocator: every row starts at a multiple of
// kBk elements, so Eigen's vectorized exp takes the same path on a row whatever the thread (its
// unaligned head would be computed by the scalar exp).
template <class T>
using Block = Arr<T>;

// exp(s - shift) on the entries [v.lo, v.hi) of row s, zero on the rest up to cols.
template <class T>
void exp_row(T* s, Span v, int64_t cols, T shift) {
  std::fill(s, s + v.lo, T(0));
  if (v.hi > v.lo) {
    ArrMap<T> r(s + v.lo, v.hi - v.lo);
    r = (r - shift).exp();
  }
  std::fill(s + v.hi, s + cols, T(0));
}

// One (batch, query head, query block): O and the rows' log-sum-exp, streaming key blocks.
template <class T>
void forward_block(const Dims& d, const Mask& mask, const Operands<T>& x, T* lse, int64_t b,
                   int64_t h, int64_t i0, Block<T>& s, Arr<T>& m, Arr<T>& l) {
  const int64_t g = h / d.group, rows = std::min(kBq, d.sq - i0);
  const int64_t kend = key_end(d, mask.causal, i0, rows);
  const T* qb = x.q.at(b, h) + i0 * x.q.ld;
  T* ob = x.o.at(b, h) + i0 * x.o.ld;
  for (int64_t r = 0; r < rows; ++r) std::fill(ob + r * x.o.ld, ob + r * x.o.ld + d.d, T(0));
  m.head(rows).setConstant(-std::numeric_limits<T>::infinity());
  l.head(rows).setZero();
  for (int64_t j0 = first_key_block(d, mask, b, i0); j0 < kend; j0 += kBk) {
    const int64_t cols = std::min(kBk, kend - j0);
    gemm<T>(Trans::no, Trans::yes, rows, cols, d.d, T(d.scale), qb, x.q.ld,
            x.k.at(b, g) + j0 * x.k.ld, x.k.ld, T(0), s.data(), kBk);
    for (int64_t r = 0; r < rows; ++r) {
      T* sr = s.data() + r * kBk;
      const Span v = visible(d, mask, b, i0 + r, j0, cols);
      const int64_t valid = v.hi - v.lo;
      // (a max is exact in any order: Eigen's vectorized reduction is deterministic here)
      const T mx = valid > 0 ? std::max(m[r], CArrMap<T>(sr + v.lo, valid).maxCoeff()) : m[r];
      exp_row(sr, v, cols, mx);
      if (valid == 0) continue;             // mx == m[r]: nothing to rescale
      const T alpha = std::exp(m[r] - mx);  // 0 on the first block a row sees
      l[r] = l[r] * alpha + sum_of(sr + v.lo, valid);
      m[r] = mx;
      if (alpha != T(1)) ArrMap<T>(ob + r * x.o.ld, d.d) *= alpha;
    }
    gemm<T>(Trans::no, Trans::no, rows, d.d, cols, T(1), s.data(), kBk, x.v.at(b, g) + j0 * x.v.ld,
            x.v.ld, T(1), ob, x.o.ld);
  }
  for (int64_t r = 0; r < rows; ++r) {
    // a row that sees no key (only without keys at all) gets zeros and lse -inf
    const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);
    ArrMap<T>(ob + r * x.o.ld, d.d) *= inv;
    if (lse) lse[i0 + r] = m[r] + std::log(l[r]);
  }
}

template <class T>
struct Grads {
  Mat<T> dout, dq, dk, dv;
};

// Which gradients a backward block accumulates: both (one pass per (batch, kv head)), or dK/dV
// and dQ in two passes over key blocks and query blocks.
struct Pass {
  bool dq = true, dkv = true;
};

// Scratch of one backward unit.
template <class T>
struct BwdScratch {
  Block<T> p{kBq * kBk}, ds{kBq * kBk};
};

// One query block i0 of head h against key block j0 of kv head g: recomputes P from lse and
// accumulates dV[j] and dK[j] (pass.dkv) and dQ[i] (pass.dq). lse and delta point at head h's
// rows.
template <class T>
void backward_block(const Dims& d, const Mask& mask, const Operands<T>& x, const Grads<T>& y,
                    const T* lse, const T* delta, int64_t b, int64_t h, int64_t i0, int64_t j0,
                    Pass pass, BwdScratch<T>& w) {
  const int64_t g = h / d.group, rows = std::min(kBq, d.sq - i0), cols = std::min(kBk, d.sk - j0);
  const T* qb = x.q.at(b, h) + i0 * x.q.ld;
  const T* gb = y.dout.at(b, h) + i0 * y.dout.ld;
  const T* kb = x.k.at(b, g) + j0 * x.k.ld;
  const T* vb = x.v.at(b, g) + j0 * x.v.ld;
  T* p = w.p.data();
  T* ds = w.ds.data();
  gemm<T>(Trans::no, Trans::yes, rows, cols, d.d, T(d.scale), qb, x.q.ld, kb, x.k.ld, T(0), p, kBk);
  for (int64_t r = 0; r < rows; ++r)
    exp_row(p + r * kBk, visible(d, mask, b, i0 + r, j0, cols), cols, lse[i0 + r]);
  // dV[j] += P^T dO ; dP = dO V^T
  if (pass.dkv)
    gemm<T>(Trans::yes, Trans::no, cols, d.d, rows, T(1), p, kBk, gb, y.dout.ld, T(1),
            y.dv.at(b, g) + j0 * y.dv.ld, y.dv.ld);
  gemm<T>(Trans::no, Trans::yes, rows, cols, d.d, T(1), gb, y.dout.ld, vb, x.v.ld, T(0), ds, kBk);
  // dS = P * (dP - D), zero where masked (P is)
  for (int64_t r = 0; r < rows; ++r) {
    ArrMap<T> dsr(ds + r * kBk, cols);
    dsr = CArrMap<T>(p + r * kBk, cols) * (dsr - delta[i0 + r]);
  }
  // dQ[i] += scale dS K ; dK[j] += scale dS^T Q
  if (pass.dq)
    gemm<T>(Trans::no, Trans::no, rows, d.d, cols, T(d.scale), ds, kBk, kb, x.k.ld, T(1),
            y.dq.at(b, h) + i0 * y.dq.ld, y.dq.ld);
  if (pass.dkv)
    gemm<T>(Trans::yes, Trans::no, cols, d.d, rows, T(d.scale), ds, kBk, qb, x.q.ld, T(1),
            y.dk.at(b, g) + j0 * y.dk.ld, y.dk.ld);
}

template <class T>
void zero_rows(const Dims& d, const Mat<T>& m, int64_t b, int64_t h, int64_t r0, int64_t n) {
  for (int64_t i = r0; i < r0 + n; ++i) std::fill_n(m.at(b, h) + i * m.ld, d.d, T(0));
}

// Key block j0 of (b, g) against every query head of the group in order and every query block
// that sees it, in order. Zeroes dK/dV of the block first when it accumulates them.
template <class T>
void backward_key_block(const Dims& d, const Mask& mask, const Operands<T>& x, const Grads<T>& y,
                        const T* lse, const T* delta, int64_t b, int64_t g, int64_t j0, Pass pass,
                        BwdScratch<T>& w) {
  const int64_t cols = std::min(kBk, d.sk - j0);
  if (pass.dkv) {
    zero_rows(d, y.dk, b, g, j0, cols);
    zero_rows(d, y.dv, b, g, j0, cols);
  }
  const int64_t first = first_query_block(d, mask.causal, j0);
  const int64_t end = query_end(d, mask, b, j0, cols);
  for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h) {
    const int64_t row0 = (b * d.hq + h) * d.sq;
    for (int64_t i0 = first; i0 < end; i0 += kBq)
      backward_block<T>(d, mask, x, y, lse + row0, delta + row0, b, h, i0, j0, pass, w);
  }
}

// Query block i0 of (b, h), dQ only: the key blocks it sees in order, as the one-pass unit adds
// them (so both schedules give bitwise the same dQ).
template <class T>
void backward_query_block(const Dims& d, const Mask& mask, const Operands<T>& x, const Grads<T>& y,
                          const T* lse, const T* delta, int64_t b, int64_t h, int64_t i0,
                          BwdScratch<T>& w) {
  const int64_t rows = std::min(kBq, d.sq - i0), kend = key_end(d, mask.causal, i0, rows);
  const int64_t row0 = (b * d.hq + h) * d.sq;
  zero_rows(d, y.dq, b, h, i0, rows);
  for (int64_t j0 = first_key_block(d, mask, b, i0); j0 < kend; j0 += kBk)
    backward_block<T>(d, mask, x, y, lse + row0, delta + row0, b, h, i0, j0,
                      Pass{.dq = true, .dkv = false}, w);
}

// delta = rowsum(dO * O) for every query row, [B, Hq, Sq].
template <class T>
void row_deltas(const Dims& d, const Operands<T>& x, const Grads<T>& y, T* delta) {
  for_units<T>(d.b * d.hq, 2.0 * d.sq * d.d, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u)
      for (int64_t i = 0; i < d.sq; ++i) {
        const int64_t b = u / d.hq, h = u % d.hq;
        CArrMap<T> go(y.dout.at(b, h) + i * y.dout.ld, d.d), o(x.o.at(b, h) + i * x.o.ld, d.d);
        delta[u * d.sq + i] = (go * o).sum();
      }
  });
}

// The backward (see FlashBackwardSchedule): one pass with a unit per (batch, kv head), or two
// passes, dK/dV per (batch, kv head, key block) and dQ per (batch, query head, query block).
template <class T>
void backward_all(const Dims& d, const Mask& mask, const Operands<T>& x, const Grads<T>& y,
                  const T* lse) {
  Arr<T> delta(d.b * d.hq * d.sq);
  row_deltas<T>(d, x, y, delta.data());
  const int64_t nq = (d.sq + kBq - 1) / kBq, nk = (d.sk + kBk - 1) / kBk;
  const double block = 2.0 * kBq * kBk * d.d;
  const bool one_pass =
      g_schedule.load(std::memory_order_relaxed) == FlashBackwardSchedule::one_pass;
  if (one_pass) {
    for_units<T>(d.b * d.hkv, 5 * block * d.group * nq * nk, [&](int64_t u0, int64_t u1) {
      BwdScratch<T> w;
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t b = u / d.hkv, g = u % d.hkv;
        for (int64_t h = g * d.group; h < (g + 1) * d.group; ++h) zero_rows(d, y.dq, b, h, 0, d.sq);
        for (int64_t j0 = 0; j0 < d.sk; j0 += kBk)
          backward_key_block<T>(d, mask, x, y, lse, delta.data(), b, g, j0, Pass{}, w);
      }
    });
    return;
  }
  for_units<T>(d.b * d.hkv * nk, 4 * block * d.group * nq, [&](int64_t u0, int64_t u1) {
    BwdScratch<T> w;
    for (int64_t u = u0; u < u1; ++u)
      backward_key_block<T>(d, mask, x, y, lse, delta.data(), u / nk / d.hkv, u / nk % d.hkv,
                            zigzag(u % nk, nk) * kBk, Pass{.dq = false, .dkv = true}, w);
  });
  for_units<T>(d.b * d.hq * nq, 3 * block * nk, [&](int64_t u0, int64_t u1) {
    BwdScratch<T> w;
    for (int64_t u = u0; u < u1; ++u)
      backward_query_block<T>(d, mask, x, y, lse, delta.data(), u / nq / d.hq, u / nq % d.hq,
                              zigzag(u % nq, nq) * kBq, w);
  });
}

// A [B, S] i64 document positions tensor checked against q (S == Sq == Sk), as contiguous i64.
Tensor checked_positions(const char* op, const Tensor& positions, const Dims& d) {
  NXD_CHECK_SHAPE(
      positions.dim() == 2 && positions.size(0) == d.b && positions.size(1) == d.sq && d.sq == d.sk,
      "[", op, "] positions must be [B, S] with S the query and key length: got ", positions.desc(),
      " for B=", d.b, " Sq=", d.sq, " Sk=", d.sk);
  NXD_CHECK(positions.dtype() == DType::i64 || positions.dtype() == DType::i32, "[", op,
            "] positions must be i32 or i64, got ", positions.desc());
  if (positions.is_meta()) return positions;
  Tensor p = positions.detach().to(DType::i64).contiguous();
  const int64_t* pp = p.data<int64_t>();
  for (int64_t b = 0; b < d.b; ++b)
    for (int64_t i = 0; i < d.sq; ++i) {
      const int64_t v = pp[b * d.sq + i], prev = i == 0 ? -1 : pp[b * d.sq + i - 1];
      NXD_CHECK(v == 0 || v == prev + 1, "[", op, "] positions[", b, ", ", i, "] = ", v,
                ": a position is 0 (a document starts) or the previous one + 1 (", prev, ")");
    }
  return p;
}

void forward_impl(const char* op, const Tensor& out, const Tensor& lse, const Tensor& q,
                  const Tensor& k, const Tensor& v, const Dims& d, const Mask& mask) {
  check_out4(op, "out", out, q.shape(), q.dtype());
  if (lse.defined()) {
    Shape ls{d.b, d.hq, d.sq};
    NXD_CHECK_SHAPE(lse.shape() == ls && lse.dtype() == q.dtype(), "[", op, "] lse is ", lse.desc(),
                    ", expected ", dtype_name(q.dtype()), shape_str(ls));
    NXD_CHECK(lse.is_meta() || lse.is_contiguous(), "[", op, "] lse must be contiguous, got ",
              lse.desc());
  }
  // the flops of the score blocks the kernel visits (two products, the exponentials and the
  // online rescaling per score; a causal mask skips the blocks above the diagonal, documents the
  // blocks before them) and the rows' normalization; HBM traffic is q, k, v, out and lse (the
  // scores stay on chip)
  const double bh = double(d.b * d.hq), scores = forward_scores(d, mask);
  const DType priced = AttentionPricing::dtype(q.dtype());
  charge_compute(op, bh * (scores * (4.0 * d.d + 6.0) + 2.0 * d.sq * d.d),
                 double(dtype_size(priced)) * (2.0 * q.numel() + 2.0 * k.numel() + bh * d.sq),
                 blas::matmul_compute_dtype(priced));
  if (meta_only(op, out, {q, k, v, lse}) || out.numel() == 0) return;
  Tensor qc = gemm_input(q), kc = gemm_input(k), vc = gemm_input(v);
  const int64_t nblk = (d.sq + kBq - 1) / kBq;
  dispatch_float(op, q, [&]<class T>() {
    Operands<T> x{mat<T>(qc), mat<T>(kc), mat<T>(vc), mat<T>(out)};
    T* lse_p = lse.defined() ? lse.data<T>() : nullptr;
    const double cost = 4.0 * std::min(kBq, d.sq) * d.sk * d.d;
    for_units<T>(d.b * d.hq * nblk, cost, [&](int64_t u0, int64_t u1) {
      Block<T> s(kBq * kBk);
      Arr<T> m(kBq), l(kBq);
      for (int64_t u = u0; u < u1; ++u) {
        const int64_t bh_u = u / nblk, i0 = zigzag(u % nblk, nblk) * kBq;
        forward_block<T>(d, mask, x, lse_p ? lse_p + bh_u * d.sq : nullptr, bh_u / d.hq,
                         bh_u % d.hq, i0, s, m, l);
      }
    });
  });
}

void backward_impl(const char* op, const BackwardOperands& a, const Dims& d, const Mask& mask) {
  check_backward(op, a);
  // five block products (the recomputed scores, dV, dP, dQ, dK) and the exponentials and dS per
  // score of the blocks the kernel visits (a causal mask skips those above the diagonal,
  // documents those outside them), and rowsum(dO * O); HBM traffic is the operands, their
  // gradients and lse
  const double bh = double(d.b * d.hq), scores = backward_scores(d, mask);
  const DType priced = AttentionPricing::dtype(a.q.dtype());
  charge_compute(op, bh * (scores * (10.0 * d.d + 8.0) + 2.0 * d.sq * d.d),
                 double(dtype_size(priced)) * (5.0 * a.q.numel() + 4.0 * a.k.numel() + bh * d.sq),
                 blas::matmul_compute_dtype(priced));
  if (meta_only(op, a.dq, {a.dout, a.q, a.k, a.v, a.out, a.saved})) return;
  if (a.dq.numel() == 0 || a.dk.numel() == 0) {
    a.dq.zero_();
    a.dk.zero_();
    a.dv.zero_();
    return;
  }
  Tensor qc = gemm_input(a.q), kc = gemm_input(a.k), vc = gemm_input(a.v), oc = gemm_input(a.out),
         gc = gemm_input(a.dout), lc = in(a.saved);
  dispatch_float(op, a.q, [&]<class T>() {
    Operands<T> x{mat<T>(qc), mat<T>(kc), mat<T>(vc), mat<T>(oc)};
    Grads<T> y{mat<T>(gc), mat<T>(a.dq), mat<T>(a.dk), mat<T>(a.dv)};
    backward_all<T>(d, mask, x, y, lc.data<T>());
  });
}

Mask document_mask(const Tensor& p, const Dims& d) {
  return {.causal = true, .pos = p.is_meta() ? nullptr : p.data<int64_t>(), .sq = d.sq};
}

}  // namespace

void set_flash_backward_schedule(FlashBackwardSchedule s) {
  g_schedule.store(s, std::memory_order_relaxed);
}
FlashBackwardSchedule flash_backward_schedule() {
  return g_schedule.load(std::memory_order_relaxed);
}

void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                             const Tensor& v, bool causal, double scale, int64_t window) {
  const char* op = "flash_attention_forward";
  Dims d = check_attention(op, q, k, v, causal, scale);
  d.window = check_window(op, causal, window);
  forward_impl(op, out, lse, q, k, v, d, Mask{.causal = causal});
}

void flash_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                              const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, bool causal, double scale,
                              int64_t window) {
  const char* op = "flash_attention_backward";
  Dims d = check_attention(op, q, k, v, causal, scale);
  d.window = check_window(op, causal, window);
  backward_impl(op, {dq, dk, dv, dout, q, k, v, out, lse, "lse", {d.b, d.hq, d.sq}}, d,
                Mask{.causal = causal});
}

void flash_document_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                                      const Tensor& k, const Tensor& v, const Tensor& positions,
                                      double scale) {
  const char* op = "flash_document_attention_forward";
  const Dims d = check_attention(op, q, k, v, /*causal=*/true, scale);
  const Tensor p = checked_positions(op, positions, d);
  forward_impl(op, out, lse, q, k, v, d, document_mask(p, d));
}

void flash_document_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                       const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       const Tensor& positions, double scale) {
  const char* op = "flash_document_attention_backward";
  const Dims d = check_attention(op, q, k, v, /*causal=*/true, scale);
  const Tensor p = checked_positions(op, positions, d);
  backward_impl(op, {dq, dk, dv, dout, q, k, v, out, lse, "lse", {d.b, d.hq, d.sq}}, d,
                document_mask(p, d));
}

}  // namespace nxd::kernels
