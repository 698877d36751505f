#pragma once
// Checks of one all_reduce, reduce_scatter or all_gather call of a communicator against the serial
// reference (reference.h), in place and out of place, blocking or not; shared by the tests of the
// MPI backend's algorithms (mpi_algorithms_test.cpp, mpi_thresholds_test.cpp) and of the
// algorithms on sim ranks (algorithms_test.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "reference.h"
#include "support/compare.h"

namespace nxd::testing::coll {

struct Check {
  std::string what;  // starts the failure messages
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int64_t count = 0;         // all_reduce: the array; reduce_scatter, all_gather: per member
  bool nonblocking = false;  // the first call through the i* form and wait()
  // nxd's algorithms reduce in one order: in place and out of place must then be bitwise equal
  // (OpenMPI picks different algorithms for those forms, so bf16 may differ there).
  bool one_order = false;
  double tolerance = -1;  // relative to the result's largest magnitude; < 0: tol(dtype)
  double tol() const { return tolerance >= 0 ? tolerance : ::nxd::testing::coll::tol(dtype); }
};

// The call under test: c.all_reduce etc., or an algorithm over point to point.
struct Calls {
  std::function<void(const void*, void*, int64_t, DType, ReduceOp)> all_reduce, reduce_scatter;
  std::function<void(const void*, void*, int64_t, DType)> all_gather;
};
inline Calls backend_calls(Communicator& c, bool nonblocking) {
  if (nonblocking)
    return {[&c](const void* s, void* r, int64_t n, DType t, ReduceOp op) {
              c.iall_reduce(s, r, n, t, op).wait();
            },
            [&c](const void* s, void* r, int64_t n, DType t, ReduceOp op) {
              c.ireduce_scatter(s, r, n, t, op).wait();
            },
            [&c](const void* s, void* r, int64_t n, DType t) { c.iall_gather(s, r, n, t).wait(); }};
  return {[&c](const void* s, void* r, int64_t n, DType t, ReduceOp op) {
            c.all_reduce(s, r, n, t, op);
          },
          [&c](const void* s, void* r, int64_t n, DType t, ReduceOp op) {
            c.reduce_scatter(s, r, n, t, op);
          },
          [&c](const void* s, void* r, int64_t n, DType t) { c.all_gather(s, r, n, t); }};
}

inline void expect_all_reduce(Communicator& c, const Check& k, const Calls& first,
                              const Calls& then) {
  const int p = c.size();
  const DType t = k.dtype;
  const int64_t n = k.count;
  Tensor ref = reference(p, n, t, k.op);
  Tensor x = rank_tensor(c.rank(), n, t);
  first.all_reduce(x.raw_data(), x.raw_data(), n, t, k.op);
  EXPECT_TRUE(close_rel(x, ref, k.tol(), k.what + " in place"));
  expect_same_on_all_ranks(c, x);
  Tensor in = rank_tensor(c.rank(), n, t), y = empty({n}, t);
  then.all_reduce(in.raw_data(), y.raw_data(), n, t, k.op);
  if (k.one_order)
    EXPECT_EQ(0, std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()))
        << k.what << ": in place and out of place differ";
  else
    EXPECT_TRUE(close_rel(y, ref, k.tol(), k.what + " out of place"));
  EXPECT_BITWISE_EQ(in, rank_tensor(c.rank(), n, t));  // the input is left alone
}

inline void expect_reduce_scatter(Communicator& c, const Check& k, const Calls& first,
                                  const Calls& then) {
  const int p = c.size(), r = c.rank();
  const DType t = k.dtype;
  const int64_t n = k.count, es = dtype_size(t);
  Tensor ref = reference(p, p * n, t, k.op).narrow(0, r * n, n).contiguous();
  Tensor x = rank_tensor(r, p * n, t), out = empty({n}, t);
  first.reduce_scatter(x.raw_data(), out.raw_data(), n, t, k.op);
  EXPECT_TRUE(close_rel(out, ref, k.tol(), k.what));
  EXPECT_BITWISE_EQ(x, rank_tensor(r, p * n, t));
  // In place: the result lands in this member's own block of the input.
  char* own = static_cast<char*>(x.raw_data()) + r * n * es;
  then.reduce_scatter(x.raw_data(), own, n, t, k.op);
  Tensor got = x.narrow(0, r * n, n).contiguous();
  if (k.one_order)
    EXPECT_TRUE(bitwise_equal(got, out, k.what + " in place"));
  else
    EXPECT_TRUE(close_rel(got, ref, k.tol(), k.what + " in place"));
}

inline void expect_all_gather(Communicator& c, const Check& k, const Calls& first,
                              const Calls& then) {
  const int p = c.size(), r = c.rank();
  const DType t = k.dtype;
  const int64_t n = k.count;
  std::vector<Tensor> parts;
  for (int q = 0; q < p; ++q) parts.push_back(rank_tensor(q, n, t, 1000 * q));
  Tensor want = cat_raw(parts, 0);
  Tensor x = rank_tensor(r, n, t, 1000 * r), out = empty({p * n}, t);
  first.all_gather(x.raw_data(), out.raw_data(), n, t);
  EXPECT_TRUE(bitwise_equal(out, want, k.what));
  Tensor in_place = zeros({p * n}, t);
  in_place.narrow(0, r * n, n).copy_(x);
  then.all_gather(static_cast<char*>(in_place.raw_data()) + r * n * dtype_size(t),
                  in_place.raw_data(), n, t);
  EXPECT_TRUE(bitwise_equal(in_place, want, k.what + " in place"));
}

// The backend's own calls (the first one non-blocking when k.nonblocking).
inline void expect_all_reduce(Communicator& c, const Check& k) {
  expect_all_reduce(c, k, backend_calls(c, k.nonblocking), backend_calls(c, false));
}
inline void expect_reduce_scatter(Communicator& c, const Check& k) {
  expect_reduce_scatter(c, k, backend_calls(c, k.nonblocking), backend_calls(c, false));
}
inline void expect_all_gather(Communicator& c, const Check& k) {
  expect_all_gather(c, k, backend_calls(c, k.nonblocking), backend_calls(c, false));
}

}  // namespace nxd::testing::coll
