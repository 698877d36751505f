#pragma once
// Shared by the collectives tests: the value each rank contributes, the serial reference of a
// reduction over ranks, tolerances per dtype and backend, and the cross-rank bitwise check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "support/ranks.h"

namespace nxd::testing::coll {

inline const DType kDtypes[] = {DType::f32, DType::bf16, DType::f64, DType::i32, DType::i64};

// The value rank r contributes at index i (exact in every dtype for integers).
inline double value(int r, int64_t i, DType t) {
  double v = double((r * 7 + i * 13) % 17) - 8.0;
  // std::fma: the same bits wherever the compiler inlines this (a contracted v * 0.37 + 0.01 * r
  // in one call site and not in another would make two ranks' "same" values differ).
  if (is_floating(t)) v = std::fma(v, 0.37, 0.01 * r);
  return v;
}

inline Tensor rank_tensor(int r, int64_t n, DType t, int64_t offset = 0) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(r, i + offset, t);
  return from_doubles(v, {n}, t);
}

// value() as stored in dtype t.
inline double stored(int r, int64_t i, DType t) {
  double v = value(r, i, t);
  if (t == DType::f32) return static_cast<float>(v);
  if (t == DType::bf16) return static_cast<float>(bf16(static_cast<float>(v)));
  return v;
}

// Serial reference of op over ranks 0..p-1 (in rank order, in the dtype's accumulation type).
inline Tensor reference(int p, int64_t n, DType t, ReduceOp op, int64_t offset = 0) {
  std::vector<double> out(n);
  auto combine = [op](auto acc, auto v) {
    return op == ReduceOp::max   ? std::max(acc, v)
           : op == ReduceOp::min ? std::min(acc, v)
                                 : acc + v;
  };
  for (int64_t i = 0; i < n; ++i) {
    if (t == DType::f32 || t == DType::bf16) {
      float acc = static_cast<float>(stored(0, i + offset, t));
      for (int r = 1; r < p; ++r) acc = combine(acc, static_cast<float>(stored(r, i + offset, t)));
      if (op == ReduceOp::avg) acc /= p;
      out[i] = acc;
    } else {
      double acc = stored(0, i + offset, t);
      for (int r = 1; r < p; ++r) acc = combine(acc, stored(r, i + offset, t));
      if (op == ReduceOp::avg) acc /= p;
      out[i] = acc;
    }
  }
  return from_doubles(out, {n}, t);
}

// bf16: the sim backend rounds once; MPI's user op rounds after every pairwise step.
inline double tol(DType t) {
  if (t == DType::bf16) return nxd::testing::under_mpi() ? 3e-2 : 1e-2;
  return t == DType::f32 ? 1e-6 : 1e-12;
}

// The backends' own collectives: the sim backend reduces bf16 in f32 in rank order and rounds
// once, exactly the serial reference, so its bf16 results must match bitwise; MPI keeps tol().
inline double backend_tol(DType t) {
  if (t == DType::bf16 && !::nxd::testing::under_mpi()) return 0;
  return tol(t);
}

// Every rank's `t` is bitwise equal to every other rank's (gathered through the group).
inline void expect_same_on_all_ranks(Communicator& c, const Tensor& t) {
  Tensor all = c.all_gather(t.reshape({1, t.numel()}), 0);
  for (int r = 0; r < c.size(); ++r)
    EXPECT_EQ(0, std::memcmp(all.select(0, r).contiguous().raw_data(), t.raw_data(), t.nbytes()))
        << "rank " << r << " differs from rank " << c.rank() << " for " << t.desc();
}

inline std::vector<ReduceOp> ops_for(DType t) {
  if (is_floating(t)) return {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  return {ReduceOp::sum, ReduceOp::max, ReduceOp::min};
}

}  // namespace nxd::testing::coll
