#pragma once
// Helpers for the parallel-layer tests: deterministic inputs, running a body at a TP degree, and
// comparisons that record the largest relative difference seen (printed per test by rank 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>

#include "nxd/autograd/ops.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/runtime/init.h"
#include "support/compare.h"
#include "support/ranks.h"

namespace nxd::testing {

inline Tensor randn(const Shape& shape, uint64_t seed, double std = 1.0, DType dt = DType::f32) {
  Tensor t = zeros(shape, dt);
  init::normal(t, RngStream{seed, 4242}, 0.0, std);
  return t;
}

inline Tensor leaf(const Tensor& t) {
  return t.clone().set_requires_grad(true);
}

// The worst relative difference of the current test (over all ranks).
inline std::mutex& worst_mu() {
  static std::mutex m;
  return m;
}
inline double& worst_rel() {
  static double w = 0;
  return w;
}
inline std::string& worst_what() {
  static std::string s;
  return s;
}

// EXPECT max|a-b|/max|b| <= tol and records the difference.
inline void check_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  EXPECT_TRUE(close_rel(a.detach(), b.detach(), tol, what));
  if (a.shape() != b.shape()) return;
  double r = diff(a.detach(), b.detach()).rel();
  std::lock_guard<std::mutex> g(worst_mu());
  if (r > worst_rel()) worst_rel() = r, worst_what() = what;
}

// Runs body(tp group) on tp ranks with parallel_state initialized at TP = tp; prints the largest
// relative difference recorded.
inline void run_tp(int tp, const std::function<void(Communicator&)>& body) {
  {
    std::lock_guard<std::mutex> g(worst_mu());
    worst_rel() = 0;
    worst_what().clear();
  }
  run_ranks(tp, [&] {
    parallel_state::initialize_model_parallel(tp);
    body(parallel_state::get_tensor_model_parallel_group());
  });
  std::printf("    [tp=%d] largest relative difference %.3g (%s)\n", tp, worst_rel(),
              worst_what().c_str());
}

// This rank's chunk of dim (contiguous, like the mappings).
inline Tensor chunk_of(const Tensor& t, int64_t dim, int rank, int size) {
  int64_t d = wrap_dim(dim, t.dim(), "chunk_of");
  int64_t n = t.size(d) / size;
  return t.detach().narrow(d, rank * n, n).clone();
}

inline Tensor gathered(Communicator& g, const Tensor& t, int64_t dim) {
  return g.all_gather(t.detach().contiguous(), dim);
}

// check_close of every rank's shard `local` gathered along dim against the unsharded `full`.
inline void check_gathered(Communicator& g, const Tensor& local, int64_t dim, const Tensor& full,
                           double tol, const std::string& what) {
  check_close(gathered(g, local, dim), full, tol, what);
}

inline Tensor grad_of(const Tensor& t) {
  EXPECT_TRUE(t.grad().defined()) << "no gradient";
  return t.grad().defined() ? t.grad() : zeros(t.shape(), t.dtype());
}

constexpr int kDegrees[] = {1, 2, 4, 8};

}  // namespace nxd::testing
