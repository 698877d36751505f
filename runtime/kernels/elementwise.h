#pragma once
// Elementwise kernels with NumPy broadcasting. f32 and f64 compute natively (contiguous runs are
// plain loops the compiler vectorizes; other layouts go through a coalescing strided walk); bf16
// is computed in f32 and rounded once. Inputs broadcast to the output's shape; all operands share
// one dtype. A meta output computes nothing but charges the cost.
#include <cstdint>

#include "nxd/runtime/tensor.h"

namespace nxd::kernels {

enum class Unary : uint8_t {
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  tanh,
  sigmoid,
  relu,
  square,
  abs,
  pow,         // x^p
  add_scalar,  // x + p
  mul_scalar,  // x * p
};
const char* unary_name(Unary op);

enum class Binary : uint8_t { add, sub, mul, div, maximum, minimum };
const char* binary_name(Binary op);

// out[S] = f(x[S']) with S' broadcasting to S; `p` is the scalar of pow/add_scalar/mul_scalar.
void unary(const Tensor& out, const Tensor& x, Unary op, double p = 0.0);

// Which saved tensor unary_backward needs: the input x, the output y = f(x), or neither.
enum class UnarySaves : uint8_t { none, input, output };
UnarySaves unary_backward_saves(Unary op);

// dx[S] = dy[S] * f'(x), with f' evaluated from x or y = f(x) as unary_backward_saves(op) says
// (pass the other as an undefined Tensor). x or y broadcast to dx's shape.
void unary_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& y, Unary op,
                    double p = 0.0);

// out[S] = a[Sa] (op) b[Sb], with Sa and Sb broadcasting to S.
void binary(const Tensor& out, const Tensor& a, const Tensor& b, Binary op);

namespace ref {
// Element-by-element through double; same contracts.
void unary(const Tensor& out, const Tensor& x, Unary op, double p = 0.0);
void unary_backward(const Tensor& dx, const Tensor& dy, const Tensor& x, const Tensor& y, Unary op,
                    double p = 0.0);
void binary(const Tensor& out, const Tensor& a, const Tensor& b, Binary op);
}  // namespace ref

}  // namespace nxd::kernels
