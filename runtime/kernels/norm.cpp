#include "nxd/runtime/kernels/norm.h"

#include <cmath>

#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels {

using namespace detail;

namespace {

Shape row_shape(const Tensor& x) {
  Shape s = x.shape();
  if (!s.empty()) s.pop_back();
  return s;
}

void check_norm_args(const char* op, const Tensor& y, const Tensor& x,
                     std::initializer_list<std::pair<const char*, Tensor>> stats,
                     std::initializer_list<std::pair<const char*, Tensor>> params) {
  NXD_CHECK_SHAPE(x.dim() >= 1, "[", op, "] input must have at least 1 dim, got ", x.desc());
  check_out(op, y, x.shape(), x.dtype());
  for (auto& [name, t] : stats) {
    if (!t.defined()) continue;
    NXD_CHECK_SHAPE(t.shape() == row_shape(x) && t.dtype() == x.dtype(), "[", op, "] ", name,
                    " is ", t.desc(), ", expected ", dtype_name(x.dtype()), shape_str(row_shape(x)),
                    " for input ", x.desc());
  }
  for (auto& [name, t] : params) {
    if (!t.defined()) continue;
    NXD_CHECK_SHAPE(t.dim() == 1 && t.size(0) == x.size(-1) && t.dtype() == x.dtype(), "[", op,
                    "] ", name, " is ", t.desc(), ", expected ", dtype_name(x.dtype()), "[",
                    x.size(-1), "] for input ", x.desc());
  }
}

template <class T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// Rows per chunk of the weight/bias gradient reductions: each chunk sums its rows in order into
// its own partial, and the partials are added in chunk order, whatever the thread count.
constexpr int64_t kRowChunk = 64;

// Adds the chunk partials [chunks, d] in order into out[d] (out = sum).
template <class T>
void combine_chunks(T* out, const Arr<T>& partials, int64_t chunks, int64_t d) {
  ArrMap<T> o(out, d);
  o = partials.head(d);
  for (int64_t c = 1; c < chunks; ++c) o += partials.segment(c * d, d);
}

}  // namespace

void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = "layer_norm_forward";
  check_norm_args(op, y, x, {{"mean", mean}, {"rstd", rstd}}, {{"weight", weight}, {"bias", bias}});
  NXD_CHECK(mean.defined() && rstd.defined(), "[", op, "] mean and rstd outputs are required");
  charge_compute(op, 8.0 * x.numel(), 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x, weight, bias}) || x.numel() == 0) return;
  int64_t d = x.size(-1), rows = rows_of(x);
  Tensor xc = in(x), wc = weight.defined() ? in(weight) : Tensor(),
         bc = bias.defined() ? in(bias) : Tensor();
  dispatch_float(op, x, [&]<class T>() {
    const T* xp = xc.data<T>();
    const T* wp = ptr_or_null<T>(wc);
    const T* bp = ptr_or_null<T>(bc);
    T *yp = y.data<T>(), *mp = mean.data<T>(), *rp = rstd.data<T>();
    for_rows(rows, 8 * d, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        CArrMap<T> xv(xp + r * d, d);
        ArrMap<T> yv(yp + r * d, d);
        T mu = sum_of(xp + r * d, d) / T(d);
        yv = xv - mu;
        T var = yv.square().sum() / T(d);
        T rs = T(1) / std::sqrt(var + T(eps));
        mp[r] = mu, rp[r] = rs;
        if (wp && bp)
          yv = yv * rs * CArrMap<T>(wp, d) + CArrMap<T>(bp, d);
        else if (wp)
          yv = yv * rs * CArrMap<T>(wp, d);
        else if (bp)
          yv = yv * rs + CArrMap<T>(bp, d);
        else
          yv *= rs;
      }
    });
  });
}

