#include "nxd/runtime/kernels/kv_cache.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "nxd/runtime/kernels/common.h"
#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels {

using namespace detail;

namespace {

std::atomic<int64_t> g_bytes_written{0}, g_writes{0}, g_bytes_read{0};

// Checks the per-row index tensors [B] against the batch B (values only on the host).
void check_rows(const char* op, const Tensor& t, const char* what, int64_t B) {
  NXD_CHECK(t.defined(), "[", op, "] ", what, " is undefined");
  NXD_CHECK_SHAPE(t.dtype() == DType::i64 && t.dim() == 1 && t.size(0) == B, "[", op, "] ", what,
                  " must be i64 [", B, "], got ", t.desc());
}

struct Rows {
  const int64_t *seq = nullptr, *start = nullptr, *len = nullptr;
};

// Validates seq_ids/start/lengths for B rows of S tokens against a cache [Bmax, *, L, *]; the
// values are read unless `meta`.
Rows check_step(const char* op, const Tensor& seq_ids, const Tensor& start, const Tensor& lengths,
                int64_t B, int64_t S, int64_t Bmax, int64_t L, bool meta) {
  check_rows(op, seq_ids, "seq_ids", B);
  check_rows(op, start, "start", B);
  check_rows(op, lengths, "lengths", B);
  if (meta) return {};
  for (const Tensor* t : {&seq_ids, &start, &lengths})
    NXD_CHECK(!t->is_meta() && t->is_contiguous(), "[", op,
              "] row indices must be contiguous host "
              "tensors for a host computation, got ",
              t->desc());
  Rows r{seq_ids.data<int64_t>(), start.data<int64_t>(), lengths.data<int64_t>()};
  for (int64_t b = 0; b < B; ++b) {
    NXD_CHECK(r.seq[b] >= 0 && r.seq[b] < Bmax, "[", op, "] seq_ids[", b, "]=", r.seq[b],
              " outside the cache's ", Bmax, " rows");
    for (int64_t c = 0; c < b; ++c)
      NXD_CHECK(r.seq[c] != r.seq[b], "[", op, "] seq_ids[", c, "] and seq_ids[", b,
                "] both name cache row ", r.seq[b]);
    NXD_CHECK(r.len[b] >= 1 && r.len[b] <= S, "[", op, "] lengths[", b, "]=", r.len[b],
              " must be in [1, S=", S, "]");
    NXD_CHECK(r.start[b] >= 0 && r.start[b] + r.len[b] <= L, "[", op, "] row ", b,
              " writes positions [", r.start[b], ", ", r.start[b] + r.len[b],
              ") outside the cache length ", L);
  }
  return r;
}

void check_cache(const char* op, const Tensor& c, const char* what) {
  NXD_CHECK(c.defined(), "[", op, "] ", what, " is undefined");
  NXD_CHECK_SHAPE(c.dim() == 4, "[", op, "] ", what, " must be [Bmax, H, L, D], got ", c.desc());
  NXD_CHECK(c.is_meta() || c.is_contiguous(), "[", op, "] ", what, " must be contiguous, got ",
            c.desc());
}

inline float load(float x) {
  return x;
}
inline double load(double x) {
  return x;
}
inline float load(bf16 x) {
  return bf16::to_f32(x.bits);
}

// Thread-local scratch that only grows (no allocation once warm).
template <class T>
T* scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Softmax in place over the keys [first, visible) of one row of scores sr[0, n), zeros elsewhere.
template <class T>
void masked_softmax_row(T* sr, int64_t n, int64_t first, int64_t visible) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t k = first; k < visible; ++k) mx = std::max(mx, sr[k]);
  T z = 0;
  for (int64_t k = first; k < visible; ++k) z += sr[k] = std::exp(sr[k] - mx);
  const T inv = T(1) / z;
  for (int64_t k = first; k < visible; ++k) sr[k] *= inv;
  for (int64_t k = 0; k < first; ++k) sr[k] = 0;
  for (int64_t k = visible; k < n; ++k) sr[k] = 0;
}

// The queries of a prefill chunk (len > 1) go through attention in blocks of this many positions.
constexpr int64_t kQueryBlock = 64;

