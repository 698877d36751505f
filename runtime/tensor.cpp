#include "nxd/runtime/tensor.h"
#include "nxd/runtime/trace_hook.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <numeric>
#include <ostream>
#include <sstream>

namespace nxd {

// ---------- shapes ----------

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(s[i]);
  }
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    throw ShapeError(str("[", op, "] dim ", dim, " out of range for a ", ndim, "-d tensor"));
  return d;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape r(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw ShapeError(
          str("[", op, "] shapes do not broadcast: ", shape_str(a), " and ", shape_str(b)));
    r[i] = da == 1 ? db : da;
  }
  return r;
}

// ---------- grad mode ----------

namespace {
thread_local bool tl_grad_enabled = true;
}
bool GradMode::is_enabled() {
  return tl_grad_enabled;
}
void GradMode::set_enabled(bool on) {
  tl_grad_enabled = on;
}

// ---------- construction helpers ----------

static Tensor make(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    NXD_CHECK_SHAPE(d >= 0, "[empty] negative size in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->storage = Storage::allocate(shape_numel(shape) * dtype_size(dtype), device);
  return Tensor(std::move(impl));
}

static Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->storage = base.storage();
  return Tensor(std::move(impl));
}

// ---------- Tensor basics ----------

int64_t Tensor::size(int64_t d) const {
  return shape()[wrap_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  return strides()[wrap_dim(d, dim(), "stride")];
}

bool Tensor::is_contiguous() const {
  const auto& sh = shape();
  const auto& st = strides();
  int64_t expect = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sh[i] != 1 && st[i] != expect) return false;
    expect *= sh[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  const auto& s = storage();
  NXD_CHECK(s->device() == Device::host, "[Tensor::data] ", desc(),
            " is a meta tensor and has no data");
  NXD_CHECK(s->has_data(), "[Tensor::data] ", desc(),
            " has its storage released (a ZeRO-3 parameter outside its unit's gather)");
  return static_cast<char*>(s->data()) + offset() * element_size();
}

void Tensor::check_raw(const char* op) const {
  if (requires_grad() && GradMode::is_enabled())
    throw InvalidArgument(str("[Tensor::", op, "] ", desc(),
                              " requires grad and grad mode is on: a raw view or copy would "
                              "leave the autograd graph; use nxd::",
                              op, " (nxd/autograd/ops.h), or detach() first"));
}

static int64_t linear_offset(const Tensor& t, const std::vector<int64_t>& idx, const char* op) {
  NXD_CHECK_SHAPE(static_cast<int64_t>(idx.size()) == t.dim(), "[", op, "] ", idx.size(),
                  " indices for ", t.desc());
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    int64_t v = idx[i] < 0 ? idx[i] + t.shape()[i] : idx[i];
    NXD_CHECK_SHAPE(v >= 0 && v < t.shape()[i], "[", op, "] index ", idx[i],
                    " out of range for dim ", i, " of ", t.desc());
    off += v * t.strides()[i];
  }
  return off;
}

double Tensor::at(std::initializer_list<int64_t> idx) const {
  return at(std::vector<int64_t>(idx));
}

double Tensor::at(const std::vector<int64_t>& idx) const {
  check_host_read("Tensor::at", *this);
  int64_t off = linear_offset(*this, idx, "at");
  return dispatch(dtype(), [&]<class T>() { return to_double(static_cast<T*>(raw_data())[off]); });
}

void Tensor::set(const std::vector<int64_t>& idx, double v) const {
  int64_t off = linear_offset(*this, idx, "set");
  dispatch(dtype(), [&]<class T>() { static_cast<T*>(raw_data())[off] = from_double<T>(v); });
}

double Tensor::item() const {
  check_host_read("Tensor::item", *this);
  NXD_CHECK_SHAPE(numel() == 1, "[item] needs a one-element tensor, got ", desc());
  return dispatch(dtype(), [&]<class T>() { return to_double(static_cast<T*>(raw_data())[0]); });
}

std::vector<double> Tensor::to_vector() const {
  return to_vector_as<double>();
}

template <class T>
std::vector<T> Tensor::to_vector_as() const {
  check_host_read("Tensor::to_vector", *this);
  Tensor c = detach().to(dtype_of<T>()).contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}
template std::vector<float> Tensor::to_vector_as<float>() const;
template std::vector<double> Tensor::to_vector_as<double>() const;
template std::vector<int32_t> Tensor::to_vector_as<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector_as<int64_t>() const;

// ---------- views ----------

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

// ---------- copies ----------

