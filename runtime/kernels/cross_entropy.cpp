#include "nxd/runtime/kernels/cross_entropy.h"

#include <cmath>

#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels {

using namespace detail;

namespace {

void check_ce(const char* op, const Tensor& logits, const Tensor& targets, double ls) {
  NXD_CHECK_SHAPE(logits.dim() == 2, "[", op, "] logits must be [N, V], got ", logits.desc());
  NXD_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64, "[", op,
            "] targets must be i32 or i64, got ", targets.desc());
  NXD_CHECK_SHAPE(targets.dim() == 1 && targets.size(0) == logits.size(0), "[", op, "] targets ",
                  targets.desc(), " do not match logits ", logits.desc());
  NXD_CHECK(ls >= 0.0 && ls <= 1.0, "[", op, "] label_smoothing must be in [0, 1], got ", ls);
}

void check_row_vec(const char* op, const char* what, const Tensor& t, const Tensor& logits) {
  NXD_CHECK_SHAPE(t.shape() == Shape{logits.size(0)} && t.dtype() == logits.dtype(), "[", op, "] ",
                  what, " is ", t.desc(), ", expected ", dtype_name(logits.dtype()), "[",
                  logits.size(0), "]");
}

std::vector<int64_t> checked_targets(const char* op, const Tensor& targets, int64_t v,
                                     int64_t ignore_index) {
  std::vector<int64_t> t = targets.detach().to_vector_as<int64_t>();
  for (size_t i = 0; i < t.size(); ++i)
    NXD_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < v), "[", op, "] target ", t[i],
              " at row ", i, " is outside [0, ", v, ") and is not ignore_index ", ignore_index);
  return t;
}

}  // namespace

int64_t cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                              const Tensor& targets, int64_t ignore_index, double label_smoothing) {
  const char* op = "cross_entropy_forward";
  check_ce(op, logits, targets, label_smoothing);
  check_row_vec(op, "loss", loss, logits);
  check_row_vec(op, "lse", lse, logits);
  NXD_CHECK(loss.is_meta() || (loss.is_contiguous() && lse.is_contiguous()), "[", op,
            "] outputs must be contiguous");
  charge_compute(op, 4.0 * logits.numel(), double(logits.nbytes()), logits.dtype());
  if (meta_only(op, loss, {logits, targets})) return logits.size(0);
  int64_t n = logits.size(0), v = logits.size(1);
  auto t = checked_targets(op, targets, v, ignore_index);
  Tensor xc = in(logits);
  int64_t count = 0;
  for (int64_t ti : t) count += ti != ignore_index;
  dispatch_float(op, logits, [&]<class T>() {
    const T* xp = xc.data<T>();
    T *lp = loss.data<T>(), *sp = lse.data<T>();
    const T ls = T(label_smoothing);
    for_rows(n, 4 * v, [&](int64_t r0, int64_t r1) {
      Arr<T> tmp(v);
      for (int64_t i = r0; i < r1; ++i) {
        CArrMap<T> x(xp + i * v, v);
        T mx = x.maxCoeff();
        tmp = (x - mx).exp();
        T l = mx + std::log(sum_of(tmp.data(), v));
        sp[i] = l;
        if (t[i] == ignore_index) {
          lp[i] = T(0);
          continue;
        }
        T nll = l - x[t[i]];
        T smooth = ls != T(0) ? l - x.sum() / T(v) : T(0);  // mean_v(-logp[v])
        lp[i] = (T(1) - ls) * nll + ls * smooth;
      }
    });
  });
  return count;
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t ignore_index,
                            double label_smoothing) {
  const char* op = "cross_entropy_backward";
  check_ce(op, logits, targets, label_smoothing);
  check_out(op, dlogits, logits.shape(), logits.dtype());
  check_row_vec(op, "dloss", dloss, logits);
  check_row_vec(op, "lse", lse, logits);
  charge_compute(op, 4.0 * logits.numel(), 2.0 * logits.nbytes(), logits.dtype());
  if (meta_only(op, dlogits, {dloss, logits, lse, targets})) return;
  int64_t n = logits.size(0), v = logits.size(1);
  auto t = checked_targets(op, targets, v, ignore_index);
  Tensor xc = in(logits), gc = in(dloss), lc = in(lse);
  dispatch_float(op, logits, [&]<class T>() {
    const T *xp = xc.data<T>(), *gp = gc.data<T>(), *sp = lc.data<T>();
    T* dp = dlogits.data<T>();
    const T ls = T(label_smoothing);
    for_rows(n, 4 * v, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        ArrMap<T> d(dp + i * v, v);
        if (t[i] == ignore_index) {
          d.setZero();
          continue;
        }
        CArrMap<T> x(xp + i * v, v);
        T g = gp[i];
        const T shift = sp[i], floor = ls / T(v);
        assign_blocks(dp + i * v, v, [&](int64_t j, int64_t w) {
          return ((x.segment(j, w) - shift).exp() - floor) * g;
        });
        d[t[i]] -= (T(1) - ls) * g;
      }
    });
  });
}

namespace ref {

int64_t cross_entropy_forward(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                              const Tensor& targets, int64_t ignore_index, double label_smoothing) {
  int64_t n = logits.size(0), v = logits.size(1), count = 0;
  auto t = checked_targets("ref::cross_entropy_forward", targets, v, ignore_index);
  std::vector<double> x = logits.to_vector(), lo(n), ls(n);
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) mx = std::max(mx, x[i * v + j]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[i * v + j] - mx);
    ls[i] = mx + std::log(s);
    if (t[i] == ignore_index) continue;
    ++count;
    double smooth = 0;
    for (int64_t j = 0; j < v; ++j) smooth += ls[i] - x[i * v + j];
    lo[i] = (1 - label_smoothing) * (ls[i] - x[i * v + t[i]]) + label_smoothing * smooth / v;
  }
  loss.copy_(from_doubles(lo, {n}, DType::f64));
  lse.copy_(from_doubles(ls, {n}, DType::f64));
  return count;
}

void cross_entropy_backward(const Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t ignore_index,
                            double label_smoothing) {
  int64_t n = logits.size(0), v = logits.size(1);
  auto t = checked_targets("ref::cross_entropy_backward", targets, v, ignore_index);
  std::vector<double> x = logits.to_vector(), g = dloss.to_vector(), ls = lse.to_vector(),
                      d(n * v, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == ignore_index) continue;
    for (int64_t j = 0; j < v; ++j)
      d[i * v + j] = g[i] * (std::exp(x[i * v + j] - ls[i]) - label_smoothing / v -
                             (j == t[i] ? 1 - label_smoothing : 0.0));
  }
  dlogits.copy_(from_doubles(d, logits.shape(), DType::f64));
}

}  // namespace ref
}  // namespace nxd::kernels