// One (b, kv head) item of cached attention: the g query heads reading kv head `kh` and their
// `len` rows against the n = st + len keys of the row (kc, vc: [n, D], as T).
// One row (decode): the g heads' scores as one GEMM, then each head's weighted sum of the values.
// More rows (a prefill chunk): blocks of kQueryBlock positions, each block's g x block queries
// against the keys up to its last position only (the keys after it are masked for the whole
// block), scores and output as two GEMMs. A row's result depends on its position, len and st
// only: not on the other rows of the call.
template <class T>
void attend_rows(const Tensor& out, const Tensor& q, const T* kp, const T* vp, int64_t b,
                 int64_t kh, int64_t g, int64_t D, int64_t st, int64_t len, T scale,
                 int64_t window) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const T* qsrc = q.data<T>();
  T* op = out.data<T>();
  auto q_row = [&](int64_t j, int64_t s) {
    return qsrc + b * q.stride(0) + (kh * g + j) * q.stride(1) + s * q.stride(2);
  };
  auto out_row = [&](int64_t j, int64_t s) {
    return op + b * out.stride(0) + (kh * g + j) * out.stride(1) + s * out.stride(2);
  };
  thread_local std::vector<T> qbuf, sbuf, obuf;
  if (len == 1) {
    const int64_t n = st + 1, first = window > 0 ? std::max<int64_t>(0, n - window) : 0;
    T* qp = scratch(qbuf, g * D);
    T* sp = scratch(sbuf, g * n);
    for (int64_t j = 0; j < g; ++j) std::memcpy(qp + j * D, q_row(j, 0), sizeof(T) * D);
    Eigen::Map<const Mat> Q(qp, g, D), K(kp, n, D), V(vp, n, D);
    Eigen::Map<Mat> Sm(sp, g, n);
    Sm.noalias() = (Q * K.transpose()) * scale;
    for (int64_t j = 0; j < g; ++j) {
      T* sr = sp + j * n;
      masked_softmax_row(sr, n, first, n);
      Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>> O(out_row(j, 0), D);
      O.noalias() = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(sr, n) * V;
    }
    return;
  }
  for (int64_t s0 = 0; s0 < len; s0 += kQueryBlock) {
    const int64_t bl = std::min(kQueryBlock, len - s0), rows = g * bl;
    // the keys the block reads: from its first query's window start to its last query
    const int64_t k0 = window > 0 ? std::max<int64_t>(0, st + s0 + 1 - window) : 0;
    const int64_t nk = st + s0 + bl - k0;
    T* qp = scratch(qbuf, rows * D);
    T* sp = scratch(sbuf, rows * nk);
    T* opb = scratch(obuf, rows * D);
    for (int64_t j = 0; j < g; ++j)
      for (int64_t s = 0; s < bl; ++s)
        std::memcpy(qp + (j * bl + s) * D, q_row(j, s0 + s), sizeof(T) * D);
    Eigen::Map<const Mat> Q(qp, rows, D), K(kp + k0 * D, nk, D), V(vp + k0 * D, nk, D);
    Eigen::Map<Mat> Sm(sp, rows, nk), O(opb, rows, D);
    Sm.noalias() = (Q * K.transpose()) * scale;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t visible = st + s0 + r % bl + 1;  // keys [0, visible) before the window
      const int64_t first = window > 0 ? std::max<int64_t>(0, visible - window) : 0;
      masked_softmax_row(sp + r * nk, nk, first - k0, visible - k0);
    }
    O.noalias() = Sm * V;
    for (int64_t j = 0; j < g; ++j)
      for (int64_t s = 0; s < bl; ++s)
        std::memcpy(out_row(j, s0 + s), opb + (j * bl + s) * D, sizeof(T) * D);
  }
}

