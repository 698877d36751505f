// Tensor's views (runtime/tensor.h): view, reshape, transpose, permute, narrow, slice, select,
// chunk, split, expand, squeeze, unsqueeze, flatten and as_strided share the base's Storage.
#include <algorithm>
#include <numeric>

#include "nxd/runtime/tensor.h"
#include "nxd/runtime/tensor_internal.h"

namespace nxd {

using detail::make_view;

// Infers a -1 dim and checks the element count.
static Shape infer_shape(const Shape& from, Shape to, const char* op) {
  int64_t neg = -1, known = 1;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i] == -1) {
      NXD_CHECK_SHAPE(neg < 0, "[", op, "] more than one -1 in ", shape_str(to));
      neg = static_cast<int64_t>(i);
    } else {
      NXD_CHECK_SHAPE(to[i] >= 0, "[", op, "] negative size in ", shape_str(to));
      known *= to[i];
    }
  }
  int64_t n = shape_numel(from);
  if (neg >= 0) {
    NXD_CHECK_SHAPE(known != 0 && n % known == 0, "[", op, "] cannot view ", shape_str(from),
                    " as ", shape_str(to));
    to[neg] = n / known;
  }
  NXD_CHECK_SHAPE(shape_numel(to) == n, "[", op, "] cannot view ", shape_str(from), " (", n,
                  " elements) as ", shape_str(to));
  return to;
}

