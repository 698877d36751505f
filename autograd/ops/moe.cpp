// Mixture-of-experts routing ops: topk (values differentiable), scatter_add_rows, scale_grad.
#include "nxd/autograd/ops/moe.h"

#include <algorithm>
#include <numeric>

#include "nxd/autograd/ops/basic.h"
#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/kernels/embedding.h"

namespace nxd {

using namespace nn_detail;

namespace {
// x [N, E] (f32/f64) -> per row the k largest, decreasing, ties by lower index.
template <class T>
void topk_rows(const Tensor& xc, int64_t k, const Tensor& vals, const Tensor& idx) {
  const int64_t n = xc.size(0), e = xc.size(1);
  const T* x = xc.data<T>();
  T* v = vals.data<T>();
  int64_t* ix = idx.data<int64_t>();
  std::vector<int64_t> order(static_cast<size_t>(e));
  for (int64_t r = 0; r < n; ++r) {
    const T* row = x + r * e;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int64_t a, int64_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int64_t j = 0; j < k; ++j) {
      ix[r * k + j] = order[static_cast<size_t>(j)];
      v[r * k + j] = row[order[static_cast<size_t>(j)]];
    }
  }
}
}  // namespace

std::vector<Tensor> topk(const Tensor& x, int64_t k) {
  const char* op = "topk";
  check_float(op, "x", x);
  NXD_CHECK_SHAPE(x.dim() == 2, "[", op, "] x must be [N, E], got ", x.desc());
  NXD_CHECK(k >= 1 && k <= x.size(1), "[", op, "] k=", k, " must be in [1, ", x.size(1), "] for ",
            x.desc());
  const DType dt = x.dtype(), ct = compute_dtype(dt);
  const int64_t n = x.size(0), e = x.size(1);
  if (x.is_meta()) {  // shapes only (the planner): no selection, a meta gradient
    Tensor vals = empty({n, k}, dt, Device::meta), idx = empty({n, k}, DType::i64, Device::meta);
    // the backward's kernels as below, on meta tensors: the sim clock charges them alike
    autograd::record(op, {x}, {vals}, [n, e, k, dt, ct](const Grads& g) -> Grads {
      Tensor dx = zeros({n * e, 1}, ct, Device::meta);
      const Tensor flat = empty({n * k}, DType::i64, Device::meta);
      kernels::embedding_backward(dx, compute(g[0]).contiguous().view({n * k, 1}), flat);
      return {to_dtype(dx.view({n, e}), dt)};
    });
    return {vals, idx};
  }
  Tensor xc = compute(x).contiguous();
  Tensor vals = empty({n, k}, ct), idx = empty({n, k}, DType::i64);
  if (ct == DType::f64)
    topk_rows<double>(xc, k, vals, idx);
  else
    topk_rows<float>(xc, k, vals, idx);
  vals = to_dtype(vals, dt);
  autograd::record(op, {x}, {vals}, [idx, n, e, dt, ct](const Grads& g) -> Grads {
    Tensor dx = zeros({n * e, 1}, ct);
    Tensor flat = idx.clone().view({n * idx.size(1)});
    int64_t* f = flat.data<int64_t>();
    for (int64_t i = 0; i < flat.numel(); ++i) f[i] += (i / idx.size(1)) * e;
    kernels::embedding_backward(dx, compute(g[0]).contiguous().view({flat.numel(), 1}), flat);
    return {to_dtype(dx.view({n, e}), dt)};
  });
  return {vals, idx};
}

Tensor scatter_add_rows(const Tensor& src, const Tensor& idx, int64_t n) {
  const char* op = "scatter_add_rows";
  check_float(op, "src", src);
  NXD_CHECK(idx.defined() && (idx.dtype() == DType::i64 || idx.dtype() == DType::i32), "[", op,
            "] idx must be i32 or i64, got ", idx.defined() ? idx.desc() : "undefined");
  NXD_CHECK_SHAPE(src.dim() == 2 && idx.dim() == 1 && idx.size(0) == src.size(0), "[", op,
                  "] src must be [M, D] and idx [M], got src ", src.desc(), " idx ", idx.desc());
  NXD_CHECK(n >= 0, "[", op, "] n=", n, " must be >= 0");
  const DType dt = src.dtype(), ct = compute_dtype(dt);
  Tensor idd = idx.detach().contiguous();
  Tensor y = zeros({n, src.size(1)}, ct, device_of({src, idx}));
  kernels::embedding_backward(y, compute(src).contiguous(), idd);  // checks idx in [0, n)
  y = to_dtype(y, dt);
  autograd::record(op, {src}, {y}, [idd](const Grads& g) -> Grads {
    Tensor gd = g[0].contiguous();
    Tensor ds = empty({idd.size(0), gd.size(1)}, gd.dtype(), device_of({gd, idd}));
    kernels::embedding_forward(ds, idd, gd);
    return {ds};
  });
  return y;
}

Tensor scale_grad(const Tensor& x, double scale) {
  NXD_CHECK(x.defined(), "[scale_grad] undefined input");
  if (scale == 1.0) return x;
  Tensor y = x.detach();
  autograd::record("scale_grad", {x}, {y},
                   [scale](const Grads& g) -> Grads { return {mul(g[0], scale)}; });
  return y;
}

}  // namespace nxd