// attend_rows over keys and values of the cache's element type C (bf16: loaded into f32 rows).
template <class T, class C>
void attend_group(const Tensor& out, const Tensor& q, const C* kc, const C* vc, int64_t b,
                  int64_t kh, int64_t g, int64_t D, int64_t st, int64_t len, T scale,
                  int64_t window) {
  if constexpr (std::is_same_v<C, T>) {
    attend_rows<T>(out, q, kc, vc, b, kh, g, D, st, len, scale, window);
  } else {
    thread_local std::vector<T> kbuf, vbuf;
    const int64_t n = st + len;
    T* kb = scratch(kbuf, n * D);
    T* vb = scratch(vbuf, n * D);
    for (int64_t i = 0; i < n * D; ++i) kb[i] = load(kc[i]), vb[i] = load(vc[i]);
    attend_rows<T>(out, q, kb, vb, b, kh, g, D, st, len, scale, window);
  }
}

// Copies the real tokens of x [B, H, S, D] into the cache: token (b, h, s < len[b]) to the cache
// row (of D elements) dst(b, h, s); counts the bytes.
template <class Dst>
void write_rows(const char* op, const Tensor& cache, const Tensor& x, const Rows& r, Dst&& dst) {
  NXD_CHECK(x.size(3) <= 1 || x.stride(3) == 1, "[", op, "] x needs a unit last stride, got ",
            x.desc());
  const int64_t B = x.size(0), H = x.size(1), es = dtype_size(x.dtype()), row = x.size(3) * es;
  const char* xp = static_cast<const char*>(x.raw_data());
  char* cp = static_cast<char*>(cache.raw_data());
  int64_t written = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < r.len[b]; ++s) {
        const char* src = xp + (b * x.stride(0) + h * x.stride(1) + s * x.stride(2)) * es;
        std::memcpy(cp + dst(b, h, s) * row, src, row);
        written += row;
      }
  g_bytes_written += written;
  g_writes += 1;
}

// The checks cached and paged attention share (q, out and the two caches).
void check_attention_args(const char* op, const Tensor& out, const Tensor& q, const Tensor& k_cache,
                          const Tensor& v_cache) {
  check_cache(op, k_cache, "k_cache");
  check_cache(op, v_cache, "v_cache");
  NXD_CHECK_SHAPE(k_cache.shape() == v_cache.shape() && k_cache.dtype() == v_cache.dtype(), "[", op,
                  "] k_cache ", k_cache.desc(), " and v_cache ", v_cache.desc(), " differ");
  NXD_CHECK_SHAPE(q.dim() == 4 && q.size(3) == k_cache.size(3) && q.size(1) % k_cache.size(1) == 0,
                  "[", op, "] q must be [B, Hq, S, D] with Hkv=", k_cache.size(1),
                  " dividing Hq and D=", k_cache.size(3), ", got q=", q.desc(), " cache ",
                  k_cache.desc());
  NXD_CHECK_SHAPE(out.shape() == q.shape() && out.dtype() == q.dtype(), "[", op, "] out ",
                  out.desc(), " must match q ", q.desc());
  NXD_CHECK(
      k_cache.dtype() == q.dtype() || (k_cache.dtype() == DType::bf16 && q.dtype() == DType::f32),
      "[", op, "] cache ", k_cache.desc(), " for q ", q.desc(),
      ": the cache must have q's dtype or be bf16 with f32 q");
}

// Runs item.operator()<T, C>(b, kh) for every (row b, kv head kh) of an attention in parallel
// (T: q's compute type, C: the cache's element type) and zeros the padding queries
// (s >= lengths[b]) of the g query heads of each item.
template <class Item>
void attend_items(const Tensor& out, const Tensor& q, DType cache_dtype, const int64_t* len,
                  int64_t Hkv, int64_t cost, Item&& item) {
  const int64_t B = q.size(0), S = q.size(2), D = q.size(3), g = q.size(1) / Hkv;
  auto run = [&]<class T, class C>() {
    T* op0 = out.data<T>();
    for_rows(B * Hkv, cost, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / Hkv, kh = i % Hkv;
        item.template operator()<T, C>(b, kh);
        for (int64_t j = 0; j < g; ++j)
          for (int64_t s = len[b]; s < S; ++s)
            std::memset(op0 + b * out.stride(0) + (kh * g + j) * out.stride(1) + s * out.stride(2),
                        0, sizeof(T) * D);
      }
    });
  };
  if (q.dtype() == DType::f64)
    run.template operator()<double, double>();
  else if (cache_dtype == DType::bf16)
    run.template operator()<float, bf16>();
  else
    run.template operator()<float, float>();
}

}  // namespace

