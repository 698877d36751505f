#include "nxd/runtime/gemm_bf16.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <vector>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/parallel.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace nxd::blas::detail {

#if defined(__x86_64__)

// The packing and the AVX512-BF16 kernel need AVX-512 F/BW/VL and AVX512_BF16; the AMX kernel
// adds AMX-TILE and AMX-BF16. Per-function targets keep the library buildable and runnable
// without -march=native: these functions run only after the cpuid checks below.
#define NXD_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define NXD_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))
// The tile load/store intrinsics are asm statements without memory operands: fence them so the
// compiler keeps ordinary loads and stores of the same buffers on the right side.
#define NXD_COMPILER_FENCE() __asm__ __volatile__("" ::: "memory")

namespace {

constexpr int64_t kTile = 512;  // bf16 elements in one packed 16x32 tile (1 KiB)

uint64_t xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

bool detect_avx512_bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if ((xcr0() & 0xe6) != 0xe6) return false;  // SSE, AVX, opmask and ZMM state enabled
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const unsigned max_leaf = a;
  const bool f = b & (1u << 16), bw = b & (1u << 30), vl = b & (1u << 31);
  if (!f || !bw || !vl || max_leaf < 1) return false;
  __get_cpuid_count(7, 1, &a, &b, &c, &d);
  return a & (1u << 5);  // AVX512_BF16
}

