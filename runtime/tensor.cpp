#include "nxd/runtime/tensor.h"

#include "nxd/runtime/tensor_internal.h"
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

namespace {

Tensor make(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    NXD_CHECK_SHAPE(d >= 0, "[empty] negative size in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->storage = Storage::allocate(shape_numel(shape) * dtype_size(dtype), device);
  return Tensor(std::move(impl));
}

}  // namespace

Tensor detail::make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
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
  Tensor r = detail::make_view(*this, shape(), strides(), offset());
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
