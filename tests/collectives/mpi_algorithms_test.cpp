// The MPI backend's algorithms (mpi::Tuning): MPI's own collectives, nxd's pipelined ring and
// recursive halving-doubling, each forced in turn, on all_reduce, reduce_scatter and all_gather
// against the serial reference; dropped non-blocking Works under MPI; the NXD_MPI_* environment.
// The MPI cases run when ctest starts the binary under mpirun (-np 2 and 4: groups of 2, 3 and 4).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "algorithm_checks.h"
#include "nxd/collectives/communicator.h"
#include "nxd/collectives/mpi/mpi.h"
#include "reference.h"
#include "support/compare.h"
#include "support/ranks.h"

using namespace nxd;
using nxd::testing::max_ranks;
using nxd::testing::run_ranks;
using nxd::testing::under_mpi;
using namespace nxd::testing::coll;

namespace {

struct AlgoCase {
  mpi::Algorithm algorithm;
  int64_t chunk_bytes;
  int depth;
  const char* name;
};

// Segments of 24 and 40 bytes cut every chunk into many uneven segments (more than the receives
// in flight); 1 MiB keeps each chunk in one segment.
const AlgoCase kAlgoCases[] = {
    {mpi::Algorithm::native, 256 << 10, 4, "mpi"},
    {mpi::Algorithm::ring, 24, 1, "ring chunk 24 B depth 1"},
    {mpi::Algorithm::ring, 40, 3, "ring chunk 40 B depth 3"},
    {mpi::Algorithm::ring, 1 << 20, 4, "ring chunk 1 MiB"},
    {mpi::Algorithm::rdh, 1 << 20, 4, "rdh"},
};

// Restores the process-wide tuning when a test ends.
struct TuningGuard {
  mpi::Tuning saved = mpi::tuning();
  ~TuningGuard() { mpi::set_tuning(saved); }
};

}  // namespace

TEST(Coll, MpiAlgorithmsMatchTheReference) {
  if (!under_mpi()) GTEST_SKIP() << "MPI backend only (ctest runs it under mpirun -np 2 and 4)";
  TuningGuard guard;
  for (const AlgoCase& k : kAlgoCases) {
    mpi::set_tuning({.algorithm = k.algorithm, .chunk_bytes = k.chunk_bytes, .depth = k.depth});
    for (int p = 2; p <= max_ranks(); ++p) {
      run_ranks(p, [&] {
        Communicator& c = world();
        // rdh's all_gather and reduce_scatter exist for power-of-two groups; the ring elsewhere.
        const bool pow2 = (p & (p - 1)) == 0;
        ASSERT_STREQ(mpi::algorithm_for(mpi::Op::all_gather, 1, p),
                     k.algorithm == mpi::Algorithm::native        ? "mpi"
                     : k.algorithm == mpi::Algorithm::rdh && pow2 ? "rdh"
                                                                  : "ring");
        for (DType t : kDtypes)
          for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{257}}) {  // below, at, above p
            const bool nb = n == 3;  // the non-blocking forms once per dtype
            for (ReduceOp op : ops_for(t)) {
              const std::string what = str(k.name, " p=", p, " ", t, " ", reduce_op_name(op),
                                           " n=", n, nb ? " non-blocking" : "");
              const bool ring = k.algorithm != mpi::Algorithm::native;  // nxd's: one order
              expect_all_reduce(c, {"all_reduce " + what, t, op, n, nb, ring});
              expect_reduce_scatter(c, {"reduce_scatter " + what, t, op, n, nb, ring});
            }
            expect_all_gather(c, {.what = str("all_gather ", k.name, " p=", p, " ", t, " n=", n),
                                  .dtype = t,
                                  .count = n,
                                  .nonblocking = nb});
          }
      });
    }
  }
}

TEST(Coll, MpiAutomaticAlgorithmFollowsTheThreshold) {
  TuningGuard guard;
  using mpi::Op;
  mpi::set_tuning(
      {.algorithm = mpi::Algorithm::automatic, .ring_min_bytes = 4096, .rs_ring_min_bytes = 512});
  EXPECT_STREQ(mpi::algorithm_for(Op::all_reduce, 4095, 2), "mpi");
  EXPECT_STREQ(mpi::algorithm_for(Op::all_reduce, 4096, 2), "ring");
  EXPECT_STREQ(mpi::algorithm_for(Op::reduce_scatter, 511, 2), "mpi");
  EXPECT_STREQ(mpi::algorithm_for(Op::reduce_scatter, 512, 2), "ring");
  EXPECT_STREQ(mpi::algorithm_for(Op::all_gather, 1 << 30, 2), "mpi");  // no cliff to avoid
  EXPECT_STREQ(mpi::algorithm_for(Op::all_reduce, 1 << 30, 1), "mpi");  // one member
  mpi::set_tuning({.algorithm = mpi::Algorithm::native});
  EXPECT_STREQ(mpi::algorithm_for(Op::all_reduce, 1 << 30, 4), "mpi");
  mpi::set_tuning({.algorithm = mpi::Algorithm::ring});
  EXPECT_STREQ(mpi::algorithm_for(Op::all_gather, 4, 3), "ring");
  EXPECT_THROW(mpi::set_tuning({.chunk_bytes = 0}), InvalidArgument);
  EXPECT_THROW(mpi::set_tuning({.depth = 0}), InvalidArgument);
}