bool detect_amx_bf16() {
  if (!cpu_has_avx512_bf16()) return false;  // packing uses VCVTNE2PS2BF16
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;  // AMX-TILE, AMX-BF16
  if ((xcr0() & (3u << 17)) != (3u << 17)) return false;     // XTILECFG, XTILEDATA
  // Linux (5.16+) grants tile data per process on request.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Per-calling-thread packing buffer, grown and never shrunk (no allocation per call).
struct Scratch {
  uint16_t* p = nullptr;
  size_t cap = 0;
  ~Scratch() { ::operator delete (p, std::align_val_t{64}); }
  uint16_t* get(size_t n) {
    if (n > cap) {
      ::operator delete (p, std::align_val_t{64});
      p = nullptr;
      cap = 0;
      p = static_cast<uint16_t*>(::operator new (n * sizeof(uint16_t), std::align_val_t{64}));
      cap = n;
    }
    return p;
  }
};
thread_local Scratch t_scratch;

inline __mmask16 mask16(int64_t n) {
  return n <= 0 ? 0 : n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
}

// 16x16 transpose of 32-bit elements.
NXD_AVX512BF16 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // g[4*grp + c]: 128-bit lane L holds column 4L + c of rows 4grp .. 4grp+3.
  __m512i g[16];
  for (int i = 0; i < 4; ++i) {
    g[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    g[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    g[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    g[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i u0 = _mm512_shuffle_i32x4(g[c], g[4 + c], 0x88);
    const __m512i u1 = _mm512_shuffle_i32x4(g[c], g[4 + c], 0xdd);
    const __m512i v0 = _mm512_shuffle_i32x4(g[8 + c], g[12 + c], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(g[8 + c], g[12 + c], 0xdd);
    r[c] = _mm512_shuffle_i32x4(u0, v0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(u1, v1, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(u0, v0, 0xdd);
    r[12 + c] = _mm512_shuffle_i32x4(u1, v1, 0xdd);
  }
}

// 32 consecutive f32 (the first `valid`, the rest read as 0) rounded to 32 bf16 in order.
NXD_AVX512BF16 inline __m512i round32(const float* p, int64_t valid) {
  const __m512 lo = _mm512_maskz_loadu_ps(mask16(valid), p);
  const __m512 hi = _mm512_maskz_loadu_ps(mask16(valid - 16), p + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Interleaves two rows of 16 f32 into 16 bf16 pairs (lane j = x0[j] low half, x1[j] high).
NXD_AVX512BF16 inline __m512i pairs16(__m512 x0, __m512 x1) {
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);  // x0 in words 0..15, x1 16..31
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, both);
}

// Packs A strips [s0, s1) (16 rows each) of op(A)[m,k].
NXD_AVX512BF16 void pack_a(bool ta, const float* a, int64_t lda, int64_t m, int64_t k,
                           int64_t ksteps, int64_t s0, int64_t s1, uint16_t* pa) {
  if (!ta) {  // row i of op(A) is contiguous along k: walk each row once
    for (int64_t s = s0; s < s1; ++s) {
      uint16_t* ps = pa + s * ksteps * kTile;
      const int64_t rows = std::min<int64_t>(16, m - 16 * s);
      for (int64_t r = 0; r < 16; ++r) {
        if (r >= rows) {
          for (int64_t t = 0; t < ksteps; ++t)
            _mm512_storeu_si512(ps + t * kTile + r * 32, _mm512_setzero_si512());
          continue;
        }
        const float* row = a + (16 * s + r) * lda;
        for (int64_t t = 0; t < ksteps; ++t)
          _mm512_storeu_si512(ps + t * kTile + r * 32, round32(row + 32 * t, k - 32 * t));
      }
    }
    return;
  }
  // Column k of op(A) is contiguous along i: build pair columns, then transpose. 32 rows of the
  // stored matrix at a time, across all strips, so the reads stream.
  for (int64_t t = 0; t < ksteps; ++t) {
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t i0 = 16 * s;
      const __mmask16 mk = mask16(m - i0);
      __m512i v[16];
      for (int q = 0; q < 16; ++q) {
        const int64_t kk = 32 * t + 2 * q;
        const __m512 x0 =
            kk < k ? _mm512_maskz_loadu_ps(mk, a + kk * lda + i0) : _mm512_setzero_ps();
        const __m512 x1 =
            kk + 1 < k ? _mm512_maskz_loadu_ps(mk, a + (kk + 1) * lda + i0) : _mm512_setzero_ps();
        v[q] = pairs16(x0, x1);
      }
      transpose16(v);
      uint16_t* tile = pa + (s * ksteps + t) * kTile;
      for (int r = 0; r < 16; ++r) _mm512_storeu_si512(tile + r * 32, v[r]);
    }
  }
}

// Packs B strips [s0, s1) (16 columns each) of op(B)[k,n] into pair (VNNI) tiles.
NXD_AVX512BF16 void pack_b(bool tb, const float* b, int64_t ldb, int64_t n, int64_t k,
                           int64_t ksteps, int64_t s0, int64_t s1, uint16_t* pb) {
  if (!tb) {  // row k of op(B) is contiguous along j: a tile row is two rows interleaved.
    // 32 rows at a time, across all strips, so the reads stream.
    for (int64_t t = 0; t < ksteps; ++t) {
      for (int64_t s = s0; s < s1; ++s) {
        const int64_t j0 = 16 * s;
        const __mmask16 mk = mask16(n - j0);
        uint16_t* tile = pb + (s * ksteps + t) * kTile;
        for (int q = 0; q < 16; ++q) {
          const int64_t kk = 32 * t + 2 * q;
          const __m512 x0 =
              kk < k ? _mm512_maskz_loadu_ps(mk, b + kk * ldb + j0) : _mm512_setzero_ps();
          const __m512 x1 =
              kk + 1 < k ? _mm512_maskz_loadu_ps(mk, b + (kk + 1) * ldb + j0) : _mm512_setzero_ps();
          _mm512_storeu_si512(tile + q * 32, pairs16(x0, x1));
        }
      }
    }
    return;
  }
  // Column j of op(B) is contiguous along k: 32 k are one pair column; transpose.
  for (int64_t s = s0; s < s1; ++s) {
    const int64_t j0 = 16 * s, cols = std::min<int64_t>(16, n - j0);
    for (int64_t t = 0; t < ksteps; ++t) {
      __m512i v[16];
      for (int j = 0; j < 16; ++j)
        v[j] = j < cols ? round32(b + (j0 + j) * ldb + 32 * t, k - 32 * t) : _mm512_setzero_si512();
      transpose16(v);
      uint16_t* tile = pb + (s * ksteps + t) * kTile;
      for (int q = 0; q < 16; ++q) _mm512_storeu_si512(tile + q * 32, v[q]);
    }
  }
}

// C[rows, cols] = alpha * acc + beta * C from a 32x32 f32 block (row stride 32).
NXD_AVX512BF16 void store_block(const float* acc, int64_t rows, int64_t cols, float alpha,
                                float beta, float* c, int64_t ldc) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; j += 16) {
      const __mmask16 mk = mask16(cols - j);
      float* cp = c + r * ldc + j;
      __m512 v = _mm512_mul_ps(va, _mm512_loadu_ps(acc + r * 32 + j));
      if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, cp), v);
      _mm512_mask_storeu_ps(cp, mk, v);
    }
  }
}

// AMX: a (16*MI) x (16*NJ) block of C over the k-steps [0, steps) of the strips at pa and pb
// (consecutive strips `strip` elements apart); tiles 0-3 accumulate, 4-5 hold A, 6-7 B. The
// accumulators start at zero (in == nullptr) or at `in` (row stride in_ld floats) and are stored
// to `out` (row stride out_ld floats). f32 partial sums round-trip exactly, so splitting K this
// way never changes a result.
template <int MI, int NJ>
NXD_AMX void amx_block(const uint16_t* pa, const uint16_t* pb, int64_t strip, int64_t steps,
                       const float* in, int64_t in_ld, float* out, int64_t out_ld) {
  const uint16_t* pa1 = MI == 2 ? pa + strip : pa;
  const uint16_t* pb1 = NJ == 2 ? pb + strip : pb;
  NXD_COMPILER_FENCE();
  if (in != nullptr) {
    const int64_t stride = in_ld * 4;
    _tile_loadd(0, in, stride);
    if constexpr (NJ == 2) _tile_loadd(1, in + 16, stride);
    if constexpr (MI == 2) _tile_loadd(2, in + 16 * in_ld, stride);
    if constexpr (MI == 2 && NJ == 2) _tile_loadd(3, in + 16 * in_ld + 16, stride);
  } else {
    _tile_zero(0);
    if constexpr (NJ == 2) _tile_zero(1);
    if constexpr (MI == 2) _tile_zero(2);
    if constexpr (MI == 2 && NJ == 2) _tile_zero(3);
  }
  for (int64_t t = 0; t < steps; ++t) {
    _tile_loadd(4, pa + t * kTile, 64);
    _tile_loadd(6, pb + t * kTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NJ == 2) {
      _tile_loadd(7, pb1 + t * kTile, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MI == 2) {
      _tile_loadd(5, pa1 + t * kTile, 64);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NJ == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  const int64_t stride = out_ld * 4;
  _tile_stored(0, out, stride);
  if constexpr (NJ == 2) _tile_stored(1, out + 16, stride);
  if constexpr (MI == 2) _tile_stored(2, out + 16 * out_ld, stride);
  if constexpr (MI == 2 && NJ == 2) _tile_stored(3, out + 16 * out_ld + 16, stride);
  NXD_COMPILER_FENCE();
}

// The block for 32 or fewer rows (m2: more than 16) and columns (n2).
NXD_AMX void amx_block_any(bool m2, bool n2, const uint16_t* pa, const uint16_t* pb, int64_t strip,
                           int64_t steps, const float* in, int64_t in_ld, float* out,
                           int64_t out_ld) {
  if (m2 && n2)
    amx_block<2, 2>(pa, pb, strip, steps, in, in_ld, out, out_ld);
  else if (m2)
    amx_block<2, 1>(pa, pb, strip, steps, in, in_ld, out, out_ld);
  else if (n2)
    amx_block<1, 2>(pa, pb, strip, steps, in, in_ld, out, out_ld);
  else
    amx_block<1, 1>(pa, pb, strip, steps, in, in_ld, out, out_ld);
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

NXD_AMX void amx_configure() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) {  // every tile: 16 rows of 64 bytes (16 f32 or 32 bf16)
    cfg.colsb[i] = 64;
    cfg.rows[i] = 16;
  }
  _tile_loadconfig(&cfg);
}

NXD_AMX void amx_release() {
  _tile_release();
}

// AVX512-BF16: the same block in register blocks of 8 rows x 32 columns (VDPBF16PS on a
// broadcast A pair and a row of the B pair tile).
template <int MI, int NJ>
NXD_AVX512BF16 void avx512_block(const uint16_t* pa, const uint16_t* pb, int64_t ksteps,
                                 float* acc) {
  const uint16_t* pb1 = NJ == 2 ? pb + ksteps * kTile : pb;
  for (int s = 0; s < MI; ++s) {
    const uint16_t* ps = pa + s * ksteps * kTile;
    for (int h = 0; h < 2; ++h) {
      __m512 c0[8], c1[8];
      for (int r = 0; r < 8; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
      for (int64_t t = 0; t < ksteps; ++t) {
        const uint32_t* at = reinterpret_cast<const uint32_t*>(ps + t * kTile) + 8 * h * 16;
        const uint16_t* b0 = pb + t * kTile;
        const uint16_t* b1 = pb1 + t * kTile;
        for (int q = 0; q < 16; ++q) {
          const __m512bh bv0 = (__m512bh)_mm512_loadu_si512(b0 + q * 32);
          __m512bh bv1{};
          if constexpr (NJ == 2) bv1 = (__m512bh)_mm512_loadu_si512(b1 + q * 32);
          for (int r = 0; r < 8; ++r) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(at[r * 16 + q]));
            c0[r] = _mm512_dpbf16_ps(c0[r], av, bv0);
            if constexpr (NJ == 2) c1[r] = _mm512_dpbf16_ps(c1[r], av, bv1);
          }
        }
      }
      for (int r = 0; r < 8; ++r) {
        float* row = acc + (16 * s + 8 * h + r) * 32;
        _mm512_storeu_ps(row, c0[r]);
        if constexpr (NJ == 2) _mm512_storeu_ps(row + 16, c1[r]);
      }
    }
  }
}

struct Problem {
  int64_t m, n, k, ksteps;
  float alpha, beta;
  float* c;
  int64_t ldc;
  const uint16_t* pa;
  const uint16_t* pb;
};

// B is walked in panels of 32-column blocks that stay in L2 while every 32-row block passes
// over them.
constexpr int64_t kPanelBytes = 1024 * 1024;

// AVX512-BF16: the 32x32 C blocks [ib0, ib1) x [jb0, jb1), each over the whole K.
NXD_AVX512BF16 void compute_avx512(const Problem& P, int64_t ib0, int64_t ib1, int64_t jb0,
                                   int64_t jb1) {
  alignas(64) float acc[32 * 32];
  const int64_t panel = std::max<int64_t>(1, kPanelBytes / (2 * P.ksteps * kTile * 2));
  for (int64_t jp = jb0; jp < jb1; jp += panel) {
    const int64_t jpe = std::min(jb1, jp + panel);
    for (int64_t ib = ib0; ib < ib1; ++ib) {
      const int64_t rows = std::min<int64_t>(32, P.m - 32 * ib);
      const uint16_t* pa = P.pa + 2 * ib * P.ksteps * kTile;
      for (int64_t jb = jp; jb < jpe; ++jb) {
        const int64_t cols = std::min<int64_t>(32, P.n - 32 * jb);
        const uint16_t* pb = P.pb + 2 * jb * P.ksteps * kTile;
        const bool m2 = rows > 16, n2 = cols > 16;
        if (m2 && n2)
          avx512_block<2, 2>(pa, pb, P.ksteps, acc);
        else if (m2)
          avx512_block<2, 1>(pa, pb, P.ksteps, acc);
        else if (n2)
          avx512_block<1, 2>(pa, pb, P.ksteps, acc);
        else
          avx512_block<1, 1>(pa, pb, P.ksteps, acc);
        store_block(acc, rows, cols, P.alpha, P.beta, P.c + 32 * ib * P.ldc + 32 * jb, P.ldc);
      }
    }
  }
}

// AMX: the 32x32 C blocks [ib0, ib1) x [jb0, jb1). K is split into chunks of kChunk steps so
// that a block row of A (32 x 32*kChunk bf16) stays in L1 while the B panel streams from L2;
// between chunks a block's partial sums wait in a per-thread buffer (exactly, in f32).
NXD_AMX void compute_amx(const Problem& P, int64_t ib0, int64_t ib1, int64_t jb0, int64_t jb1) {
  constexpr int64_t kChunk = 8;  // 256 k: 16 KiB of A per block row
  alignas(64) float acc[32 * 32];
  const int64_t strip = P.ksteps * kTile;
  const int64_t panel = std::max<int64_t>(1, kPanelBytes / (2 * strip * 2));
  const int64_t chunks = (P.ksteps + kChunk - 1) / kChunk;
  thread_local std::vector<float> partial;  // a block row of the panel: panel x 32x32
  if (chunks > 1 && partial.size() < static_cast<size_t>(panel * 1024))
    partial.resize(static_cast<size_t>(panel * 1024));
  // alpha == 1 and beta == 0 or 1: whole blocks start at 0 or at C and are stored to C.
  const bool direct = P.alpha == 1.0f && (P.beta == 0.0f || P.beta == 1.0f);
  amx_configure();
  for (int64_t jp = jb0; jp < jb1; jp += panel) {
    const int64_t jpe = std::min(jb1, jp + panel);
    for (int64_t ib = ib0; ib < ib1; ++ib) {
      const int64_t rows = std::min<int64_t>(32, P.m - 32 * ib);
      for (int64_t ch = 0; ch < chunks; ++ch) {
        const int64_t t0 = ch * kChunk, steps = std::min(kChunk, P.ksteps - t0);
        const bool first = ch == 0, last = ch == chunks - 1;
        const uint16_t* pa = P.pa + 2 * ib * strip + t0 * kTile;
        for (int64_t jb = jp; jb < jpe; ++jb) {
          const int64_t cols = std::min<int64_t>(32, P.n - 32 * jb);
          const uint16_t* pb = P.pb + 2 * jb * strip + t0 * kTile;
          float* cb = P.c + 32 * ib * P.ldc + 32 * jb;
          float* part = chunks > 1 ? partial.data() + (jb - jp) * 1024 : nullptr;
          const bool m2 = rows > 16, n2 = cols > 16;
          const bool whole = direct && rows == 32 && cols == 32;
          const float* in = nullptr;
          int64_t in_ld = 32;
          if (!first)
            in = part;
          else if (whole && P.beta != 0.0f)
            in = cb, in_ld = P.ldc;
          if (!last) {
            amx_block_any(m2, n2, pa, pb, strip, steps, in, in_ld, part, 32);
          } else if (whole) {
            amx_block_any(m2, n2, pa, pb, strip, steps, in, in_ld, cb, P.ldc);
          } else {
            amx_block_any(m2, n2, pa, pb, strip, steps, in, in_ld, acc, 32);
            store_block(acc, rows, cols, P.alpha, P.beta, cb, P.ldc);
          }
        }
      }
    }
  }
  amx_release();
}

}  // namespace

// A baseline build without dispatch above its -march (NXD_DISPATCH_ABOVE_MARCH=OFF) uses only
// what it was compiled for, so on this machine it runs what a CPU of that level runs.
#if defined(NXD_NO_DISPATCH_ABOVE_MARCH) && !defined(__AVX512BF16__)
constexpr bool kMayDispatchBf16 = false;
#else
constexpr bool kMayDispatchBf16 = true;
#endif
#if defined(NXD_NO_DISPATCH_ABOVE_MARCH) && !defined(__AMX_BF16__)
constexpr bool kMayDispatchAmx = false;
#else
constexpr bool kMayDispatchAmx = true;
#endif

bool cpu_has_avx512_bf16() {
  static const bool v = kMayDispatchBf16 && detect_avx512_bf16();
  return v;
}

bool cpu_has_amx_bf16() {
  static const bool v = kMayDispatchAmx && detect_amx_bf16();
  return v;
}

void gemm_bf16_x86(Bf16Kernel kernel, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                   float beta, float* c, int64_t ldc, int threads) {
  NXD_CHECK(kernel == Bf16Kernel::amx ? cpu_has_amx_bf16()
                                      : kernel == Bf16Kernel::avx512_bf16 && cpu_has_avx512_bf16(),
            "[blas::sgemm] bf16 kernel ", bf16_kernel_name(kernel), " is not available");
  const int64_t ksteps = (k + 31) / 32;
  const int64_t ms = (m + 15) / 16, ns = (n + 15) / 16;  // 16-row / 16-column strips
  const int64_t mb = (m + 31) / 32, nb = (n + 31) / 32;  // 32x32 blocks of C
  // Whole strips per 32-block (the last block may have one strip): pad the count to even.
  const size_t a_elems = static_cast<size_t>((ms + 1) / 2 * 2 * ksteps * kTile);
  const size_t b_elems = static_cast<size_t>((ns + 1) / 2 * 2 * ksteps * kTile);
  uint16_t* pa = t_scratch.get(a_elems + b_elems);
  uint16_t* pb = pa + a_elems;
  const Problem P{m, n, k, ksteps, alpha, beta, c, ldc, pa, pb};
  auto run_compute = [&](int64_t ib0, int64_t ib1, int64_t jb0, int64_t jb1) {
    if (kernel == Bf16Kernel::amx)
      compute_amx(P, ib0, ib1, jb0, jb1);
    else
      compute_avx512(P, ib0, ib1, jb0, jb1);
  };

  // Split only products big enough to amortize waking the helpers (two pool jobs).
  int parts = 1;
  const bool by_rows = mb >= nb;
  if (threads > 1 && parallel::threads() > 1 && !parallel::in_parallel_region() &&
      m * n * k / threads >= gemm_split().bf16_min_work)
    parts = static_cast<int>(std::min<int64_t>(threads, by_rows ? mb : nb));
  if (parts <= 1) {
    pack_a(ta, a, lda, m, k, ksteps, 0, ms, pa);
    pack_b(tb, b, ldb, n, k, ksteps, 0, ns, pb);
    run_compute(0, mb, 0, nb);
    return;
  }
  // Packing is split by strips, the product by contiguous ranges of 32-row (or 32-column)
  // blocks. Which thread computes a block never changes what it computes.
  parallel::run(parts, [&](int p) {
    pack_a(ta, a, lda, m, k, ksteps, ms * p / parts, ms * (p + 1) / parts, pa);
    pack_b(tb, b, ldb, n, k, ksteps, ns * p / parts, ns * (p + 1) / parts, pb);
  });
  const int64_t len = by_rows ? mb : nb;
  parallel::run(parts, [&](int p) {
    const int64_t s = len * p / parts, e = len * (p + 1) / parts;
    if (s >= e) return;
    if (by_rows)
      run_compute(s, e, 0, nb);
    else
      run_compute(0, mb, s, e);
  });
}

#else  // not x86-64: only the portable kernel exists

bool cpu_has_avx512_bf16() {
  return false;
}
bool cpu_has_amx_bf16() {
  return false;
}
void gemm_bf16_x86(Bf16Kernel kernel, bool, bool, int64_t, int64_t, int64_t, float, const float*,
                   int64_t, const float*, int64_t, float, float*, int64_t, int) {
  NXD_CHECK(false, "[blas::sgemm] bf16 kernel ", bf16_kernel_name(kernel), " is not available");
}

#endif

}  // namespace nxd::blas::detail