KVCacheCounters kv_cache_counters() {
  return {g_bytes_written.load(), g_writes.load(), g_bytes_read.load()};
}

void kv_cache_write(const Tensor& cache, const Tensor& x, const Tensor& seq_ids,
                    const Tensor& start, const Tensor& lengths) {
  const char* op = "kv_cache_write";
  check_cache(op, cache, "cache");
  NXD_CHECK_SHAPE(x.dim() == 4 && x.size(1) == cache.size(1) && x.size(3) == cache.size(3) &&
                      x.size(0) <= cache.size(0),
                  "[", op, "] x must be [B<=", cache.size(0), ", ", cache.size(1), ", S, ",
                  cache.size(3), "] for cache ", cache.desc(), ", got ", x.desc());
  NXD_CHECK(x.dtype() == cache.dtype(), "[", op, "] x ", x.desc(), " and cache ", cache.desc(),
            " dtypes differ");
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), L = cache.size(2);
  const bool meta = meta_output(cache, {&x, &seq_ids, &start, &lengths}, op);
  Rows r = check_step(op, seq_ids, start, lengths, B, S, cache.size(0), L, meta);
  charge_compute(op, 0.0, 2.0 * x.nbytes(), cache.dtype());
  if (meta || x.numel() == 0) return;
  write_rows(op, cache, x, r, [&](int64_t b, int64_t h, int64_t s) {
    return (r.seq[b] * H + h) * L + r.start[b] + s;
  });
}

void rotary_at_forward(const Tensor& y, const Tensor& x, const Tensor& start, int64_t rotary_dim,
                       double base, const RopeScaling& scaling) {
  const char* op = "rotary_at_forward";
  NXD_CHECK_SHAPE(x.dim() == 4 && y.shape() == x.shape() && y.dtype() == x.dtype(), "[", op,
                  "] expects x and y [B,H,S,D] alike, got x=", x.desc(), " y=", y.desc());
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
  const int64_t r = rotary_dim == 0 ? D : rotary_dim, half = r / 2;
  NXD_CHECK(r > 0 && r % 2 == 0 && r <= D, "[", op, "] rotary_dim ", rotary_dim,
            " must be even and in (0, D=", D, "]");
  check_rows(op, start, "start", B);
  charge_compute(op, 3.0 * x.numel() * r / D, 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x, start}) || x.numel() == 0) return;
  NXD_CHECK((D <= 1 || (x.stride(3) == 1 && y.stride(3) == 1)), "[", op,
            "] x and y need unit last strides");
  const int64_t* st = start.contiguous().data<int64_t>();
  dispatch_float(op, x, [&]<class T>() {
    // cos/sin per (b, s) exactly as rotary_forward's tables: inv = 1 / base^(2i/r), a = p * inv
    thread_local std::vector<T> inv, cs, sn;
    T* iv = scratch(inv, half);
    for (int64_t i = 0; i < half; ++i)
      iv[i] = scaling.apply(T(1) / std::pow(T(base), T(2 * i) / T(r)));
    T* c = scratch(cs, B * S * half);
    T* s = scratch(sn, B * S * half);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t p = 0; p < S; ++p)
        for (int64_t i = 0; i < half; ++i) {
          const T a = T(st[b] + p) * iv[i];
          c[(b * S + p) * half + i] = std::cos(a);
          s[(b * S + p) * half + i] = std::sin(a);
        }
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t p = 0; p < S; ++p) {
          const T* xr = xp + b * x.stride(0) + h * x.stride(1) + p * x.stride(2);
          T* yr = yp + b * y.stride(0) + h * y.stride(1) + p * y.stride(2);
          const T* cr = c + (b * S + p) * half;
          const T* sr = s + (b * S + p) * half;
          for (int64_t j = 0; j < half; ++j) {
            yr[j] = xr[j] * cr[j] - xr[j + half] * sr[j];
            yr[j + half] = xr[j + half] * cr[j] + xr[j] * sr[j];
          }
          if (r < D) std::memcpy(yr + r, xr + r, sizeof(T) * (D - r));
        }
  });
}