void layer_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight) {
  const char* op = "layer_norm_backward";
  check_norm_args(op, dx, x, {{"mean", mean}, {"rstd", rstd}},
                  {{"weight", weight}, {"dweight", dweight}, {"dbias", dbias}});
  check_same(op, "dy", dy, x);
  charge_compute(op, 12.0 * x.numel(), 3.0 * x.nbytes(), x.dtype());
  if (meta_only(op, dx, {dy, x, mean, rstd, weight}) || x.numel() == 0) {
    if (!dx.is_meta()) {
      if (dweight.defined()) dweight.zero_();
      if (dbias.defined()) dbias.zero_();
    }
    return;
  }
  int64_t d = x.size(-1), rows = rows_of(x);
  Tensor xc = in(x), dyc = in(dy), mc = in(mean), rc = in(rstd),
         wc = weight.defined() ? in(weight) : Tensor();
  dispatch_float(op, x, [&]<class T>() {
    const T *xp = xc.data<T>(), *gp = dyc.data<T>(), *mp = mc.data<T>(), *rp = rc.data<T>();
    const T* wp = ptr_or_null<T>(wc);
    T* dxp = dx.data<T>();
    const int64_t chunks = num_chunks(rows, kRowChunk);
    Arr<T> dw(dweight.defined() ? chunks * d : 0), db(dbias.defined() ? chunks * d : 0);
    for_chunks(rows, kRowChunk, 12 * d, [&](int64_t c, int64_t r0, int64_t r1) {
      Arr<T> xhat(d), g(d);
      if (dweight.defined()) dw.segment(c * d, d).setZero();
      if (dbias.defined()) db.segment(c * d, d).setZero();
      for (int64_t r = r0; r < r1; ++r) {
        CArrMap<T> xv(xp + r * d, d), dyv(gp + r * d, d);
        ArrMap<T> dxv(dxp + r * d, d);
        T rs = rp[r];
        xhat = (xv - mp[r]) * rs;
        if (dweight.defined()) dw.segment(c * d, d) += dyv * xhat;
        if (dbias.defined()) db.segment(c * d, d) += dyv;
        if (wp)
          g = dyv * CArrMap<T>(wp, d);
        else
          g = dyv;
        T mg = sum_of(g.data(), d) / T(d);
        T mgx = (g * xhat).sum() / T(d);
        dxv = (g - mg - xhat * mgx) * rs;
      }
    });
    if (dweight.defined()) combine_chunks(dweight.data<T>(), dw, chunks, d);
    if (dbias.defined()) combine_chunks(dbias.data<T>(), db, chunks, d);
  });
}

void rms_norm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                      double eps) {
  const char* op = "rms_norm_forward";
  check_norm_args(op, y, x, {{"rstd", rstd}}, {{"weight", weight}});
  NXD_CHECK(rstd.defined(), "[", op, "] the rstd output is required");
  charge_compute(op, 5.0 * x.numel(), 2.0 * x.nbytes(), x.dtype());
  if (meta_only(op, y, {x, weight}) || x.numel() == 0) return;
  int64_t d = x.size(-1), rows = rows_of(x);
  Tensor xc = in(x), wc = weight.defined() ? in(weight) : Tensor();
  dispatch_float(op, x, [&]<class T>() {
    const T* xp = xc.data<T>();
    const T* wp = ptr_or_null<T>(wc);
    T *yp = y.data<T>(), *rp = rstd.data<T>();
    for_rows(rows, 5 * d, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        CArrMap<T> xv(xp + r * d, d);
        ArrMap<T> yv(yp + r * d, d);
        T rs = T(1) / std::sqrt(xv.square().sum() / T(d) + T(eps));
        rp[r] = rs;
        if (wp)
          yv = (xv * rs) * CArrMap<T>(wp, d);
        else
          yv = xv * rs;
      }
    });
  });
}

void rms_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                       const Tensor& rstd, const Tensor& weight) {
  const char* op = "rms_norm_backward";
  check_norm_args(op, dx, x, {{"rstd", rstd}}, {{"weight", weight}, {"dweight", dweight}});
  check_same(op, "dy", dy, x);
  charge_compute(op, 8.0 * x.numel(), 3.0 * x.nbytes(), x.dtype());
  if (meta_only(op, dx, {dy, x, rstd, weight}) || x.numel() == 0) {
    if (!dx.is_meta() && dweight.defined()) dweight.zero_();
    return;
  }
  int64_t d = x.size(-1), rows = rows_of(x);
  Tensor xc = in(x), dyc = in(dy), rc = in(rstd), wc = weight.defined() ? in(weight) : Tensor();
  dispatch_float(op, x, [&]<class T>() {
    const T *xp = xc.data<T>(), *gp = dyc.data<T>(), *rp = rc.data<T>();
    const T* wp = ptr_or_null<T>(wc);
    T* dxp = dx.data<T>();
    const int64_t chunks = num_chunks(rows, kRowChunk);
    Arr<T> dw(dweight.defined() ? chunks * d : 0);
    for_chunks(rows, kRowChunk, 8 * d, [&](int64_t c, int64_t r0, int64_t r1) {
      Arr<T> xhat(d), g(d);
      if (dweight.defined()) dw.segment(c * d, d).setZero();
      for (int64_t r = r0; r < r1; ++r) {
        CArrMap<T> xv(xp + r * d, d), dyv(gp + r * d, d);
        ArrMap<T> dxv(dxp + r * d, d);
        T rs = rp[r];
        xhat = xv * rs;
        if (dweight.defined()) dw.segment(c * d, d) += dyv * xhat;
        if (wp)
          g = dyv * CArrMap<T>(wp, d);
        else
          g = dyv;
        T mgx = (g * xhat).sum() / T(d);
        dxv = (g - xhat * mgx) * rs;
      }
    });
    if (dweight.defined()) combine_chunks(dweight.data<T>(), dw, chunks, d);
  });
}

