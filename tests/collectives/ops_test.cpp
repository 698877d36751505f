// Every collective x dtype x group size 1-8 against a serial reference. Runs on the sim backend,
// and on MPI when the binary is started under mpirun (suite Coll only).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "nxd/collectives/algorithms/rdh.h"
#include "nxd/collectives/algorithms/ring.h"
#include "nxd/collectives/communicator.h"
#include "reference.h"
#include "support/compare.h"
#include "support/ranks.h"

using namespace nxd;
using nxd::testing::max_ranks;
using nxd::testing::run_ranks;
using namespace nxd::testing::coll;

namespace {

const int64_t kCounts[] = {1, 5, 1037};

// An in-place all-reduce algorithm (ring, rdh) on every dtype x op x count against the serial
// reference, the result bitwise equal on every rank; `name` starts the failure messages.
void expect_all_reduce_algorithm(
    Communicator& c, const char* name,
    const std::function<void(Communicator&, void*, int64_t, DType, ReduceOp)>& all_reduce) {
  const int p = c.size();
  for (DType t : kDtypes)
    for (ReduceOp op : ops_for(t))
      for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{1000}}) {  // counts not dividing p
        Tensor x = rank_tensor(c.rank(), n, t);
        all_reduce(c, x.raw_data(), n, t, op);
        EXPECT_TRUE(
            ::nxd::testing::close_rel(x, reference(p, n, t, op), tol(t),
                                      str(name, " p=", p, " ", t, " ", reduce_op_name(op))));
        expect_same_on_all_ranks(c, x);
      }
}

}  // namespace

TEST(Coll, AllReduceEveryDtypeOpAndSize) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      for (DType t : kDtypes)
        for (ReduceOp op : ops_for(t))
          for (int64_t n : kCounts) {
            Tensor ref = reference(p, n, t, op);
            Tensor x = rank_tensor(c.rank(), n, t);
            c.all_reduce(x, op);  // in place
            EXPECT_TRUE(::nxd::testing::close_rel(x, ref, backend_tol(t),
                                                  str("p=", p, " ", t, " ", reduce_op_name(op))));
            expect_same_on_all_ranks(c, x);
            Tensor y = empty({n}, t);
            c.all_reduce(rank_tensor(c.rank(), n, t), y, op);  // out of place
            EXPECT_EQ(0, std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()))
                << "in-place and out-of-place differ, p=" << p << " " << t;
          }
    });
  }
}

TEST(Coll, AllReduceAvgOnIntegersIsAnError) {
  run_ranks(1, [&] {
    Tensor x = zeros({4}, DType::i32);
    EXPECT_THROW(world().all_reduce(x, ReduceOp::avg), InvalidArgument);
  });
}

TEST(Coll, AllGatherFlatAndAlongDims) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      for (DType t : kDtypes)
        for (int64_t n : {int64_t{1}, int64_t{7}}) {
          Tensor x = rank_tensor(c.rank(), n, t);
          Tensor out = empty({p * n}, t);
          c.all_gather(x.raw_data(), out.raw_data(), n, t);
          std::vector<Tensor> parts;
          for (int r = 0; r < p; ++r) parts.push_back(rank_tensor(r, n, t));
          EXPECT_BITWISE_EQ(out, cat_raw(parts, 0));
          // In place: own block already in the output.
          Tensor in_place = empty({p * n}, t);
          in_place.narrow(0, c.rank() * n, n).copy_(x);
          c.all_gather(static_cast<char*>(in_place.raw_data()) + c.rank() * n * dtype_size(t),
                       in_place.raw_data(), n, t);
          EXPECT_BITWISE_EQ(in_place, out);
        }
      // Tensor form along the first, a middle and the last dim (NxD gathers the last dim and
      // the sequence dim).
      auto mk = [](int r) { return rank_tensor(r, 2 * 3 * 4, DType::f32).reshape({2, 3, 4}); };
      for (int64_t d : {0, 1, -1}) {
        Tensor got = c.all_gather(mk(c.rank()), d);
        std::vector<Tensor> parts;
        for (int r = 0; r < p; ++r) parts.push_back(mk(r));
        EXPECT_BITWISE_EQ(got, cat_raw(parts, d < 0 ? d + 3 : d));
      }
      // A non-contiguous input.
      Tensor nc = mk(c.rank()).transpose(0, 2);
      std::vector<Tensor> parts;
      for (int r = 0; r < p; ++r) parts.push_back(mk(r).transpose(0, 2).contiguous());
      EXPECT_BITWISE_EQ(c.all_gather(nc, 1), cat_raw(parts, 1));
    });
  }
}