void cached_attention_forward(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                              const Tensor& v_cache, const Tensor& seq_ids, const Tensor& start,
                              const Tensor& lengths, double scale, int64_t window) {
  const char* op = "cached_attention";
  NXD_CHECK(window >= 0, "[", op, "] sliding window must be >= 0, got ", window);
  check_attention_args(op, out, q, k_cache, v_cache);
  NXD_CHECK_SHAPE(q.size(0) <= k_cache.size(0), "[", op, "] q ", q.desc(), " has more rows than ",
                  "the cache ", k_cache.desc());
  const int64_t B = q.size(0), Hq = q.size(1), S = q.size(2), D = q.size(3);
  const int64_t Hkv = k_cache.size(1), L = k_cache.size(2), g = Hq / Hkv;
  const bool meta = meta_output(out, {&q, &k_cache, &v_cache, &seq_ids, &start, &lengths}, op);
  Rows r = check_step(op, seq_ids, start, lengths, B, S, k_cache.size(0), L, meta);
  const double keys = S == 1 ? double(L) : double(S) * (S + 1) / 2 / S;  // per query row
  const double kv_bytes = 2.0 * B * Hkv * (S == 1 ? L : S) * D * dtype_size(k_cache.dtype());
  charge_compute(op, 4.0 * B * Hq * S * keys * D, kv_bytes + 2.0 * q.nbytes(), q.dtype());
  if (meta || q.numel() == 0) return;
  NXD_CHECK(D <= 1 || (q.stride(3) == 1 && out.stride(3) == 1), "[", op,
            "] q and out need unit last strides");
  const double sc = scale > 0 ? scale : 1.0 / std::sqrt(double(D));
  int64_t read = 0;
  for (int64_t b = 0; b < B; ++b)
    read += 2 * Hkv * (r.start[b] + r.len[b] - first_key_needed(r.start[b], window)) * D;
  g_bytes_read += read * dtype_size(k_cache.dtype());
  attend_items(out, q, k_cache.dtype(), r.len, Hkv, g * S * L * D,
               [&]<class T, class C>(int64_t b, int64_t kh) {
                 // the keys from the row's first query's window on (shifting every position by
                 // lo changes no result: the masks are relative)
                 const int64_t lo = first_key_needed(r.start[b], window);
                 const int64_t off = ((r.seq[b] * Hkv + kh) * L + lo) * D;
                 attend_group<T, C>(out, q, static_cast<const C*>(k_cache.raw_data()) + off,
                                    static_cast<const C*>(v_cache.raw_data()) + off, b, kh, g, D,
                                    r.start[b] - lo, r.len[b], T(sc), window);
               });
}

namespace {

// Validates start and lengths (i64 [B]) of a paged step of B rows of S tokens; their values
// unless `meta` (seq_ids unused).
Rows paged_rows(const char* op, const Tensor& start, const Tensor& lengths, int64_t B, int64_t S,
                bool meta) {
  check_rows(op, start, "start", B);
  check_rows(op, lengths, "lengths", B);
  if (meta) return {};
  NXD_CHECK(start.is_contiguous() && lengths.is_contiguous(), "[", op,
            "] start and lengths must be contiguous host tensors");
  Rows r{nullptr, start.data<int64_t>(), lengths.data<int64_t>()};
  for (int64_t b = 0; b < B; ++b)
    NXD_CHECK(r.len[b] >= 1 && r.len[b] <= S && r.start[b] >= 0, "[", op, "] row ", b,
              ": lengths=", r.len[b], " must be in [1, S=", S, "], start=", r.start[b], " >= 0");
  return r;
}

// Validates block_tables i64 [B, MB] against the step's rows and a pool of NB blocks of bs
// positions (the entries of the blocks from first_key_needed(start, window) to the row's last
// position); returns its data (null when meta).
const int64_t* check_tables(const char* op, const Tensor& bt, const Rows& r, int64_t B, int64_t NB,
                            int64_t bs, bool meta, int64_t window) {
  NXD_CHECK(bt.defined(), "[", op, "] block_tables is undefined");
  NXD_CHECK_SHAPE(bt.dtype() == DType::i64 && bt.dim() == 2 && bt.size(0) == B, "[", op,
                  "] block_tables must be i64 [", B, ", max_blocks], got ", bt.desc());
  if (meta) return nullptr;
  NXD_CHECK(!bt.is_meta() && bt.is_contiguous(), "[", op,
            "] block_tables must be a contiguous host tensor, got ", bt.desc());
  const int64_t MB = bt.size(1);
  const int64_t* t = bt.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t need = (r.start[b] + r.len[b] + bs - 1) / bs;
    NXD_CHECK(need <= MB, "[", op, "] row ", b, " reaches position ", r.start[b] + r.len[b] - 1,
              ": needs ", need, " blocks of ", bs, ", block_tables has ", MB);
    // blocks wholly before the first key the row's window sees are not read (a rolling window's
    // engine has returned them to the pool: -1)
    for (int64_t i = first_key_needed(r.start[b], window) / bs; i < need; ++i)
      NXD_CHECK(t[b * MB + i] >= 0 && t[b * MB + i] < NB, "[", op, "] block_tables[", b, ", ", i,
                "]=", t[b * MB + i], " outside the pool of ", NB, " blocks");
  }
  return t;
}

