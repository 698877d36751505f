// The elementwise and row kernels give the same bits wherever their tensors lie: the same values
// at every alignment (a view at an offset, a scratch row wherever malloc puts it). Eigen computes
// the elements before a destination's first aligned packet with scalar code, so a kernel that
// assigns an expression with exp/tanh/erf straight into a tensor would fail here
// (log_softmax_backward did on an AVX2 build) unless it evaluates through aligned blocks
// (detail::assign_blocks); the norms' a * b + c expressions are covered too.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "nxd/runtime/kernels/activation.h"
#include "nxd/runtime/kernels/cross_entropy.h"
#include "nxd/runtime/kernels/elementwise.h"
#include "nxd/runtime/kernels/norm.h"
#include "support/compare.h"
#include "support/random.h"

using namespace nxd;
namespace k = nxd::kernels;

namespace {

Tensor randn(const Shape& s, DType dt, uint64_t seed) {
  return nxd::testing::randn_from(s, dt, {seed, 17}, 1.5);
}

// x's values in a fresh buffer starting `off` elements in, as a view of x's shape.
Tensor at_offset(const Tensor& x, int64_t off) {
  Tensor base = full({x.numel() + 16}, std::nan(""), x.dtype());
  Tensor v = base.narrow(0, off, x.numel()).view(x.shape());
  v.copy_(x);
  return v;
}

// Runs fn(inputs at offset, outputs at offset) for offsets 0..15; every output must be bitwise
// the offset-0 one.
void expect_address_free(
    const std::string& name, const std::vector<Tensor>& ins, const std::vector<Shape>& out_shapes,
    DType dt,
    const std::function<void(const std::vector<Tensor>&, const std::vector<Tensor>&)>& fn) {
  SCOPED_TRACE(name);
  std::vector<Tensor> first;
  for (int64_t off = 0; off < 16; ++off) {
    SCOPED_TRACE(off);
    std::vector<Tensor> in, out;
    for (const Tensor& t : ins) in.push_back(at_offset(t, off));
    for (const Shape& s : out_shapes) out.push_back(at_offset(zeros(s, dt), (off * 7) % 16));
    fn(in, out);
    if (off == 0) {
      for (const Tensor& o : out) first.push_back(o.clone());
      continue;
    }
    for (size_t i = 0; i < out.size(); ++i) EXPECT_BITWISE_EQ(out[i], first[i]);
  }
}

}  // namespace

class AddressFree : public ::testing::TestWithParam<DType> {};
INSTANTIATE_TEST_SUITE_P(Dtypes, AddressFree, ::testing::Values(DType::f32, DType::f64),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

TEST_P(AddressFree, Activations) {
  const DType dt = GetParam();
  const Shape s{5, 301};
  Tensor x = randn(s, dt, 1), y = randn(s, dt, 2), g = randn(s, dt, 3);
  for (bool th : {true, false})
    expect_address_free(th ? "gelu tanh" : "gelu erf", {x, g}, {s, s}, dt, [&](auto& in, auto& o) {
      k::gelu_forward(o[0], in[0], th);
      k::gelu_backward(o[1], in[1], in[0], th);
    });
  expect_address_free("silu", {x, g}, {s, s}, dt, [&](auto& in, auto& o) {
    k::silu_forward(o[0], in[0]);
    k::silu_backward(o[1], in[1], in[0]);
  });
  expect_address_free("swiglu", {x, y, g}, {s, s, s}, dt, [&](auto& in, auto& o) {
    k::swiglu_forward(o[0], in[0], in[1]);
    k::swiglu_backward(o[1], o[2], in[2], in[0], in[1]);
  });
  for (auto op : {k::Unary::exp, k::Unary::tanh, k::Unary::sigmoid})
    expect_address_free(k::unary_name(op), {x}, {s}, dt,
                        [&](auto& in, auto& o) { k::unary(o[0], in[0], op); });
  std::vector<double> ax = x.to_vector();
  for (double& v : ax) v = std::abs(v) + 1e-3;
  expect_address_free("log", {from_doubles(ax, s, dt)}, {s}, dt,
                      [&](auto& in, auto& o) { k::unary(o[0], in[0], k::Unary::log); });
}

TEST_P(AddressFree, NormsWithWeightsAndBias) {
  const DType dt = GetParam();
  const int64_t D = 203;
  const Shape s{4, D};
  Tensor x = randn(s, dt, 4), w = randn({D}, dt, 5), b = randn({D}, dt, 6), dy = randn(s, dt, 7);
  expect_address_free("layer_norm", {x, w, b, dy}, {s, {4}, {4}, s, {D}, {D}}, dt,
                      [&](auto& in, auto& o) {
                        k::layer_norm_forward(o[0], o[1], o[2], in[0], in[1], in[2], 1e-5);
                        k::layer_norm_backward(o[3], o[4], o[5], in[3], in[0], o[1], o[2], in[1]);
                      });
  expect_address_free("rms_norm", {x, w, dy}, {s, {4}, s, {D}}, dt, [&](auto& in, auto& o) {
    k::rms_norm_forward(o[0], o[1], in[0], in[1], 1e-6);
    k::rms_norm_backward(o[2], o[3], in[2], in[0], o[1], in[1]);
  });
}

TEST_P(AddressFree, CrossEntropy) {
  const DType dt = GetParam();
  const int64_t N = 6, V = 517;
  Tensor logits = randn({N, V}, dt, 8), dloss = randn({N}, dt, 9);
  Tensor targets = from_doubles({3, 0, 516, 100, 7, 42}, {N}, DType::i64);
  for (double ls : {0.0, 0.1})
    expect_address_free("cross_entropy ls=" + std::to_string(ls), {logits, dloss},
                        {{N}, {N}, {N, V}}, dt, [&](auto& in, auto& o) {
                          k::cross_entropy_forward(o[0], o[1], in[0], targets, -100, ls);
                          k::cross_entropy_backward(o[2], in[1], in[0], o[1], targets, -100, ls);
                        });
}
