#pragma once
// Tensor: a cheap handle on a shared TensorImpl (shape, strides, offset, dtype, storage, and the
// autograd state). Copying a Tensor copies the handle; identity is the impl pointer. Views share
// storage.
//
// The methods here are the *raw* layer: views, copies and element access that never record an
// autograd graph. The differentiable forms of the same operations are free functions in nxd::
// (nxd/autograd/ops.h). So that nothing silently leaves the graph, a raw view or copy of a tensor
// that requires grad throws while grad mode is on; detach() it first, or use the nxd:: op.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "nxd/runtime/allocator.h"
#include "nxd/runtime/dtype.h"
#include "nxd/runtime/error.h"

namespace nxd {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[2,3,4]"
int64_t shape_numel(const Shape& s);
Shape contiguous_strides(const Shape& s);
// Normalizes a possibly negative dim for a tensor of rank `ndim`; throws naming `op`.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// NumPy broadcasting of two shapes; throws ShapeError naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

namespace autograd {
struct AutogradMeta;  // grad_fn, hooks: defined by autograd/
}

struct TensorImpl {
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;
  DType dtype = DType::f32;
  std::shared_ptr<Storage> storage;
  bool requires_grad = false;        // a leaf that wants .grad, or an output with a grad_fn
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient of a leaf
  std::shared_ptr<autograd::AutogradMeta> autograd;  // owned by autograd/
  std::string name;                                  // optional, for messages
};

// Grad mode (thread-local): when off, differentiable ops record nothing.
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool on);
};
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }

 private:
  bool prev_;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  const Shape& shape() const { return checked().shape; }
  const Shape& strides() const { return checked().strides; }
  int64_t offset() const { return checked().offset; }
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(shape()); }
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage->device(); }
  bool is_meta() const { return device() == Device::meta; }
  bool is_contiguous() const;
  int64_t element_size() const { return dtype_size(dtype()); }
  int64_t nbytes() const { return numel() * element_size(); }
  const std::shared_ptr<Storage>& storage() const { return checked().storage; }
  bool shares_storage(const Tensor& o) const { return storage() == o.storage(); }

  // Pointer to the first element (throws on meta tensors).
  void* raw_data() const;
  // Typed pointer; throws if T is not the tensor's dtype.
  template <class T>
  T* data() const {
    NXD_CHECK(dtype() == dtype_of<T>(), "[Tensor::data] tensor is ", dtype(), ", asked for ",
              dtype_of<T>());
    return static_cast<T*>(raw_data());
  }
  // Element access (any dtype, converted through double). Indices are bounds-checked.
  double at(std::initializer_list<int64_t> idx) const;
  double at(const std::vector<int64_t>& idx) const;
  void set(const std::vector<int64_t>& idx, double v) const;
  double item() const;                    // the single element of a one-element tensor
  std::vector<double> to_vector() const;  // all elements in row-major order
  template <class T>
  std::vector<T> to_vector_as() const;

  // ---- raw views (share storage) ----
  Tensor view(const Shape& shape) const;     // needs compatible strides; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // view if possible, else a contiguous copy
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor t() const;  // 2-D transpose
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;               // drops `dim`
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim) const;  // torch semantics
  std::vector<Tensor> split(int64_t split_size, int64_t dim) const;
  std::vector<Tensor> split(const std::vector<int64_t>& sizes, int64_t dim) const;
  Tensor expand(const Shape& shape) const;  // size-1 dims broadcast with stride 0; -1 keeps
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;

  // ---- raw copies ----
  Tensor contiguous() const;     // self if already contiguous
  Tensor clone() const;          // always a new contiguous copy
  Tensor to(DType dtype) const;  // self if same dtype; bf16 rounds to nearest even
  Tensor detach() const;         // same storage, no autograd state

  // ---- in place ----
  const Tensor& fill_(double v) const;
  const Tensor& zero_() const { return fill_(0.0); }
  // Copies src into this tensor, broadcasting src and converting its dtype.
  const Tensor& copy_(const Tensor& src) const;

  // ---- autograd state (the graph itself is managed by nxd/autograd) ----
  bool requires_grad() const { return checked().requires_grad; }
  const Tensor& set_requires_grad(bool on) const;
  Tensor grad() const { return Tensor(checked().grad); }
  void set_grad(const Tensor& g) const { checked().grad = g.impl_; }
  const std::string& name() const { return checked().name; }
  const Tensor& set_name(std::string n) const {
    checked().name = std::move(n);
    return *this;
  }

  std::string to_string(int64_t max_per_dim = 6) const;
  std::string desc() const;  // "f32[2,3]" (meta: "meta:f32[2,3]")

 private:
  TensorImpl& checked() const {
    if (!impl_) throw InvalidArgument("[Tensor] use of an undefined tensor");
    return *impl_;
  }
  void check_raw(const char* op) const;  // throws if requires grad while grad mode is on
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- creation (never part of a graph) ----
Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::host);
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::host);
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::host);
Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
            Device device = Device::host);
Tensor arange(int64_t end, DType dtype = DType::i64, Device device = Device::host);
Tensor arange(double start, double end, double step, DType dtype = DType::f32,
              Device device = Device::host);
Tensor scalar(double value, DType dtype = DType::f32);
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor empty_like(const Tensor& t, DType dtype);
// Tensor from values (row-major); numel must match the shape.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape);
Tensor from_doubles(const std::vector<double>& values, const Shape& shape,
                    DType dtype = DType::f32);
// Concatenation along an existing dim / stacking along a new one (raw, copies).
Tensor cat_raw(const std::vector<Tensor>& ts, int64_t dim);
Tensor stack_raw(const std::vector<Tensor>& ts, int64_t dim);

// Strided N-d iteration helper for kernels: calls f(dst_offset, src_offset, n) over runs of
// the innermost dimension; offsets are in elements relative to each tensor's first element.
void for_each_run(const Shape& shape, const Shape& a_strides, const Shape& b_strides,
                  const std::function<void(int64_t a_off, int64_t b_off, int64_t n, int64_t a_step,
                                           int64_t b_step)>& f);

}  // namespace nxd