// The n keys (or values) of (row b, kv head kh) from their blocks into dst [n, D] (as T).
template <class T, class C>
void gather_blocks(T* dst, const C* cache, const int64_t* table, int64_t lo, int64_t n, int64_t H,
                   int64_t kh, int64_t bs, int64_t D) {
  for (int64_t j = lo; j < n; ++j) {
    const C* src = cache + ((table[j / bs] * H + kh) * bs + j % bs) * D;
    T* out = dst + (j - lo) * D;
    if constexpr (std::is_same_v<C, T>) {
      std::memcpy(out, src, sizeof(T) * D);
    } else {
      for (int64_t d = 0; d < D; ++d) out[d] = load(src[d]);
    }
  }
}

}  // namespace

void paged_kv_cache_write(const Tensor& cache, const Tensor& x, const Tensor& block_tables,
                          const Tensor& start, const Tensor& lengths) {
  const char* op = "paged_kv_cache_write";
  check_cache(op, cache, "cache");
  NXD_CHECK_SHAPE(x.dim() == 4 && x.size(1) == cache.size(1) && x.size(3) == cache.size(3), "[", op,
                  "] x must be [B, ", cache.size(1), ", S, ", cache.size(3), "] for cache ",
                  cache.desc(), ", got ", x.desc());
  NXD_CHECK(x.dtype() == cache.dtype(), "[", op, "] x ", x.desc(), " and cache ", cache.desc(),
            " dtypes differ");
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2);
  const int64_t NB = cache.size(0), bs = cache.size(2);
  const bool meta =
      meta_output(cache, {&x, &block_tables, &start, &lengths}, op) || block_tables.is_meta();
  const Rows r = paged_rows(op, start, lengths, B, S, meta);
  // the write touches the blocks from position start on: those a window of one position reads
  const int64_t* t = check_tables(op, block_tables, r, B, NB, bs, meta, /*window=*/1);
  charge_compute(op, 0.0, 2.0 * x.nbytes(), cache.dtype());
  if (meta || x.numel() == 0) return;
  const int64_t MB = block_tables.size(1);
  write_rows(op, cache, x, r, [&](int64_t b, int64_t h, int64_t s) {
    const int64_t p = r.start[b] + s;
    return (t[b * MB + p / bs] * H + h) * bs + p % bs;
  });
}