TEST(Coll, ReduceScatterFlatAndAlongDims) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      for (DType t : kDtypes)
        for (ReduceOp op : ops_for(t)) {
          const int64_t n = 5;  // per rank
          Tensor x = rank_tensor(c.rank(), p * n, t);
          Tensor out = empty({n}, t);
          c.reduce_scatter(x.raw_data(), out.raw_data(), n, t, op);
          Tensor ref = reference(p, p * n, t, op).narrow(0, c.rank() * n, n).contiguous();
          EXPECT_TRUE(::nxd::testing::close_rel(out, ref, backend_tol(t), str("p=", p, " ", t)));
        }
      // Tensor form along dim 1 of [3, 2p, 2]: rank r keeps columns [2r, 2r+2).
      auto mk = [&](int r) {
        return rank_tensor(r, 3 * 2 * p * 2, DType::f32).reshape({3, 2 * p, 2});
      };
      Tensor got = c.reduce_scatter(mk(c.rank()), 1);
      Tensor full = zeros({3, 2 * p, 2});
      for (int r = 0; r < p; ++r) {
        Tensor acc = full.clone();
        std::vector<double> a = acc.to_vector(), b = mk(r).to_vector();
        for (size_t i = 0; i < a.size(); ++i) a[i] = float(float(a[i]) + float(b[i]));
        full = from_doubles(a, {3, 2 * p, 2});
      }
      EXPECT_CLOSE_REL(got, full.narrow(1, 2 * c.rank(), 2).contiguous(), 1e-6);
      if (p > 1) {
        EXPECT_THROW(c.reduce_scatter(zeros({3, 2 * p + 1}), 1), ShapeError);
      }
    });
  }
}

// The in-place forms ZeRO-1's buckets use: a reduce-scatter (blocking and non-blocking) whose
// recv is this member's block of its send buffer, and an all-gather whose send is this member's
// block of its recv buffer. (MPI's non-blocking reduce-scatter goes through MPI_IN_PLACE, the
// result moved into the block on completion.)
TEST(Coll, ReduceScatterAndAllGatherInPlaceInTheMembersBlock) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      for (DType t : {DType::f32, DType::bf16, DType::f64})
        for (bool async : {false, true}) {
          const int64_t n = 1037;  // per rank
          const int64_t es = dtype_size(t);
          Tensor x = rank_tensor(c.rank(), p * n, t);
          char* base = static_cast<char*>(x.raw_data());
          char* mine = base + c.rank() * n * es;
          if (async)
            c.ireduce_scatter(base, mine, n, t, ReduceOp::avg).wait();
          else
            c.reduce_scatter(base, mine, n, t, ReduceOp::avg);
          Tensor ref =
              reference(p, p * n, t, ReduceOp::avg).narrow(0, c.rank() * n, n).contiguous();
          EXPECT_TRUE(::nxd::testing::close_rel(
              x.narrow(0, c.rank() * n, n).contiguous(), ref, backend_tol(t),
              str("reduce_scatter in place p=", p, " ", t, async ? " async" : "")));
          // every member's block back into every member's buffer, in place
          c.all_gather(mine, base, n, t);
          for (int r = 0; r < p; ++r) {
            Tensor want = reference(p, p * n, t, ReduceOp::avg).narrow(0, r * n, n).contiguous();
            EXPECT_TRUE(::nxd::testing::close_rel(x.narrow(0, r * n, n).contiguous(), want,
                                                  backend_tol(t),
                                                  str("all_gather in place p=", p, " block ", r)));
          }
        }
    });
  }
}

