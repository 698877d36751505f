// Failure handling on the sim backend: every case ends with the right error within seconds.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/sim/launch.h"

using namespace nxd;
using namespace nxd::sim;

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
bool has(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

// Launches `n` ranks running fn; every rank's CommError message is collected. Returns the
// message launch rethrew (expects a CommError).
std::string expect_comm_error(int n, const std::function<void()>& fn,
                              std::vector<std::string>* per_rank, double timeout = 20) {
  LaunchOptions o;
  o.world_size = n;
  o.timeout_s = timeout;
  per_rank->assign(n, "");
  std::mutex mu;
  auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    launch(o, [&] {
      try {
        fn();
      } catch (const CommError& e) {
        std::lock_guard lk(mu);
        (*per_rank)[world().rank()] = e.what();
        throw;
      }
    });
    ADD_FAILURE() << "expected CommError";
  } catch (const CommError& e) {
    msg = e.what();
  }
  EXPECT_LT(seconds_since(t0), 5.0) << msg;
  return msg;
}
}  // namespace

TEST(SimFailure, MismatchedOpsNameEveryRanksCall) {
  std::vector<std::string> r;
  std::string m = expect_comm_error(
      3,
      [] {
        Tensor x = ones({16});
        if (world().rank() == 1)
          world().broadcast(x, 0);
        else
          world().all_reduce(x);
      },
      &r);
  for (const std::string& s : r) {
    EXPECT_TRUE(has(s, "mismatched")) << s;
    EXPECT_TRUE(has(s, "rank 0: all_reduce(f32, count=16, sum)")) << s;
    EXPECT_TRUE(has(s, "rank 1: broadcast(f32, count=16, root=0)")) << s;
    EXPECT_TRUE(has(s, "rank 2: all_reduce")) << s;
  }
  EXPECT_TRUE(has(m, "[sim::launch] rank")) << m;
}

TEST(SimFailure, MismatchedDtypeCountAndRoot) {
  std::vector<std::string> r;
  expect_comm_error(
      2,
      [] {
        Tensor x = ones({8}, world().rank() == 0 ? DType::f32 : DType::bf16);
        world().all_reduce(x);
      },
      &r);
  EXPECT_TRUE(has(r[0], "rank 1: all_reduce(bf16")) << r[0];
  expect_comm_error(
      2, [] { world().all_gather(ones({4 + world().rank()}), 0); }, &r);
  EXPECT_TRUE(has(r[1], "count=4") && has(r[1], "count=5")) << r[1];
  expect_comm_error(
      2, [] { world().broadcast(ones({4}), world().rank()); }, &r);
  EXPECT_TRUE(has(r[0], "root=0") && has(r[0], "root=1")) << r[0];
}

TEST(SimFailure, MismatchedGroupsAreADeadlockNotAHang) {
  std::vector<std::string> r;
  std::string m = expect_comm_error(
      3,
      [] {
        auto g = world().new_group({0, 1});
        Tensor x = ones({4});
        if (world().rank() == 0)
          g->all_reduce(x);
        else
          world().all_reduce(x);
      },
      &r);
  EXPECT_TRUE(has(m, "deadlock")) << m;
  EXPECT_TRUE(has(m, "rank 0: all_reduce(f32, count=4, sum) #0 on group [0,1]")) << m;
  EXPECT_TRUE(has(m, "rank 1: all_reduce(f32, count=4, sum) #") && has(m, "on group [0,1,2]")) << m;
}

TEST(SimFailure, RankThatReturnsEarlyOrRecvWithoutSend) {
  std::vector<std::string> r;
  std::string m = expect_comm_error(
      2,
      [] {
        if (world().rank() == 0) world().barrier();
      },
      &r);
  EXPECT_TRUE(has(m, "rank 1: returned from its function")) << m;
  m = expect_comm_error(
      2,
      [] {
        Tensor x = ones({2});
        world().recv(x, 1 - world().rank());
      },
      &r);
  EXPECT_TRUE(has(m, "recv(f32, count=2) from rank 1")) << m;
}