void paged_attention_forward(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                             const Tensor& v_cache, const Tensor& block_tables, const Tensor& start,
                             const Tensor& lengths, double scale, int64_t window) {
  const char* op = "paged_attention";
  NXD_CHECK(window >= 0, "[", op, "] sliding window must be >= 0, got ", window);
  check_attention_args(op, out, q, k_cache, v_cache);
  const int64_t B = q.size(0), Hq = q.size(1), S = q.size(2), D = q.size(3);
  const int64_t Hkv = k_cache.size(1), NB = k_cache.size(0), bs = k_cache.size(2), g = Hq / Hkv;
  const bool meta =
      meta_output(out, {&q, &k_cache, &v_cache, &block_tables, &start, &lengths}, op) ||
      block_tables.is_meta();
  const Rows r = paged_rows(op, start, lengths, B, S, meta);
  const int64_t* t = check_tables(op, block_tables, r, B, NB, bs, meta, window);
  const double keys = double(S + 1) / 2;  // per query row: the prefix each query attends
  double kv_bytes = 0;
  if (!meta)
    for (int64_t b = 0; b < B; ++b)
      kv_bytes += 2.0 * Hkv * (r.start[b] + r.len[b] - first_key_needed(r.start[b], window)) * D;
  charge_compute(op, 4.0 * B * Hq * S * keys * D,
                 kv_bytes * dtype_size(k_cache.dtype()) + 2.0 * q.nbytes(), q.dtype());
  if (meta || q.numel() == 0) return;
  NXD_CHECK(D <= 1 || (q.stride(3) == 1 && out.stride(3) == 1), "[", op,
            "] q and out need unit last strides");
  const double sc = scale > 0 ? scale : 1.0 / std::sqrt(double(D));
  g_bytes_read += static_cast<int64_t>(kv_bytes) * dtype_size(k_cache.dtype());
  const int64_t MB = block_tables.size(1);
  attend_items(out, q, k_cache.dtype(), r.len, Hkv, g * S * (r.start[0] + S) * D,
               [&]<class T, class C>(int64_t b, int64_t kh) {
                 thread_local std::vector<T> kg, vg;
                 const int64_t n = r.start[b] + r.len[b];
                 const int64_t lo = first_key_needed(r.start[b], window);  // as the contiguous
                 T* kp = scratch(kg, (n - lo) * D);
                 T* vp = scratch(vg, (n - lo) * D);
                 gather_blocks<T, C>(kp, static_cast<const C*>(k_cache.raw_data()), t + b * MB, lo,
                                     n, Hkv, kh, bs, D);
                 gather_blocks<T, C>(vp, static_cast<const C*>(v_cache.raw_data()), t + b * MB, lo,
                                     n, Hkv, kh, bs, D);
                 attend_group<T, T>(out, q, kp, vp, b, kh, g, D, r.start[b] - lo, r.len[b], T(sc),
                                    window);
               });
}

void gather_last_forward(const Tensor& out, const Tensor& h, const Tensor& lengths) {
  const char* op = "gather_last";
  NXD_CHECK_SHAPE(h.dim() == 3, "[", op, "] h must be [B, S, H], got ", h.desc());
  const int64_t B = h.size(0), S = h.size(1), H = h.size(2);
  NXD_CHECK_SHAPE(out.dim() == 2 && out.size(0) == B && out.size(1) == H &&
                      out.dtype() == h.dtype() && (out.is_meta() || out.is_contiguous()),
                  "[", op, "] out must be contiguous [", B, ", ", H, "] of h's dtype, got ",
                  out.desc());
  check_rows(op, lengths, "lengths", B);
  charge_compute(op, 0.0, 2.0 * out.nbytes(), h.dtype());
  if (meta_only(op, out, {h, lengths}) || out.numel() == 0) return;
  Tensor lc = lengths.contiguous();
  const int64_t* len = lc.data<int64_t>();
  const int64_t es = dtype_size(h.dtype());
  const char* hp = static_cast<const char*>(h.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  for (int64_t b = 0; b < B; ++b) {
    NXD_CHECK(len[b] >= 1 && len[b] <= S, "[", op, "] lengths[", b, "]=", len[b],
              " must be in [1, S=", S, "]");
    const char* src = hp + (b * h.stride(0) + (len[b] - 1) * h.stride(1)) * es;
    if (H <= 1 || h.stride(2) == 1) {
      std::memcpy(o + b * H * es, src, H * es);
    } else {
      for (int64_t j = 0; j < H; ++j)
        std::memcpy(o + (b * H + j) * es, src + j * h.stride(2) * es, es);
    }
  }
}

}  // namespace nxd::kernels
