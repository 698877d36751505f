// Failure handling on the sim backend: every case ends with the right error within seconds.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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

// The all-reduce data path (each member reduces its 64-byte-aligned chunk from every member's
// buffer in rank order, in L1-sized blocks) against a serial rank-order reference, bitwise:
// group sizes 1-8, odd counts that do not divide by the group size or the block, f32 and bf16
// (summed in f32, rounded once), in place and out of place, with the thread timing shuffled on
// every run.
TEST(SimDeterminism, AllReduceIsBitwiseTheRankOrderSumAtOddSizes) {
  auto value = [](int r, int64_t i) {
    // Divisions and adds only: no multiply-add the compiler could contract into an FMA.
    const float v = 1.0f / float(1 + (i * 7919) % 1000 + 31 * r);
    return (r % 2 ? -v : v) + (r == 3 ? 1e4f : 0.0f);
  };
  for (DType t : {DType::f32, DType::bf16})
    for (int p = 1; p <= 8; ++p)
      for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{2049}, int64_t{40961}}) {
        // Serial reference: f32 accumulation in rank order, one rounding for bf16.
        std::vector<float> ref(n);
        for (int64_t i = 0; i < n; ++i) {
          auto in = [&](int r) {
            float v = value(r, i);
            return t == DType::bf16 ? float(bf16(v)) : v;
          };
          float acc = in(0);
          for (int r = 1; r < p; ++r) acc += in(r);
          ref[i] = t == DType::bf16 ? float(bf16(acc)) : acc;
        }
        for (int run = 0; run < 2; ++run) {
          std::vector<int> bad(p, 0);
          launch(p, [&] {
            const int r = world().rank();
            if ((r + run) % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
            std::vector<double> v(n);
            for (int64_t i = 0; i < n; ++i) v[i] = value(r, i);
            Tensor x = from_doubles(v, {n}, t), y = empty({n}, t);
            world().all_reduce(x.raw_data(), y.raw_data(), n, t, ReduceOp::sum);
            world().all_reduce(x);  // in place
            std::vector<double> got = x.to_vector(), got2 = y.to_vector();
            for (int64_t i = 0; i < n; ++i)
              if (float(got[i]) != ref[i] || float(got2[i]) != ref[i]) {
                bad[r] = 1;
                break;
              }
          });
          for (int r = 0; r < p; ++r)
            EXPECT_EQ(bad[r], 0) << "rank " << r << " of " << p << ", count " << n << ", " << t
                                 << ", run " << run;
        }
      }
}

// reduce_scatter and sub-groups take the same path: rank-order sums, bitwise.
TEST(SimDeterminism, ReduceScatterAndSubGroupsAreBitwiseTheRankOrderSum) {
  const int p = 6;
  const int64_t n = 1031;  // per member
  std::vector<int> bad(p, 0);
  launch(p, [&] {
    Communicator& w = world();
    const int r = w.rank();
    auto val = [](int g, int64_t i) { return 1.0f / float(g + 1) + 1.0f / float(i + 3); };
    std::vector<float> x(p * n), out(n);
    for (int64_t i = 0; i < p * n; ++i) x[i] = val(r, i);
    w.reduce_scatter(x.data(), out.data(), n, DType::f32, ReduceOp::sum);
    for (int64_t i = 0; i < n; ++i) {
      float acc = val(0, r * n + i);
      for (int g = 1; g < p; ++g) acc += val(g, r * n + i);
      if (out[i] != acc) bad[r] = 1;
    }
    // Odd world ranks in reverse order: the members' order is the group order.
    auto odd = w.split(r % 2, -r);
    std::vector<float> y(n);
    for (int64_t i = 0; i < n; ++i) y[i] = val(r, i);
    odd->all_reduce(y.data(), y.data(), n, DType::f32, ReduceOp::avg);
    for (int64_t i = 0; i < n; ++i) {
      float acc = val(odd->ranks()[0], i);
      for (int g = 1; g < odd->size(); ++g) acc += val(odd->ranks()[g], i);
      if (y[i] != acc / float(odd->size())) bad[r] = 2;
    }
  });
  for (int r = 0; r < p; ++r) EXPECT_EQ(bad[r], 0) << "rank " << r;
}

// More ranks than the process may start threads for (issue 34: nxd-ckpt import-hf --dp 100000
// aborted with SIGABRT): launch stops the ranks it started and throws a ConfigError naming the
// limit. Run in a child process whose address space is capped so thread stacks run out.
TEST(SimFailure, ThreadLimitIsAnErrorNamingTheResource) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    rlimit lim{};
    ::getrlimit(RLIMIT_AS, &lim);
    std::string out = "no error";
    const rlim_t cap = rlim_t{1} << 30;  // 1 GiB: about a hundred 8 MiB thread stacks
    lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, cap);
    ::setrlimit(RLIMIT_AS, &lim);
    try {
      LaunchOptions o;
      o.world_size = 4000;
      o.timeout_s = 20;
      launch(o, [] { world().barrier(); });
    } catch (const ConfigError& e) {
      out = std::string("ConfigError: ") + e.what();
    } catch (const std::exception& e) {
      out = std::string("other: ") + e.what();
    }
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t k; (k = ::read(fds[0], buf, sizeof buf)) > 0;)
    got.append(buf, static_cast<size_t>(k));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died by signal " << WTERMSIG(status);
  EXPECT_TRUE(has(got, "ConfigError: [sim::launch] cannot start the thread of rank")) << got;
  EXPECT_TRUE(has(got, "ulimit")) << got;
}