TEST(Coll, BroadcastAndReduceFromEveryRoot) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      for (DType t : kDtypes)
        for (int root = 0; root < p; ++root) {
          Tensor x = rank_tensor(c.rank(), 9, t);
          c.broadcast(x, root);
          EXPECT_BITWISE_EQ(x, rank_tensor(root, 9, t));
          for (ReduceOp op : ops_for(t)) {
            Tensor y = rank_tensor(c.rank(), 9, t);
            c.reduce(y, root, op);
            if (c.rank() == root) {
              EXPECT_TRUE(::nxd::testing::close_rel(y, reference(p, 9, t, op), backend_tol(t),
                                                    str("reduce p=", p, " root=", root)));
            }
          }
        }
      EXPECT_THROW(c.broadcast(zeros({2}), p), InvalidArgument);
      // Flat reduce: non-roots need no recv buffer.
      Tensor x = rank_tensor(c.rank(), 9, DType::f32), out = zeros({9});
      c.reduce(x.raw_data(), c.rank() == 0 ? out.raw_data() : nullptr, 9, DType::f32, ReduceOp::sum,
               0);
      if (c.rank() == 0) {
        EXPECT_CLOSE_REL(out, reference(p, 9, DType::f32, ReduceOp::sum), 1e-6);
      }
    });
  }
}

TEST(Coll, AllToAllFlatAndTensor) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      for (DType t : kDtypes) {
        const int64_t n = 3;
        Tensor x = rank_tensor(c.rank(), p * n, t);
        Tensor out = empty({p * n}, t);
        c.all_to_all(x.raw_data(), out.raw_data(), n, t);
        for (int j = 0; j < p; ++j)
          EXPECT_BITWISE_EQ(out.narrow(0, j * n, n).contiguous(),
                            rank_tensor(j, p * n, t).narrow(0, c.rank() * n, n).contiguous());
      }
      // Split dim 0 of [2p, 3], concat along dim 1: [2, 3p].
      auto mk = [&](int r) { return rank_tensor(r, 2 * p * 3, DType::f32).reshape({2 * p, 3}); };
      Tensor got = c.all_to_all(mk(c.rank()), 0, 1);
      std::vector<Tensor> parts;
      for (int j = 0; j < p; ++j) parts.push_back(mk(j).narrow(0, 2 * c.rank(), 2).contiguous());
      EXPECT_BITWISE_EQ(got, cat_raw(parts, 1));
    });
  }
}

TEST(Coll, SendRecvRingAndNonBlocking) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      const int next = (c.rank() + 1) % p, prev = (c.rank() + p - 1) % p;
      for (DType t : kDtypes) {
        Tensor in = empty({6}, t);
        Work r = c.irecv(in, prev, 3);  // posted before the send: must not block
        c.send(rank_tensor(c.rank(), 6, t), next, 3);
        r.wait();
        EXPECT_BITWISE_EQ(in, rank_tensor(prev, 6, t));
      }
      // Two messages on one tag arrive in order; blocking recv into a strided tensor.
      Tensor a = rank_tensor(c.rank(), 4, DType::f32),
             b = rank_tensor(c.rank() + 10, 4, DType::f32);
      Work s1 = c.isend(a, next, 1), s2 = c.isend(b, next, 1);
      Tensor got = zeros({4, 2});
      c.recv(got.select(1, 0), prev, 1);
      c.recv(got.select(1, 1), prev, 1);
      s1.wait();
      s2.wait();
      EXPECT_BITWISE_EQ(got.select(1, 0).contiguous(), rank_tensor(prev, 4, DType::f32));
      EXPECT_BITWISE_EQ(got.select(1, 1).contiguous(), rank_tensor(prev + 10, 4, DType::f32));
    });
  }
}