void for_each_run(const Shape& shape, const Shape& as, const Shape& bs,
                  const std::function<void(int64_t, int64_t, int64_t, int64_t, int64_t)>& f) {
  int64_t nd = static_cast<int64_t>(shape.size());
  if (shape_numel(shape) == 0) return;
  if (nd == 0) {
    f(0, 0, 1, 1, 1);
    return;
  }
  int64_t inner = shape[nd - 1];
  std::vector<int64_t> idx(nd, 0);
  int64_t a = 0, b = 0;
  while (true) {
    f(a, b, inner, as[nd - 1], bs[nd - 1]);
    int64_t d = nd - 2;
    for (; d >= 0; --d) {
      ++idx[d];
      a += as[d];
      b += bs[d];
      if (idx[d] < shape[d]) break;
      a -= as[d] * shape[d];
      b -= bs[d] * shape[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  Shape bshape = broadcast_shapes(shape(), src.shape(), "copy_");
  NXD_CHECK_SHAPE(bshape == shape(), "[copy_] cannot copy ", src.desc(), " into ", desc());
  if (is_meta() || src.is_meta()) {
    NXD_CHECK(is_meta(), "[copy_] cannot copy meta tensor ", src.desc(), " into host tensor ",
              desc());
    return *this;
  }
  Tensor s = src.detach().expand(shape());
  if (is_contiguous() && s.is_contiguous()) {
    convert(raw_data(), dtype(), s.raw_data(), s.dtype(), numel());
    return *this;
  }
  char* dst = static_cast<char*>(raw_data());
  const char* sp = static_cast<const char*>(s.raw_data());
  int64_t de = element_size(), se = s.element_size();
  DType dt = dtype(), st = s.dtype();
  for_each_run(shape(), strides(), s.strides(),
               [&](int64_t a, int64_t b, int64_t n, int64_t as, int64_t bs) {
                 if (as == 1 && bs == 1) {
                   convert(dst + a * de, dt, sp + b * se, st, n);
                 } else {
                   for (int64_t i = 0; i < n; ++i)
                     convert(dst + (a + i * as) * de, dt, sp + (b + i * bs) * se, st, 1);
                 }
               });
  return *this;
}

Tensor Tensor::contiguous() const {
  check_raw("contiguous");
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  check_raw("clone");
  Tensor r = make(shape(), dtype(), device());
  if (!is_meta()) r.copy_(*this);
  return r;
}

Tensor Tensor::to(DType dt) const {
  check_raw("to");
  if (dt == dtype()) return *this;
  Tensor r = make(shape(), dt, device());
  if (!is_meta()) r.copy_(*this);
  return r;
}

Tensor Tensor::detach() const {
  Tensor r = make_view(*this, shape(), strides(), offset());
  r.impl()->name = name();
  return r;
}

const Tensor& Tensor::fill_(double v) const {
  if (is_meta()) return *this;
  dispatch(dtype(), [&]<class T>() {
    T val = from_double<T>(v);
    T* base = static_cast<T*>(raw_data());
    if (is_contiguous()) {
      std::fill(base, base + numel(), val);
      return;
    }
    Shape zeros_st(dim(), 0);
    for_each_run(shape(), strides(), zeros_st,
                 [&](int64_t a, int64_t, int64_t n, int64_t as, int64_t) {
                   for (int64_t i = 0; i < n; ++i) base[a + i * as] = val;
                 });
  });
  return *this;
}

const Tensor& Tensor::set_requires_grad(bool on) const {
  NXD_CHECK(!on || is_floating(dtype()),
            "[set_requires_grad] only floating tensors can require "
            "grad, got ",
            desc());
  checked().requires_grad = on;
  return *this;
}

// ---------- printing ----------

std::string Tensor::desc() const {
  if (!impl_) return "<undefined>";
  return str(is_meta() ? "meta:" : "", dtype_name(dtype()), shape_str(shape()));
}

std::string Tensor::to_string(int64_t max_per_dim) const {
  if (!impl_) return "tensor(<undefined>)";
  std::ostringstream os;
  os << "tensor(" << desc();
  if (is_meta()) return os.str() + ")";
  os << ", ";
  std::vector<int64_t> idx(dim(), 0);
  bool integral = !is_floating(dtype());
  auto elem = [&](const std::vector<int64_t>& i) {
    double v = at(i);
    if (integral)
      os << static_cast<long long>(v);
    else
      os << std::setprecision(6) << v;
  };
  std::function<void(int64_t)> rec = [&](int64_t d) {
    if (d == dim()) {
      elem(idx);
      return;
    }
    os << "[";
    int64_t n = shape()[d];
    for (int64_t i = 0; i < n; ++i) {
      if (n > max_per_dim && i == max_per_dim / 2) {
        os << "..., ";
        i = n - max_per_dim / 2;
      }
      idx[d] = i;
      rec(d + 1);
      if (i + 1 < n) os << ", ";
    }
    os << "]";
  };
  rec(0);
  if (requires_grad()) os << ", requires_grad";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.to_string();
}

// ---------- creation ----------

Tensor empty(const Shape& shape, DType dtype, Device device) {
  return make(shape, dtype, device);
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = make(shape, dtype, device);
  if (device == Device::host && t.nbytes() > 0)  // an empty tensor has no storage pointer
    std::memset(t.raw_data(), 0, static_cast<size_t>(t.nbytes()));
  return t;
}

Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor full(const Shape& shape, double v, DType dtype, Device device) {
  Tensor t = make(shape, dtype, device);
  t.fill_(v);
  return t;
}

Tensor arange(int64_t end, DType dtype, Device device) {
  return arange(0.0, static_cast<double>(end), 1.0, dtype, device);
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  NXD_CHECK(step != 0, "[arange] step must be nonzero");
  int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((end - start) / step)));
  Tensor t = make({n}, dtype, device);
  if (device == Device::host)
    dispatch(dtype, [&]<class T>() {
      T* p = t.data<T>();
      for (int64_t i = 0; i < n; ++i) p[i] = from_double<T>(start + static_cast<double>(i) * step);
    });
  return t;
}

Tensor scalar(double v, DType dtype) {
  return full({}, v, dtype);
}
Tensor empty_like(const Tensor& t) {
  return make(t.shape(), t.dtype(), t.device());
}
Tensor empty_like(const Tensor& t, DType dtype) {
  return make(t.shape(), dtype, t.device());
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), t.dtype(), t.device());
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
  NXD_CHECK_SHAPE(static_cast<int64_t>(values.size()) == shape_numel(shape), "[from_vector] ",
                  values.size(), " values for shape ", shape_str(shape));
  Tensor t = make(shape, dtype_of<T>(), Device::host);
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}
template Tensor from_vector<float>(const std::vector<float>&, const Shape&);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&);
template Tensor from_vector<bf16>(const std::vector<bf16>&, const Shape&);

