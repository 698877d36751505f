#include "nxd/runtime/kernels/embedding.h"

#include <cstring>

#include "nxd/runtime/kernels/nn_common.h"
#include "nxd/runtime/kernels/parallel_rows.h"

namespace nxd::kernels {

using namespace detail;

namespace {

// Contiguous ids as int64, each checked against the vocabulary size.
std::vector<int64_t> checked_ids(const char* op, const Tensor& ids, int64_t vocab) {
  NXD_CHECK(ids.dtype() == DType::i32 || ids.dtype() == DType::i64, "[", op,
            "] ids must be i32 or i64, got ", ids.desc());
  std::vector<int64_t> v = ids.detach().to_vector_as<int64_t>();
  for (size_t i = 0; i < v.size(); ++i)
    NXD_CHECK(v[i] >= 0 && v[i] < vocab, "[", op, "] id ", v[i], " at position ", i,
              " is outside the vocabulary [0, ", vocab, ")");
  return v;
}

Shape out_shape(const Tensor& ids, int64_t d) {
  Shape s = ids.shape();
  s.push_back(d);
  return s;
}

void check_weight(const char* op, const Tensor& w) {
  NXD_CHECK_SHAPE(w.dim() == 2, "[", op, "] weight must be [V, D], got ", w.desc());
}

}  // namespace

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& weight) {
  const char* op = "embedding_forward";
  check_weight(op, weight);
  int64_t d = weight.size(1);
  check_out(op, y, out_shape(ids, d), weight.dtype());
  charge_compute(op, 0.0, 2.0 * y.nbytes() + ids.nbytes(), weight.dtype());
  if (meta_only(op, y, {ids, weight})) return;
  auto idv = checked_ids(op, ids, weight.size(0));
  Tensor w = in(weight);
  // a row copy: any dtype (bf16 weights are gathered without conversion)
  const char* wp = static_cast<const char*>(w.raw_data());
  char* yp = static_cast<char*>(y.raw_data());
  const int64_t row = d * w.element_size();
  for_rows(static_cast<int64_t>(idv.size()), d, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) std::memcpy(yp + i * row, wp + idv[i] * row, row);
  });
}

void embedding_backward(const Tensor& dweight, const Tensor& dy, const Tensor& ids) {
  const char* op = "embedding_backward";
  check_weight(op, dweight);
  int64_t d = dweight.size(1);
  NXD_CHECK(dweight.is_meta() || dweight.is_contiguous(), "[", op, "] dweight ", dweight.desc(),
            " must be contiguous");
  NXD_CHECK_SHAPE(dy.shape() == out_shape(ids, d) && dy.dtype() == dweight.dtype(), "[", op,
                  "] dy is ", dy.desc(), ", expected ", dtype_name(dweight.dtype()),
                  shape_str(out_shape(ids, d)), " for ids ", ids.desc(), " and dweight ",
                  dweight.desc());
  charge_compute(op, double(dy.numel()), 3.0 * dy.nbytes() + ids.nbytes(), dweight.dtype());
  if (meta_only(op, dweight, {dy, ids})) return;
  auto idv = checked_ids(op, ids, dweight.size(0));
  Tensor g = in(dy);
  dispatch_float(op, dweight, [&]<class T>() {
    const T* gp = g.data<T>();
    T* wp = dweight.data<T>();
    // split over columns: every element of dweight still sums its rows in id order
    const int64_t n = static_cast<int64_t>(idv.size());
    for_rows(d, n, [&](int64_t j0, int64_t j1) {
      for (int64_t i = 0; i < n; ++i) {
        T* __restrict dst = wp + idv[i] * d;
        const T* __restrict src = gp + i * d;
        for (int64_t j = j0; j < j1; ++j) dst[j] += src[j];
      }
    });
  });
}

namespace ref {

void embedding_forward(const Tensor& y, const Tensor& ids, const Tensor& weight) {
  auto idv = checked_ids("ref::embedding_forward", ids, weight.size(0));
  for (size_t i = 0; i < idv.size(); ++i)
    for (int64_t j = 0; j < weight.size(1); ++j)
      y.view({-1, weight.size(1)}).set({int64_t(i), j}, weight.at({idv[i], j}));
}

void embedding_backward(const Tensor& dweight, const Tensor& dy, const Tensor& ids) {
  auto idv = checked_ids("ref::embedding_backward", ids, dweight.size(0));
  Tensor g = dy.detach().reshape({-1, dweight.size(1)});
  for (size_t i = 0; i < idv.size(); ++i)
    for (int64_t j = 0; j < dweight.size(1); ++j)
      dweight.set({idv[i], j}, dweight.at({idv[i], j}) + g.at({int64_t(i), j}));
}

}  // namespace ref
}  // namespace nxd::kernels
