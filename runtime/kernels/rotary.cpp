#include "nxd/runtime/kernels/rotary.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels {

using namespace detail;

namespace {

int64_t check_rotary(const char* op, const Tensor& y, const Tensor& x, int64_t rotary_dim,
                     double base) {
  NXD_CHECK_SHAPE(x.dim() == 4, "[", op, "] expects x [B,H,S,D], got ", x.desc());
  int64_t r = rotary_dim == 0 ? x.size(3) : rotary_dim;
  NXD_CHECK(r > 0 && r % 2 == 0 && r <= x.size(3), "[", op, "] rotary_dim ", rotary_dim,
            " must be even and in (0, D=", x.size(3), "] for x ", x.desc());
  NXD_CHECK(base > 0, "[", op, "] base must be positive, got ", base);
  NXD_CHECK_SHAPE(y.shape() == x.shape() && y.dtype() == x.dtype(), "[", op, "] output is ",
                  y.desc(), ", expected ", x.desc());
  NXD_CHECK(y.is_meta() || y.size(3) <= 1 || y.stride(3) == 1, "[", op, "] output ", y.desc(),
            " needs a unit last stride");
  return r;
}

// cos/sin tables [S, r/2] as HF computes them: inv_freq = 1 / base^(2i/r), angle = p * inv_freq.
template <class T>
void tables(std::vector<T>& c, std::vector<T>& s, int64_t seq, int64_t r, double base,
            int64_t offset, const RopeScaling& scaling) {
  int64_t half = r / 2;
  std::vector<T> inv(half);
  for (int64_t i = 0; i < half; ++i)
    inv[i] = scaling.apply(T(1) / std::pow(T(base), T(2 * i) / T(r)));
  c.resize(seq * half), s.resize(seq * half);
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t i = 0; i < half; ++i) {
      T a = T(p + offset) * inv[i];
      c[p * half + i] = std::cos(a);
      s[p * half + i] = std::sin(a);
    }
}

// One row: y[:half] = x1 c - x2 s', y[half:2 half] = x2 c + x1 s' with s' = sign * s (x, y do not
// overlap; restrict parameters let the loop vectorize).
template <class T>
void rotate_half(T* __restrict y, const T* __restrict x, const T* __restrict c,
                 const T* __restrict s, int64_t half, T sign) {
  for (int64_t j = 0; j < half; ++j) {
    const T sn = sign * s[j];
    y[j] = x[j] * c[j] - x[j + half] * sn;
    y[j + half] = x[j + half] * c[j] + x[j] * sn;
  }
}

// The tables of the last call on this thread (a step rotates q and k of every layer, forward and
// backward, with the same positions).
template <class T>
struct Tables {
  int64_t seq = -1, r = 0, offset = 0;
  double base = 0;
  RopeScaling scaling;
  std::vector<T> c, s;
};
template <class T>
const Tables<T>& cached_tables(int64_t seq, int64_t r, double base, int64_t offset,
                               const RopeScaling& scaling) {
  thread_local Tables<T> t;
  if (t.seq != seq || t.r != r || t.base != base || t.offset != offset || !(t.scaling == scaling)) {
    tables<T>(t.c, t.s, seq, r, base, offset, scaling);
    t.seq = seq, t.r = r, t.base = base, t.offset = offset, t.scaling = scaling;
  }
  return t;
}

}  // namespace