Tensor from_doubles(const std::vector<double>& values, const Shape& shape, DType dtype) {
  return from_vector<double>(values, shape).to(dtype);
}

// The tensors share dtype, device and shape except along dim d (d = -1: the whole shape).
static void check_cat(const std::vector<Tensor>& ts, int64_t d, const char* op) {
  NXD_CHECK(!ts.empty(), "[", op, "] needs at least one tensor");
  for (size_t i = 1; i < ts.size(); ++i) {
    NXD_CHECK(ts[i].dtype() == ts[0].dtype(), "[", op, "] dtype mismatch: tensor 0 is ",
              ts[0].desc(), ", tensor ", i, " is ", ts[i].desc());
    NXD_CHECK(ts[i].device() == ts[0].device(), "[", op, "] device mismatch: ", ts[0].desc(),
              " vs ", ts[i].desc());
    bool ok = ts[i].dim() == ts[0].dim();
    for (int64_t k = 0; ok && k < ts[0].dim(); ++k)
      ok = k == d || ts[i].shape()[k] == ts[0].shape()[k];
    NXD_CHECK_SHAPE(ok, "[", op, "] shapes differ outside dim ", d, ": tensor 0 is ", ts[0].desc(),
                    ", tensor ", i, " is ", ts[i].desc());
  }
}

Tensor cat_raw(const std::vector<Tensor>& ts, int64_t dim) {
  NXD_CHECK(!ts.empty(), "[cat] needs at least one tensor");
  int64_t d = wrap_dim(dim, ts[0].dim(), "cat");
  check_cat(ts, d, "cat");
  Shape sh = ts[0].shape();
  sh[d] = 0;
  for (auto& t : ts) sh[d] += t.shape()[d];
  Tensor out = make(sh, ts[0].dtype(), ts[0].device());
  if (out.is_meta()) return out;
  int64_t pos = 0;
  for (auto& t : ts) {
    out.narrow(d, pos, t.shape()[d]).copy_(t.detach());
    pos += t.shape()[d];
  }
  return out;
}

Tensor stack_raw(const std::vector<Tensor>& ts, int64_t dim) {
  NXD_CHECK(!ts.empty(), "[stack] needs at least one tensor");
  int64_t d = wrap_dim(dim, ts[0].dim() + 1, "stack");
  check_cat(ts, /*d=*/-1, "stack");  // every dim must match
  std::vector<Tensor> us;
  for (auto& t : ts) us.push_back(t.detach().unsqueeze(d));
  return cat_raw(us, d);
}

}  // namespace nxd