TEST(Coll, MpiTuningFromTheEnvironment) {
  struct Env {
    const char* name;
    Env(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
    ~Env() { unsetenv(name); }
  };
  {
    Env a("NXD_MPI_ALGO", "ring"), b("NXD_MPI_CHUNK", "64K"), c("NXD_MPI_RING_MIN", "2M"),
        d("NXD_MPI_DEPTH", "3");
    mpi::Tuning t = mpi::tuning_from_env();
    EXPECT_EQ(t.algorithm, mpi::Algorithm::ring);
    EXPECT_EQ(t.chunk_bytes, 64 << 10);
    EXPECT_EQ(t.ring_min_bytes, 2 << 20);
    EXPECT_EQ(t.depth, 3);
  }
  {
    Env a("NXD_MPI_ALGO", "rdh"), b("NXD_MPI_RDH_MIN", "96K"), c("NXD_MPI_RS_RING_MIN", "1K"),
        d("NXD_MPI_AG_RING_MIN", "8M");
    mpi::Tuning t = mpi::tuning_from_env();
    EXPECT_EQ(t.algorithm, mpi::Algorithm::rdh);
    EXPECT_EQ(t.rdh_min_bytes, 96 << 10);
    EXPECT_EQ(t.rs_ring_min_bytes, 1 << 10);
    EXPECT_EQ(t.ag_ring_min_bytes, 8 << 20);
  }
  for (auto [var, bad, says] :
       {std::tuple{"NXD_MPI_ALGO", "fast", "must be auto, mpi, ring or rdh"},
        std::tuple{"NXD_MPI_CHUNK", "12X", "'12X' is not a size"},
        std::tuple{"NXD_MPI_AG_RING_MIN", "-1", "'-1' is not a size"},
        std::tuple{"NXD_MPI_CHUNK", "0", "between 1 byte and 1G"},
        std::tuple{"NXD_MPI_DEPTH", "2.5", "integer in [1, 64]"}}) {
    Env e(var, bad);
    try {
      mpi::tuning_from_env();
      ADD_FAILURE() << var << "=" << bad << " was accepted";
    } catch (const ConfigError& x) {
      EXPECT_NE(std::string(x.what()).find(says), std::string::npos) << x.what();
      EXPECT_NE(std::string(x.what()).find(var), std::string::npos) << x.what();
    }
  }
}

// A Work dropped without wait() releases its MPI request: a dropped receive is cancelled (with
// the request leaked and still posted, it would take the next message and the receive below
// would never complete), a dropped send is still delivered, a dropped collective completes.
TEST(Coll, MpiDroppedWorkReleasesItsRequest) {
  if (!under_mpi()) GTEST_SKIP() << "MPI backend only";
  run_ranks(2, [&] {
    Communicator& c = world();
    std::vector<int32_t> dropped(4, -1), got(4, -1), msg{1, 2, 3, 4};
    if (c.rank() == 0) {
      { Work w = c.irecv(dropped.data(), 4, DType::i32, 1, 7); }
      c.barrier();
      Work w = c.irecv(got.data(), 4, DType::i32, 1, 7);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!w.is_completed() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_TRUE(w.is_completed()) << "the message went to the dropped receive";
      EXPECT_EQ(got, msg);
      EXPECT_EQ(dropped, std::vector<int32_t>(4, -1));
      c.recv(got.data(), 4, DType::i32, 1, 8);  // from a dropped isend
      EXPECT_EQ(got, std::vector<int32_t>({5, 6, 7, 8}));
    } else {
      c.barrier();
      c.send(msg.data(), 4, DType::i32, 0, 7);
      std::vector<int32_t> later{5, 6, 7, 8};
      { Work w = c.isend(later.data(), 4, DType::i32, 0, 8); }
      c.barrier();  // `later` outlives the send
    }
    if (c.rank() == 0) c.barrier();
    Tensor x = rank_tensor(c.rank(), 5, DType::f32);
    { Work w = c.iall_reduce(x.raw_data(), x.raw_data(), 5, DType::f32, ReduceOp::avg); }
    EXPECT_TRUE(::nxd::testing::close_rel(x, reference(2, 5, DType::f32, ReduceOp::avg), 1e-6,
                                          "dropped iall_reduce(avg)"));
  });
}