// Strides for viewing (shape, strides) as new_shape without a copy, or empty if impossible
// (same algorithm as PyTorch's computeStride: match chunks of contiguous dims).
static bool view_strides(const Shape& sh, const Shape& st, const Shape& ns, Shape& out) {
  out.assign(ns.size(), 0);
  if (shape_numel(sh) == 0 || sh.empty()) {  // empty, or a 0-d tensor viewed as [1,1,...]
    out = contiguous_strides(ns);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(ns.size()) - 1;
  int64_t chunk_base_stride = st.empty() ? 1 : st.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(sh.size()) - 1; td >= 0; --td) {
    tensor_numel *= sh[td];
    if (td == 0 || (sh[td - 1] != 1 && st[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= ns[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (td > 0) {
        chunk_base_stride = st[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Tensor Tensor::view(const Shape& s) const {
  check_raw("view");
  Shape ns = infer_shape(shape(), s, "view");
  Shape out;
  NXD_CHECK_SHAPE(view_strides(shape(), strides(), ns, out), "[view] ", desc(), " with strides ",
                  shape_str(strides()), " cannot be viewed as ", shape_str(ns),
                  " without a copy; use reshape");
  return make_view(*this, ns, out, offset());
}

Tensor Tensor::reshape(const Shape& s) const {
  check_raw("reshape");
  Shape ns = infer_shape(shape(), s, "reshape");
  Shape out;
  if (view_strides(shape(), strides(), ns, out)) return make_view(*this, ns, out, offset());
  return contiguous().view(ns);
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  check_raw("transpose");
  a = wrap_dim(a, dim(), "transpose");
  b = wrap_dim(b, dim(), "transpose");
  Shape sh = shape(), st = strides();
  std::swap(sh[a], sh[b]);
  std::swap(st[a], st[b]);
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::t() const {
  NXD_CHECK_SHAPE(dim() == 2, "[t] needs a 2-d tensor, got ", desc());
  return transpose(0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  check_raw("permute");
  NXD_CHECK_SHAPE(static_cast<int64_t>(dims.size()) == dim(), "[permute] ", dims.size(),
                  " dims given for ", desc());
  Shape sh(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    NXD_CHECK_SHAPE(!seen[d], "[permute] dim ", d, " repeated in permutation of ", desc());
    seen[d] = true;
    sh[i] = shape()[d];
    st[i] = strides()[d];
  }
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  check_raw("narrow");
  d = wrap_dim(d, dim(), "narrow");
  if (start < 0) start += shape()[d];
  NXD_CHECK_SHAPE(start >= 0 && length >= 0 && start + length <= shape()[d], "[narrow] range [",
                  start, ", ", start + length, ") out of bounds for dim ", d, " of ", desc());
  Shape sh = shape();
  sh[d] = length;
  return make_view(*this, sh, strides(), offset() + start * strides()[d]);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  check_raw("slice");
  d = wrap_dim(d, dim(), "slice");
  NXD_CHECK(step >= 1, "[slice] step must be >= 1, got ", step);
  int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sh = shape(), st = strides();
  sh[d] = (end - start + step - 1) / step;
  st[d] *= step;
  return make_view(*this, sh, st, offset() + start * strides()[d]);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  check_raw("select");
  d = wrap_dim(d, dim(), "select");
  int64_t n = shape()[d];
  if (index < 0) index += n;
  NXD_CHECK_SHAPE(index >= 0 && index < n, "[select] index ", index, " out of range for dim ", d,
                  " of ", desc());
  Shape sh = shape(), st = strides();
  sh.erase(sh.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, sh, st, offset() + index * strides()[d]);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  NXD_CHECK(chunks >= 1, "[chunk] chunks must be >= 1, got ", chunks);
  d = wrap_dim(d, dim(), "chunk");
  int64_t n = shape()[d];
  int64_t each = (n + chunks - 1) / chunks;
  return split(std::max<int64_t>(each, 1), d);
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d) const {
  NXD_CHECK(split_size >= 1, "[split] split size must be >= 1, got ", split_size);
  d = wrap_dim(d, dim(), "split");
  std::vector<Tensor> r;
  int64_t n = shape()[d];
  for (int64_t s = 0; s < n; s += split_size)
    r.push_back(narrow(d, s, std::min(split_size, n - s)));
  if (n == 0) r.push_back(narrow(d, 0, 0));
  return r;
}

std::vector<Tensor> Tensor::split(const std::vector<int64_t>& sizes, int64_t d) const {
  d = wrap_dim(d, dim(), "split");
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  NXD_CHECK_SHAPE(total == shape()[d], "[split] sizes sum to ", total, " but dim ", d, " of ",
                  desc(), " is ", shape()[d]);
  std::vector<Tensor> r;
  int64_t s = 0;
  for (int64_t len : sizes) {
    r.push_back(narrow(d, s, len));
    s += len;
  }
  return r;
}

Tensor Tensor::expand(const Shape& s) const {
  check_raw("expand");
  NXD_CHECK_SHAPE(s.size() >= shape().size(), "[expand] cannot expand ", desc(), " to ",
                  shape_str(s));
  size_t lead = s.size() - shape().size();
  Shape sh(s.size()), st(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (i < lead) {
      NXD_CHECK_SHAPE(s[i] >= 0, "[expand] new leading dim must be >= 0 in ", shape_str(s));
      sh[i] = s[i];
      st[i] = 0;
      continue;
    }
    int64_t cur = shape()[i - lead];
    int64_t want = s[i] == -1 ? cur : s[i];
    if (cur == want) {
      sh[i] = cur;
      st[i] = strides()[i - lead];
    } else {
      NXD_CHECK_SHAPE(cur == 1, "[expand] cannot expand ", desc(), " to ", shape_str(s), ": dim ",
                      i - lead, " has size ", cur, ", not 1");
      sh[i] = want;
      st[i] = 0;
    }
  }
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::squeeze(int64_t d) const {
  check_raw("squeeze");
  d = wrap_dim(d, dim(), "squeeze");
  NXD_CHECK_SHAPE(shape()[d] == 1, "[squeeze] dim ", d, " of ", desc(), " is not 1");
  Shape sh = shape(), st = strides();
  sh.erase(sh.begin() + d);
  st.erase(st.begin() + d);
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::unsqueeze(int64_t d) const {
  check_raw("unsqueeze");
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape sh = shape(), st = strides();
  int64_t s = d < dim() ? strides()[d] * shape()[d] : 1;
  sh.insert(sh.begin() + d, 1);
  st.insert(st.begin() + d, s);
  return make_view(*this, sh, st, offset());
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  NXD_CHECK_SHAPE(start <= end, "[flatten] start dim ", start, " after end dim ", end);
  Shape ns(shape().begin(), shape().begin() + start);
  int64_t m = 1;
  for (int64_t i = start; i <= end; ++i) m *= shape()[i];
  ns.push_back(m);
  ns.insert(ns.end(), shape().begin() + end + 1, shape().end());
  return reshape(ns);
}

Tensor Tensor::as_strided(const Shape& sh, const Shape& st, int64_t off) const {
  check_raw("as_strided");
  NXD_CHECK_SHAPE(sh.size() == st.size(), "[as_strided] shape ", shape_str(sh), " and strides ",
                  shape_str(st), " differ in rank");
  int64_t hi = off;
  for (size_t i = 0; i < sh.size(); ++i)
    if (sh[i] > 0) hi += (sh[i] - 1) * st[i];
  NXD_CHECK_SHAPE(
      off >= 0 && (shape_numel(sh) == 0 || (hi + 1) * element_size() <= storage()->nbytes()),
      "[as_strided] view ", shape_str(sh), " strides ", shape_str(st), " offset ", off,
      " exceeds the storage of ", storage()->nbytes(), " bytes");
  return make_view(*this, sh, st, off);
}

}  // namespace nxd
