// The MPI backend's automatic choice (mpi::Tuning, Algorithm::automatic) with data: every
// threshold is set to a small odd element count (so the test stays fast), and every op x dtype x
// reduce op runs below, at and above it, in place and out of place, blocking and not, against
// the serial reference, the result bitwise equal on every member; the algorithm the choice names
// is checked for each of those sizes. The ring runs with 24-byte segments and 2 receives in
// flight, so every chunk is cut into several pipelined pieces. Runs when ctest starts the binary
// under mpirun -np 2 and -np 4 (groups of 2, 3 and 4; label mpi).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "algorithm_checks.h"
#include "nxd/collectives/communicator.h"
#include "nxd/collectives/mpi/mpi.h"
#include "reference.h"
#include "support/ranks.h"

using namespace nxd;
using nxd::testing::max_ranks;
using nxd::testing::run_ranks;
using nxd::testing::under_mpi;
using namespace nxd::testing::coll;

namespace {

// From `count` elements per call (all_reduce: the array; reduce_scatter and all_gather: per
// member) `op` runs `from` instead of `below`.
struct Threshold {
  mpi::Op op;
  int64_t count;
  const char* below;
  const char* from;
};

// The thresholds of the automatic choice at odd counts, and the tuning that puts them there for
// dtype t on a group of p (the tuning is in bytes of the whole array).
std::vector<Threshold> thresholds() {
  return {{mpi::Op::all_reduce, 41, "mpi", "rdh"},
          {mpi::Op::all_reduce, 131, "rdh", "ring"},
          {mpi::Op::reduce_scatter, 23, "mpi", "ring"},
          {mpi::Op::all_gather, 29, "mpi", "ring"}};
}
mpi::Tuning tuning_for(DType t, int p) {
  const int64_t es = dtype_size(t);
  return {.algorithm = mpi::Algorithm::automatic,
          .rdh_min_bytes = 41 * es,
          .ring_min_bytes = 131 * es,
          .rs_ring_min_bytes = 23 * p * es,
          .ag_ring_min_bytes = 29 * p * es,
          .chunk_bytes = 24,
          .depth = 2};
}

int64_t bytes_of(mpi::Op op, int64_t count, DType t, int p) {
  return count * dtype_size(t) * (op == mpi::Op::all_reduce ? 1 : p);
}

const char* op_name(mpi::Op op) {
  return op == mpi::Op::all_reduce       ? "all_reduce"
         : op == mpi::Op::reduce_scatter ? "reduce_scatter"
                                         : "all_gather";
}

// One size class of one threshold: the named algorithm, then the data.
void check_size(Communicator& c, const Threshold& th, DType t, int64_t n) {
  const int p = c.size();
  const char* want = n < th.count ? th.below : th.from;
  ASSERT_STREQ(mpi::algorithm_for(th.op, bytes_of(th.op, n, t, p), p), want)
      << op_name(th.op) << " " << t << " n=" << n << " p=" << p;
  const bool nxd = std::string(want) != "mpi";  // nxd's algorithms reduce in one order
  Check k{.dtype = t, .count = n, .nonblocking = n == th.count, .one_order = nxd};
  const std::string what = str(op_name(th.op), " ", want, " p=", p, " ", t, " n=", n,
                               n == th.count ? " (at the threshold, non-blocking)" : "");
  if (th.op == mpi::Op::all_gather) {
    k.what = what;
    return expect_all_gather(c, k);
  }
  for (ReduceOp op : ops_for(t)) {
    k.op = op;
    k.what = what + " " + reduce_op_name(op);
    if (th.op == mpi::Op::all_reduce)
      expect_all_reduce(c, k);
    else
      expect_reduce_scatter(c, k);
  }
}

struct TuningGuard {
  mpi::Tuning saved = mpi::tuning();
  ~TuningGuard() { mpi::set_tuning(saved); }
};

}  // namespace

TEST(Coll, MpiAutomaticChoiceBelowAtAndAboveEveryThreshold) {
  if (!under_mpi()) GTEST_SKIP() << "MPI backend only (ctest runs it under mpirun -np 2 and 4)";
  TuningGuard guard;
  for (int p = 2; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      for (DType t : kDtypes) {
        mpi::set_tuning(tuning_for(t, p));
        for (const Threshold& th : thresholds())
          for (int64_t n : {th.count - 2, th.count, th.count + 2}) check_size(c, th, t, n);
      }
    });
  }
}
