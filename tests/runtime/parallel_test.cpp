#include "nxd/runtime/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "nxd/runtime/blas.h"
#include "nxd/runtime/error.h"

using namespace nxd;

namespace {
struct Threads {
  explicit Threads(int n) : old(blas::threads()) { blas::set_threads(n); }
  ~Threads() { blas::set_threads(old); }
  int old;
};
}  // namespace

TEST(Parallel, RunsEveryPartOnceWhateverTheThreadCount) {
  for (int t : {1, 2, 3}) {
    Threads g(t);
    EXPECT_EQ(parallel::threads(), t);
    for (int parts : {1, 2, 5, 17}) {
      std::vector<std::atomic<int>> hits(parts);
      parallel::run(parts, [&](int p) { hits[p]++; });
      for (int p = 0; p < parts; ++p) EXPECT_EQ(hits[p].load(), 1) << "t=" << t << " part " << p;
    }
  }
}

TEST(Parallel, ForCoversTheRangeWithDisjointBlocks) {
  Threads g(2);
  for (int64_t n : {0, 1, 7, 100, 1001}) {
    std::vector<int> seen(n, 0);
    parallel::parallel_for(n, 10, [&](int64_t b, int64_t e) {
      ASSERT_LE(0, b);
      ASSERT_LE(b, e);
      ASSERT_LE(e, n);
      for (int64_t i = b; i < e; ++i) seen[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "n=" << n << " i=" << i;
  }
}

TEST(Parallel, NestedAndConcurrentCallsRunSeriallyInsteadOfDeadlocking) {
  Threads g(2);
  std::atomic<int> inner{0};
  parallel::run(2, [&](int) {
    EXPECT_TRUE(parallel::in_parallel_region());
    parallel::parallel_for(100, 1, [&](int64_t b, int64_t e) { inner += static_cast<int>(e - b); });
  });
  EXPECT_EQ(inner.load(), 200);
  EXPECT_FALSE(parallel::in_parallel_region());
  // Two threads using the pool at once (as sim ranks would): both complete.
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int r = 0; r < 200; ++r)
      parallel::parallel_for(64, 1, [&](int64_t b, int64_t e) { total += e - b; });
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  EXPECT_EQ(total.load(), 2 * 200 * 64);
}

TEST(Parallel, AnExceptionInAPartReachesTheCallerAndThePoolStaysUsable) {
  Threads g(2);
  EXPECT_THROW(parallel::run(4,
                             [&](int p) {
                               if (p == 3) throw std::runtime_error("part 3 failed");
                             }),
               std::runtime_error);
  std::atomic<int> n{0};
  parallel::run(4, [&](int) { n++; });
  EXPECT_EQ(n.load(), 4);
}

TEST(Parallel, PollBudgetFromTheEnvironmentIsCheckedAndABadOneChangesNothing) {
  Threads one(1);
  ::setenv("NXD_POOL_SPIN_US", "abc", 1);
  try {
    parallel::resize(2);
    ADD_FAILURE() << "NXD_POOL_SPIN_US=abc was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("NXD_POOL_SPIN_US=abc"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parallel::threads(), 1);   // the pool is as it was
  for (const char* v : {"0", "20"}) {  // no polling, a short poll: the pool still runs every part
    ::setenv("NXD_POOL_SPIN_US", v, 1);
    parallel::resize(2);
    std::vector<std::atomic<int>> hits(64);
    for (int rep = 0; rep < 50; ++rep) parallel::run(64, [&](int p) { ++hits[p]; });
    for (auto& h : hits) EXPECT_EQ(h.load(), 50) << "NXD_POOL_SPIN_US=" << v;
    parallel::resize(1);
  }
  ::unsetenv("NXD_POOL_SPIN_US");
}