namespace {

// y = rotary(x) at position pos[b * S + p] of row (b, p), or position_offset + p without pos.
void rotate(const char* op, const Tensor& y, const Tensor& x, int64_t r, double base,
            int64_t position_offset, const int64_t* pos, RotaryDirection direction,
            const RopeScaling& scaling) {
  Tensor xc = x.detach();
  if (!(xc.size(3) <= 1 || xc.stride(3) == 1)) xc = xc.contiguous();
  int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3), half = r / 2;
  // with per-token positions: the tables of positions [0, max] (the same angles as a sequence
  // of that length at offset 0 has)
  int64_t rows = S;
  if (pos) rows = 1 + *std::max_element(pos, pos + B * S);
  dispatch_float(op, x, [&]<class T>() {
    const Tables<T>& tab = cached_tables<T>(rows, r, base, pos ? 0 : position_offset, scaling);
    const std::vector<T>&c = tab.c, &s = tab.s;
    const T sign = direction == RotaryDirection::inverse ? T(-1) : T(1);
    const T* xp = xc.data<T>();
    T* yp = y.data<T>();
    const int64_t xs0 = xc.stride(0), xs1 = xc.stride(1), xs2 = xc.stride(2);
    const int64_t ys0 = y.stride(0), ys1 = y.stride(1), ys2 = y.stride(2);
    // one item per (b, h, p) row of D values, in memory order: heads inner for the [B, S, H, D]
    // memory of the usual projections
    const bool heads_inner = xs1 < xs2;
    for_rows(B * H * S, 3 * D, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / (H * S);
        const int64_t h = heads_inner ? i % H : i / S % H, p = heads_inner ? i / H % S : i % S;
        const T* xr = xp + b * xs0 + h * xs1 + p * xs2;
        T* yr = yp + b * ys0 + h * ys1 + p * ys2;
        const int64_t t = pos ? pos[b * S + p] : p;
        const T* cr = c.data() + t * half;
        const T* sr = s.data() + t * half;
        rotate_half(yr, xr, cr, sr, half, sign);
        if (r < D) std::memcpy(yr + r, xr + r, sizeof(T) * (D - r));
      }
    });
  });
}

}  // namespace

void rotary_forward(const Tensor& y, const Tensor& x, int64_t rotary_dim, double base,
                    int64_t position_offset, RotaryDirection direction,
                    const RopeScaling& scaling) {
  const char* op = "rotary_forward";
  int64_t r = check_rotary(op, y, x, rotary_dim, base);
  charge_compute(op, 3.0 * x.numel() * r / x.size(3), 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x}) || x.numel() == 0) return;
  rotate(op, y, x, r, base, position_offset, nullptr, direction, scaling);
}

void rotary_positions_forward(const Tensor& y, const Tensor& x, const Tensor& positions,
                              int64_t rotary_dim, double base, RotaryDirection direction,
                              const RopeScaling& scaling) {
  const char* op = "rotary_positions_forward";
  int64_t r = check_rotary(op, y, x, rotary_dim, base);
  NXD_CHECK_SHAPE(
      positions.dim() == 2 && positions.size(0) == x.size(0) && positions.size(1) == x.size(2) &&
          (positions.dtype() == DType::i64 || positions.dtype() == DType::i32),
      "[", op, "] positions must be i32/i64 [B, S] for x ", x.desc(), ", got ", positions.desc());
  charge_compute(op, 3.0 * x.numel() * r / x.size(3), 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x, positions}) || x.numel() == 0) return;
  Tensor p = positions.detach().to(DType::i64).contiguous();
  const int64_t* pp = p.data<int64_t>();
  for (int64_t i = 0; i < p.numel(); ++i)
    NXD_CHECK(pp[i] >= 0, "[", op, "] position ", pp[i], " at flat index ", i, " is negative");
  rotate(op, y, x, r, base, 0, pp, direction, scaling);
}

namespace ref {

void rotary_forward(const Tensor& y, const Tensor& x, int64_t rotary_dim, double base,
                    int64_t position_offset, RotaryDirection direction,
                    const RopeScaling& scaling) {
  int64_t r = check_rotary("ref::rotary_forward", y, x, rotary_dim, base);
  int64_t half = r / 2;
  Tensor out = x.to(DType::f64).contiguous().clone();
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t h = 0; h < x.size(1); ++h)
      for (int64_t p = 0; p < x.size(2); ++p)
        for (int64_t i = 0; i < half; ++i) {
          double th = double(p + position_offset) * scaling.apply(std::pow(base, -2.0 * i / r));
          if (direction == RotaryDirection::inverse) th = -th;
          double a = x.at({b, h, p, i}), bb = x.at({b, h, p, i + half});
          out.set({b, h, p, i}, a * std::cos(th) - bb * std::sin(th));
          out.set({b, h, p, i + half}, bb * std::cos(th) + a * std::sin(th));
        }
  y.copy_(out);
}

}  // namespace ref
}  // namespace nxd::kernels
