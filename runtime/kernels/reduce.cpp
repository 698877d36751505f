#include "nxd/runtime/kernels/reduce.h"

#include <Eigen/Core>
#include <cmath>

#include "nxd/runtime/context.h"
#include "nxd/runtime/kernels/common.h"
#include "nxd/runtime/kernels/nn_common.h"

namespace nxd::kernels {

namespace {

std::vector<bool> reduced_mask(const Shape& s, const std::vector<int64_t>& dims, const char* op) {
  const int64_t nd = static_cast<int64_t>(s.size());
  std::vector<bool> mask(s.size(), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, nd, op);
    NXD_CHECK_SHAPE(!mask[w], "[", op, "] dim ", d, " repeated in the reduction of ", shape_str(s));
    mask[w] = true;
  }
  return mask;
}

// out broadcasting to x (out may have fewer dims; size-1 dims broadcast).
void check_reduces_from(const Tensor& out, const Tensor& x, const char* op) {
  bool ok = out.dim() <= x.dim();
  for (int64_t d = 0; ok && d < out.dim(); ++d) {
    int64_t xd = x.shape()[d + x.dim() - out.dim()];
    ok = out.shape()[d] == xd || out.shape()[d] == 1;
  }
  NXD_CHECK_SHAPE(ok, "[", op, "] cannot sum ", x.desc(), " down to ", out.desc());
}

template <class T>
using VecMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>, 0, Eigen::InnerStride<>>;

template <class T>
void sum_to_typed(const Tensor& out, const Tensor& x, double scale_d, double beta) {
  T* o = out.data<T>();
  const T* xp = x.data<T>();
  const T scale = static_cast<T>(scale_d);
  if (beta == 0.0) {
    out.zero_();
  } else if (beta != 1.0) {
    const T b = static_cast<T>(beta);
    for_each_strided<1>(
        out.shape(), {out.strides()},
        [&](const std::array<int64_t, 1>& off, int64_t n, const std::array<int64_t, 1>& st) {
          for (int64_t i = 0; i < n; ++i) o[off[0] + i * st[0]] *= b;
        });
  }
  for_each_strided<2>(
      x.shape(), {broadcast_strides(out, x.shape()), x.strides()},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        T* op = o + off[0];
        const T* ip = xp + off[1];
        if (st[0] == 0) {
          T acc;
          if (st[1] == 1)
            acc = detail::sum_of(ip, n);
          else
            acc = VecMap<T>(ip, n, Eigen::InnerStride<>(st[1])).sum();
          *op += scale * acc;
        } else if (st[0] == 1 && st[1] == 1) {
          for (int64_t i = 0; i < n; ++i) op[i] += scale * ip[i];
        } else {
          for (int64_t i = 0; i < n; ++i) op[i * st[0]] += scale * ip[i * st[1]];
        }
      });
}

void sum_to_impl(const Tensor& out, const Tensor& x, double scale, double beta, const char* op) {
  check_floating(x, op, "input");
  check_same_dtype(out, x, op);
  check_reduces_from(out, x, op);
  charge_compute(op, static_cast<double>(x.numel()), static_cast<double>(x.nbytes() + out.nbytes()),
                 out.dtype());
  if (meta_output(out, {&x}, op) || out.numel() == 0) return;
  Tensor od = out.detach(), xd = x.detach();
  switch (out.dtype()) {
    case DType::f32:
      sum_to_typed<float>(od, xd, scale, beta);
      break;
    case DType::f64:
      sum_to_typed<double>(od, xd, scale, beta);
      break;
    case DType::bf16: {
      Tensor of = beta == 0.0 ? empty(od.shape(), DType::f32) : od.to(DType::f32);
      sum_to_typed<float>(of, xd.to(DType::f32), scale, beta);
      od.copy_(of);
      break;
    }
    default:
      throw InternalError(str("[", op, "] unreachable dtype"));
  }
}

