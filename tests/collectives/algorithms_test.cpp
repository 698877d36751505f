// The point-to-point algorithms (algorithms/ring.h, rdh.h) on a Communicator: the code the MPI
// backend runs (on MPI_Isend/MPI_Irecv), here on sim rank threads for groups of 1-8 (and on the
// MPI backend's own point to point under mpirun): every op x dtype x reduce op x count (below,
// at and above the group size, odd), unsegmented and cut into tiny pipelined segments, in place
// and out of place, against the serial reference, the results bitwise equal on every member.
#include <gtest/gtest.h>

#include "algorithm_checks.h"
#include "nxd/collectives/algorithms/rdh.h"
#include "nxd/collectives/algorithms/ring.h"
#include "nxd/collectives/communicator.h"
#include "reference.h"
#include "support/ranks.h"

using namespace nxd;
using nxd::testing::max_ranks;
using nxd::testing::run_ranks;
using namespace nxd::testing::coll;

namespace {

struct Algo {
  const char* name;
  bool rdh;  // recursive halving-doubling (reduce_scatter / all_gather: power-of-two groups)
  algorithms::P2pOptions options;
};

// Segments of 8 and 12 bytes cut every chunk into several pieces, more than the receives in
// flight, with a last piece shorter than the others.
const Algo kAlgos[] = {
    {"ring", false, {}},
    {"ring segment 8 B depth 1", false, {.pipeline = {.segment_bytes = 8, .depth = 1}}},
    {"ring segment 12 B depth 3", false, {.pipeline = {.segment_bytes = 12, .depth = 3}}},
    {"rdh", true, {}},
};

Calls algorithm_calls(Communicator& c, const Algo& a) {
  using algorithms::Call;
  const algorithms::P2pOptions o = a.options;
  auto reduce = [&c, o](auto f) {
    return [&c, o, f](const void* s, void* r, int64_t n, DType t, ReduceOp op) {
      f(c, Call{s, r, n, t, op}, o);
    };
  };
  auto gather = [&c, o](auto f) {
    return [&c, o, f](const void* s, void* r, int64_t n, DType t) { f(c, Call{s, r, n, t}, o); };
  };
  if (a.rdh)
    return {reduce(algorithms::rdh_all_reduce), reduce(algorithms::rdh_reduce_scatter),
            gather(algorithms::rdh_all_gather)};
  return {reduce(algorithms::ring_all_reduce), reduce(algorithms::ring_reduce_scatter),
          gather(algorithms::ring_all_gather)};
}

// RDH sums f32 as a tree, not in the serial reference's rank order: with values of magnitude ~3
// cancelling to ~0.3, 8 members' rounding differs by ~1e-6 of the result (p * eps * |values|).
double f32_tolerance(int p) {
  return 1e-6 * p;
}

}  // namespace

TEST(Coll, PointToPointAlgorithmsEveryOpDtypeAndCount) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      const bool pow2 = (p & (p - 1)) == 0;
      for (const Algo& a : kAlgos) {
        const Calls calls = algorithm_calls(c, a);
        for (DType t : kDtypes)
          for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{2 * p + 1}, int64_t{257}}) {
            for (ReduceOp op : ops_for(t)) {
              Check k{.dtype = t, .op = op, .count = n, .one_order = true};
              if (t == DType::f32) k.tolerance = f32_tolerance(p);
              const std::string what =
                  str(a.name, " p=", p, " ", t, " ", reduce_op_name(op), " n=", n);
              k.what = "all_reduce " + what;
              expect_all_reduce(c, k, calls, calls);
              k.what = "reduce_scatter " + what;
              if (!a.rdh || pow2) expect_reduce_scatter(c, k, calls, calls);
            }
            if (!a.rdh || pow2)
              expect_all_gather(c,
                                {.what = str("all_gather ", a.name, " p=", p, " ", t, " n=", n),
                                 .dtype = t,
                                 .count = n},
                                calls, calls);
          }
      }
    });
  }
}

TEST(Coll, PointToPointAlgorithmsRejectBadCalls) {
  run_ranks(3, [&] {
    Communicator& c = world();
    Tensor x = zeros({6}, DType::i32), y = zeros({18}, DType::i32);
    const algorithms::Call avg_int{x.raw_data(), x.raw_data(), 6, DType::i32, ReduceOp::avg};
    for (auto f : {algorithms::ring_all_reduce, algorithms::rdh_all_reduce,
                   algorithms::ring_reduce_scatter}) {
      try {
        f(c, avg_int, {});
        ADD_FAILURE() << "avg on i32 was accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("avg needs a floating dtype, got i32"),
                  std::string::npos)
            << e.what();
      }
    }
    try {  // a group of 3 is not a power of two
      algorithms::rdh_all_gather(c, {x.raw_data(), y.raw_data(), 6, DType::i32});
      ADD_FAILURE() << "rdh_all_gather on 3 members was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("needs a power-of-two group, got size 3"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(algorithms::ring_all_gather(c, {nullptr, y.raw_data(), 6, DType::i32}),
                 InvalidArgument);
  });
}
