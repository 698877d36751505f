#pragma once
// What runtime/tensor.cpp and runtime/tensor_views.cpp share: a view's TensorImpl over a base's
// Storage. Not part of the public API.
#include "nxd/runtime/tensor.h"

namespace nxd::detail {

// A tensor of `shape` and `strides` from element `offset` of `base`'s storage (no copy, no check).
Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);

}  // namespace nxd::detail