// out viewed with x's rank: reduced dims get size 1 and stride 0.
Tensor keepdim_view(const Tensor& out, const Shape& xs, const std::vector<bool>& mask) {
  Shape sh, st;
  int64_t j = 0;
  for (size_t d = 0; d < xs.size(); ++d) {
    if (mask[d]) {
      sh.push_back(1);
      st.push_back(0);
    } else {
      sh.push_back(out.shape()[j]);
      st.push_back(out.strides()[j]);
      ++j;
    }
  }
  return out.detach().as_strided(sh, st, out.offset());
}

void check_out_shape(const Tensor& out, const Shape& want, const Tensor& x, const char* op) {
  NXD_CHECK_SHAPE(out.shape() == want, "[", op, "] output ", out.desc(), " should be ",
                  shape_str(want), " for input ", x.desc());
}

}  // namespace

Shape reduced_shape(const Shape& s, const std::vector<int64_t>& dims, bool keepdim,
                    const char* op) {
  std::vector<bool> mask = reduced_mask(s, dims, op);
  Shape r;
  for (size_t d = 0; d < s.size(); ++d)
    if (!mask[d])
      r.push_back(s[d]);
    else if (keepdim)
      r.push_back(1);
  return r;
}

void sum(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
         double scale) {
  check_out_shape(out, reduced_shape(x.shape(), dims, keepdim, "sum"), x, "sum");
  std::vector<bool> mask = reduced_mask(x.shape(), dims, "sum");
  Tensor ok = keepdim ? out
              : out.is_meta()
                  ? out.detach().view(reduced_shape(x.shape(), dims, /*keepdim=*/true, "sum"))
                  : keepdim_view(out, x.shape(), mask);
  sum_to_impl(ok, x, scale, 0.0, "sum");
}

void mean(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  std::vector<bool> mask = reduced_mask(x.shape(), dims, "mean");
  int64_t n = 1;
  for (size_t d = 0; d < mask.size(); ++d)
    if (mask[d]) n *= x.shape()[d];
  check_out_shape(out, reduced_shape(x.shape(), dims, keepdim, "mean"), x, "mean");
  Tensor ok = keepdim ? out
              : out.is_meta()
                  ? out.detach().view(reduced_shape(x.shape(), dims, /*keepdim=*/true, "mean"))
                  : keepdim_view(out, x.shape(), mask);
  sum_to_impl(ok, x, n == 0 ? std::nan("") : 1.0 / static_cast<double>(n), 0.0, "mean");
}

void sum_to(const Tensor& out, const Tensor& x, double scale, double beta) {
  sum_to_impl(out, x, scale, beta, "sum_to");
}

void amax(const Tensor& out, const Tensor& indices, const Tensor& x, int64_t dim, bool keepdim) {
  check_floating(x, "amax", "input");
  check_same_dtype(out, x, "amax");
  const int64_t d = wrap_dim(dim, x.dim(), "amax");
  const Shape want = reduced_shape(x.shape(), {dim}, keepdim, "amax");
  check_out_shape(out, want, x, "amax");
  if (indices.defined()) {
    NXD_CHECK(indices.dtype() == DType::i64, "[amax] indices must be i64, got ", indices.desc());
    check_out_shape(indices, want, x, "amax");
  }
  NXD_CHECK_SHAPE(x.shape()[d] > 0, "[amax] cannot reduce the empty dim ", dim, " of ", x.desc());
  charge_compute("amax", static_cast<double>(x.numel()),
                 static_cast<double>(x.nbytes() + out.nbytes()), out.dtype());
  if (meta_output(out, {&x}, "amax") || out.numel() == 0) return;
  Tensor xc = as_compute(x.detach()).contiguous();
  int64_t outer = 1, inner = 1;
  const int64_t len = x.shape()[d];
  for (int64_t i = 0; i < d; ++i) outer *= x.shape()[i];
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.shape()[i];
  Tensor vals = empty({outer, inner}, xc.dtype());
  Tensor idx = empty({outer, inner}, DType::i64);
  dispatch(xc.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      const T* xp = xc.data<T>();
      T* vp = vals.data<T>();
      int64_t* ip = idx.data<int64_t>();
      for (int64_t o = 0; o < outer; ++o) {
        T* best = vp + o * inner;
        int64_t* bi = ip + o * inner;
        const T* row = xp + o * len * inner;
        for (int64_t i = 0; i < inner; ++i) {
          best[i] = row[i];
          bi[i] = 0;
        }
        for (int64_t j = 1; j < len; ++j) {
          const T* r = row + j * inner;
          for (int64_t i = 0; i < inner; ++i) {
            const bool take = r[i] > best[i] || (std::isnan(r[i]) && !std::isnan(best[i]));
            best[i] = take ? r[i] : best[i];
            bi[i] = take ? j : bi[i];
          }
        }
      }
    }
  });
  out.detach().copy_(vals.view(want));
  if (indices.defined()) indices.detach().copy_(idx.view(want));
}