// The receiver waits in recv before the sender sends (the sim backend then copies straight into
// the posted buffer): data, order on one tag, sizes that change from message to message (sim
// reuses and evicts its mailbox buffers), and a waiting recv whose count does not match.
TEST(Coll, SendRecvWhenTheReceiverWaitsFirst) {
  if (!run_ranks(2, [&] {
        Communicator& c = world();
        const int64_t sizes[] = {1 << 18, 3, 1 << 20, 1000, 1 << 16, 1 << 18, 7, 1 << 20, 5};
        if (c.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
          for (size_t k = 0; k < std::size(sizes); ++k)
            c.send(rank_tensor(static_cast<int>(k), sizes[k], DType::f32), 0, 2);
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
          c.send(rank_tensor(1, 5, DType::f32), 0, 4);
          return;
        }
        for (size_t k = 0; k < std::size(sizes); ++k) {
          Tensor got = empty({sizes[k]});
          c.recv(got, 1, 2);
          EXPECT_BITWISE_EQ(got, rank_tensor(static_cast<int>(k), sizes[k], DType::f32))
              << "message " << k;
        }
        Tensor wrong = empty({6});
        try {
          c.recv(wrong, 1, 4);
          ADD_FAILURE() << "recv of 6 elements accepted a message of 5";
        } catch (const CommError& e) {
          EXPECT_NE(std::string(e.what()).find("count 6"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("count 5"), std::string::npos) << e.what();
        }
      }))
    GTEST_SKIP() << "needs 2 ranks";
}

TEST(Coll, NonBlockingCollectives) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      Tensor x = rank_tensor(c.rank(), 33, DType::f32);
      Work w1 = c.iall_reduce(x);
      Tensor g = empty({p * 4}, DType::bf16);
      Work w2 = c.iall_gather(rank_tensor(c.rank(), 4, DType::bf16), g);
      Tensor rs = empty({2}, DType::f64);
      Work w3 = c.ireduce_scatter(rank_tensor(c.rank(), 2 * p, DType::f64), rs, ReduceOp::max);
      w1.wait();
      w2.wait();
      w3.wait();
      EXPECT_TRUE(w1.is_completed());
      EXPECT_CLOSE_REL(x, reference(p, 33, DType::f32, ReduceOp::sum), 1e-6);
      std::vector<Tensor> parts;
      for (int r = 0; r < p; ++r) parts.push_back(rank_tensor(r, 4, DType::bf16));
      EXPECT_BITWISE_EQ(g, cat_raw(parts, 0));
      EXPECT_CLOSE_REL(
          rs,
          reference(p, 2 * p, DType::f64, ReduceOp::max).narrow(0, 2 * c.rank(), 2).contiguous(),
          1e-12);
      // A strided tensor is copied back when the handle completes.
      Tensor m = rank_tensor(c.rank(), 12, DType::f32).reshape({3, 4});
      Tensor col = m.select(1, 2);
      c.iall_reduce(col).wait();
      EXPECT_CLOSE_REL(
          col.contiguous(),
          reference(p, 12, DType::f32, ReduceOp::sum).reshape({3, 4}).select(1, 2).contiguous(),
          1e-6);
    });
  }
}