// ---------------- naive references (double accumulation) ----------------
namespace ref {

void layer_norm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                        const Tensor& weight, const Tensor& bias, double eps) {
  Tensor xc = in(x);
  int64_t d = x.size(-1), rows = rows_of(x);
  std::vector<double> w = weight.defined() ? weight.to_vector() : std::vector<double>(d, 1.0);
  std::vector<double> b = bias.defined() ? bias.to_vector() : std::vector<double>(d, 0.0);
  dispatch_float("ref::layer_norm_forward", x, [&]<class T>() {
    const T* xp = xc.data<T>();
    T *yp = y.data<T>(), *mp = mean.data<T>(), *rp = rstd.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      double mu = 0, var = 0;
      for (int64_t j = 0; j < d; ++j) mu += xp[r * d + j];
      mu /= d;
      for (int64_t j = 0; j < d; ++j) var += (xp[r * d + j] - mu) * (xp[r * d + j] - mu);
      var /= d;
      double rs = 1.0 / std::sqrt(var + eps);
      mp[r] = T(mu), rp[r] = T(rs);
      for (int64_t j = 0; j < d; ++j) yp[r * d + j] = T((xp[r * d + j] - mu) * rs * w[j] + b[j]);
    }
  });
}

void layer_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                         const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight) {
  int64_t d = x.size(-1), rows = rows_of(x);
  std::vector<double> xv = x.to_vector(), g = dy.to_vector(), mu = mean.to_vector(),
                      rs = rstd.to_vector();
  std::vector<double> w = weight.defined() ? weight.to_vector() : std::vector<double>(d, 1.0);
  std::vector<double> dw(d, 0), db(d, 0), out(xv.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < d; ++j) {
      double xh = (xv[r * d + j] - mu[r]) * rs[r], gw = g[r * d + j] * w[j];
      dw[j] += g[r * d + j] * xh, db[j] += g[r * d + j];
      mg += gw, mgx += gw * xh;
    }
    mg /= d, mgx /= d;
    for (int64_t j = 0; j < d; ++j) {
      double xh = (xv[r * d + j] - mu[r]) * rs[r];
      out[r * d + j] = rs[r] * (g[r * d + j] * w[j] - mg - xh * mgx);
    }
  }
  dx.copy_(from_doubles(out, x.shape(), DType::f64));
  if (dweight.defined()) dweight.copy_(from_doubles(dw, {d}, DType::f64));
  if (dbias.defined()) dbias.copy_(from_doubles(db, {d}, DType::f64));
}

void rms_norm_forward(const Tensor& y, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                      double eps) {
  int64_t d = x.size(-1), rows = rows_of(x);
  std::vector<double> xv = x.to_vector(), out(xv.size()), rsv(rows);
  std::vector<double> w = weight.defined() ? weight.to_vector() : std::vector<double>(d, 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < d; ++j) ms += xv[r * d + j] * xv[r * d + j];
    rsv[r] = 1.0 / std::sqrt(ms / d + eps);
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = xv[r * d + j] * rsv[r] * w[j];
  }
  y.copy_(from_doubles(out, x.shape(), DType::f64));
  rstd.copy_(from_doubles(rsv, rstd.shape(), DType::f64));
}

void rms_norm_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dy, const Tensor& x,
                       const Tensor& rstd, const Tensor& weight) {
  int64_t d = x.size(-1), rows = rows_of(x);
  std::vector<double> xv = x.to_vector(), g = dy.to_vector(), rs = rstd.to_vector();
  std::vector<double> w = weight.defined() ? weight.to_vector() : std::vector<double>(d, 1.0);
  std::vector<double> dw(d, 0), out(xv.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mgx = 0;
    for (int64_t j = 0; j < d; ++j) {
      double xh = xv[r * d + j] * rs[r];
      dw[j] += g[r * d + j] * xh;
      mgx += g[r * d + j] * w[j] * xh;
    }
    mgx /= d;
    for (int64_t j = 0; j < d; ++j)
      out[r * d + j] = rs[r] * (g[r * d + j] * w[j] - xv[r * d + j] * rs[r] * mgx);
  }
  dx.copy_(from_doubles(out, x.shape(), DType::f64));
  if (dweight.defined()) dweight.copy_(from_doubles(dw, {d}, DType::f64));
}

}  // namespace ref
}  // namespace nxd::kernels