namespace ref {

void sum(const Tensor& out, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim,
         double scale) {
  std::vector<bool> mask = reduced_mask(x.shape(), dims, "ref::sum");
  Shape keep = reduced_shape(x.shape(), dims, /*keepdim=*/true, "ref::sum");
  Tensor acc = zeros(keep, DType::f64);
  std::vector<double> xv = x.detach().to_vector();
  std::vector<double> av(static_cast<size_t>(acc.numel()), 0.0);
  const Shape& xs = x.shape();
  Shape ks = contiguous_strides(keep);
  for (size_t i = 0; i < xv.size(); ++i) {
    int64_t rem = static_cast<int64_t>(i), o = 0;
    for (int64_t d = x.dim() - 1; d >= 0; --d) {
      int64_t id = rem % xs[d];
      rem /= xs[d];
      if (!mask[d]) o += id * ks[d];
    }
    av[o] += xv[i];
  }
  for (double& v : av) v *= scale;
  out.detach().copy_(from_doubles(av, keep, DType::f64).view(out.shape()));
}

void sum_to(const Tensor& out, const Tensor& x, double scale, double beta) {
  // Dims that broadcasting out to x expanded: the leading extra dims and out's size-1 dims.
  std::vector<int64_t> dims;
  const int64_t lead = x.dim() - out.dim();
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d < lead || (out.shape()[d - lead] == 1 && x.shape()[d] != 1)) dims.push_back(d);
  std::vector<double> rv;
  if (dims.empty()) {
    rv = x.detach().to_vector();
    for (double& v : rv) v *= scale;
  } else {
    Tensor r = zeros(reduced_shape(x.shape(), dims, /*keepdim=*/true, "ref::sum_to"), DType::f64);
    ref::sum(r, x, dims, /*keepdim=*/true, scale);
    rv = r.to_vector();
  }
  std::vector<double> ov = out.detach().to_vector();
  for (size_t i = 0; i < ov.size(); ++i) ov[i] = (beta == 0.0 ? 0.0 : beta * ov[i]) + rv[i];
  out.detach().copy_(from_doubles(ov, out.shape(), DType::f64));
}

void amax(const Tensor& out, const Tensor& indices, const Tensor& x, int64_t dim, bool keepdim) {
  const int64_t d = wrap_dim(dim, x.dim(), "ref::amax");
  Shape keep = reduced_shape(x.shape(), {dim}, /*keepdim=*/true, "ref::amax");
  std::vector<double> best(static_cast<size_t>(shape_numel(keep)), 0.0);
  std::vector<double> bidx(best.size(), -1.0);
  std::vector<double> xv = x.detach().to_vector();
  Shape ks = contiguous_strides(keep);
  for (size_t i = 0; i < xv.size(); ++i) {
    int64_t rem = static_cast<int64_t>(i), o = 0, j = 0;
    for (int64_t k = x.dim() - 1; k >= 0; --k) {
      int64_t id = rem % x.shape()[k];
      rem /= x.shape()[k];
      if (k == d)
        j = id;
      else
        o += id * ks[k];
    }
    const double v = xv[i];
    if (bidx[o] < 0 || v > best[o] || (std::isnan(v) && !std::isnan(best[o]))) {
      best[o] = v;
      bidx[o] = static_cast<double>(j);
    }
  }
  out.detach().copy_(from_doubles(best, keep, DType::f64).view(out.shape()));
  if (indices.defined())
    indices.detach().copy_(from_doubles(bidx, keep, DType::i64).view(indices.shape()));
}

}  // namespace ref

}  // namespace nxd::kernels