TEST(SimFailure, OneRankThrowingStopsTheOthers) {
  std::vector<std::string> others(4);
  std::mutex mu;
  auto t0 = std::chrono::steady_clock::now();
  try {
    LaunchOptions o;
    o.world_size = 4;
    launch(o, [&] {
      if (world().rank() == 2) throw InvalidArgument("[my_op] boom at step 7");
      try {
        Tensor x = ones({8});
        world().all_reduce(x);
      } catch (const CommError& e) {
        std::lock_guard lk(mu);
        others[world().rank()] = e.what();
      }
    });
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_TRUE(has(m, "rank 2")) << m;
    EXPECT_TRUE(has(m, "[my_op] boom at step 7")) << m;
  }
  EXPECT_LT(seconds_since(t0), 5.0);
  for (int r : {0, 1, 3}) EXPECT_TRUE(has(others[r], "rank 2 failed")) << others[r];
}

TEST(SimFailure, RankThatNeverArrivesTimesOut) {
  std::vector<std::string> r;
  std::string m = expect_comm_error(
      2,
      [] {
        if (world().rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        Tensor x = ones({4});
        world().all_reduce(x);
      },
      &r, /*timeout=*/0.3);
  EXPECT_TRUE(has(m, "timed out after 0.3 s")) << m;
  EXPECT_TRUE(has(m, "rank 1: still running (never arrived)")) << m;
  EXPECT_TRUE(has(r[1], "stopped because rank 0 failed")) << r[1];
}

TEST(SimFailure, OutOfDeviceMemoryNamesRankAndCapacity) {
  LaunchOptions o;
  o.world_size = 2;
  o.memory_capacity = 1 << 20;
  try {
    launch(o, [] {
      Tensor a = empty({1 << 17});                           // 512 KiB
      if (world().rank() == 1) Tensor b = empty({1 << 18});  // +1 MiB
      world().barrier();
    });
    FAIL() << "expected OutOfDeviceMemory";
  } catch (const OutOfDeviceMemory& e) {
    std::string m = e.what();
    EXPECT_TRUE(has(m, "rank 1")) << m;
    EXPECT_TRUE(has(m, "1048576")) << m;
    EXPECT_TRUE(has(m, "524288")) << m;
  }
}

TEST(SimDeterminism, ReductionsAreBitwiseIdenticalAcrossRuns) {
  // Different thread timing on every run; the result must not change.
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 3; ++run) {
    std::vector<float> out;
    std::mutex mu;
    launch(5, [&] {
      const int r = world().rank();
      if ((r + run) % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      std::vector<float> v(1001);
      for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f / float(1 + i + 31 * r) + 1e7f * (r == 3);
      world().all_reduce(v.data(), v.data(), 1001, DType::f32, ReduceOp::sum);
      if (r == 4) {
        std::lock_guard lk(mu);
        out = v;
      }
    });
    runs.push_back(out);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(SimSelf, WorldOfOneIsZeroCopy) {
  // Without any launch, the default context is a world of one.
  Communicator& c = world();
  EXPECT_EQ(c.size(), 1);
  Tensor x = full({5}, 2.5);
  void* before = x.raw_data();
  c.all_reduce(x, ReduceOp::avg);
  EXPECT_EQ(x.raw_data(), before);
  EXPECT_EQ(x.to_vector(), std::vector<double>(5, 2.5));
  EXPECT_EQ(c.all_gather(x, 0).to_vector(), x.to_vector());
  c.send(x, 0, 7);
  Tensor y = zeros({5});
  c.recv(y, 0, 7);
  EXPECT_EQ(y.to_vector(), x.to_vector());
  EXPECT_THROW(c.recv(y, 0, 7), CommError);  // nothing left: a deadlock, reported
}