TEST(Coll, SplitAndNewGroup) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      // Parity groups, ordered by descending world rank.
      auto g = c.split(c.rank() % 2, -c.rank());
      ASSERT_TRUE(g);
      std::vector<int> expect;
      for (int r = p - 1; r >= 0; --r)
        if (r % 2 == c.rank() % 2) expect.push_back(r);
      EXPECT_EQ(g->ranks(), expect);
      EXPECT_EQ(g->ranks()[g->rank()], c.rank());
      Tensor x = full({3}, c.rank() + 1.0, DType::i64);
      g->all_reduce(x);
      int64_t sum = 0;
      for (int r : expect) sum += r + 1;
      EXPECT_EQ(x.to_vector(), std::vector<double>(3, double(sum)));
      // new_group of the even ranks in reverse order; odd ranks get null.
      std::vector<int> evens;
      for (int r = p - 1; r >= 0; --r)
        if (r % 2 == 0) evens.push_back(r);
      auto e = c.new_group(evens);
      EXPECT_EQ(bool(e), c.rank() % 2 == 0);
      if (e) {
        EXPECT_EQ(e->ranks(), evens);
        Tensor b = full({2}, c.rank(), DType::f32);
        e->broadcast(b, 0);  // member 0 is the highest even rank
        EXPECT_EQ(b.to_vector(), std::vector<double>(2, double(evens[0])));
      }
      EXPECT_EQ(c.split(-1, 0), nullptr);
      c.barrier();
    });
  }
}

TEST(Coll, ZeroCountsAndMetaTensorsMoveNothing) {
  for (int p = 1; p <= std::min(3, max_ranks()); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      c.all_reduce(empty({0}));
      Tensor m = empty({4, 8}, DType::bf16, Device::meta);
      c.all_reduce(m);
      Tensor g = c.all_gather(m, 1);
      EXPECT_TRUE(g.is_meta());
      EXPECT_EQ(g.shape(), (Shape{4, 8 * p}));
      if (p <= 4 && 4 % p == 0) {
        EXPECT_EQ(c.reduce_scatter(m, 0).shape(), (Shape{4 / p, 8}));
      }
    });
  }
}

TEST(Coll, RingAlgorithmsOverPointToPoint) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      expect_all_reduce_algorithm(c, "ring",
                                  [](Communicator& g, void* buf, int64_t n, DType t, ReduceOp op) {
                                    algorithms::ring_all_reduce(g, {buf, buf, n, t, op});
                                  });
      for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{17}}) {
        auto [b, e] = algorithms::chunk_range(n, p, c.rank());
        EXPECT_EQ(e - b, n / p + (c.rank() < n % p ? 1 : 0));
      }
    });
  }
}

TEST(Coll, RecursiveHalvingDoublingOverPointToPoint) {
  for (int p = 1; p <= max_ranks(); ++p) {
    run_ranks(p, [&] {
      Communicator& c = world();
      expect_all_reduce_algorithm(c, "rdh",
                                  [](Communicator& g, void* buf, int64_t n, DType t, ReduceOp op) {
                                    algorithms::rdh_all_reduce(g, {buf, buf, n, t, op});
                                  });
      if ((p & (p - 1)) != 0) {
        Tensor in = zeros({4}), out = zeros({4 * p});
        EXPECT_THROW(algorithms::rdh_all_gather(c, {in.raw_data(), out.raw_data(), 4, DType::f32}),
                     InvalidArgument);
        return;
      }
      // Power-of-two groups: the two halves on their own (per-member counts).
      for (int64_t n : {int64_t{3}, int64_t{37}}) {
        const int r = c.rank();
        Tensor x = rank_tensor(r, p * n, DType::f64), mine = empty({n}, DType::f64);
        algorithms::rdh_reduce_scatter(c, {x.raw_data(), mine.raw_data(), n, DType::f64});
        EXPECT_CLOSE_REL(
            mine, reference(p, p * n, DType::f64, ReduceOp::sum).narrow(0, r * n, n).contiguous(),
            1e-12);
        Tensor own = rank_tensor(r, n, DType::i64, r * n), g = zeros({p * n}, DType::i64);
        algorithms::rdh_all_gather(c, {own.raw_data(), g.raw_data(), n, DType::i64});
        std::vector<Tensor> parts;
        for (int q = 0; q < p; ++q) parts.push_back(rank_tensor(q, n, DType::i64, q * n));
        EXPECT_BITWISE_EQ(g, cat_raw(parts, 0));
      }
    });
  }
}
