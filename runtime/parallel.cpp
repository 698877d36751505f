#include "nxd/runtime/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "nxd/runtime/error.h"

namespace nxd::parallel {

namespace {

thread_local bool t_in_region = false;
constexpr int64_t kDefaultSpinUs = 100;

struct RegionGuard {
  RegionGuard() { t_in_region = true; }
  ~RegionGuard() { t_in_region = false; }
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long a helper polls for the next job after finishing one, and the caller for the helpers'
// parts, before sleeping on the condition variable: a futex wake-up of an idle vCPU measured
// ~70-80 us on the 2-vCPU VM (nxd-bench-matmul --split-sweep), more than a whole split 128^3
// product, and a step runs hundreds of short pool jobs back to back. NXD_POOL_SPIN_US overrides
// (0: always sleep at once). Never spins when the pool has more threads than the hardware.
int64_t initial_spin_us() {
  if (const char* e = std::getenv("NXD_POOL_SPIN_US")) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    NXD_CHECK(end != e && *end == 0 && v >= 0, "[parallel] NXD_POOL_SPIN_US=", e,
              ": expected microseconds >= 0");
    return v;
  }
  return kDefaultSpinUs;
}

// Polls `done` for up to `us` microseconds; true if it became true. Pauses for the first few
// microseconds, then yields between polls: when the machine is oversubscribed the thread being
// waited for may need this core.
template <class Pred>
bool spin_until(int64_t us, Pred&& done) {
  if (us <= 0) return done();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::microseconds(us);
  const auto pause_until = start + std::chrono::microseconds(std::min<int64_t>(us, 5));
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) != 63) {
      cpu_relax();
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return done();
    if (now >= pause_until) std::this_thread::yield();
  }
}

// A fixed pool of helper threads. run() executes parts over the caller and the helpers (worker w
// runs parts w, w + W, ...), and returns when all are done. Between jobs a helper polls for the
// next one for spin_us() and then sleeps on a condition variable.
class Pool {
 public:
  void resize(int helpers) {
    // read (and check) the setting before stopping anything: a bad value leaves the pool as it was
    const unsigned hw = std::thread::hardware_concurrency();
    const int64_t spin = hw != 0 && static_cast<unsigned>(helpers + 1) > hw ? 0 : initial_spin_us();
    std::lock_guard run_lock(run_mu_);
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      stop_flag_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    stop_ = false;
    stop_flag_ = false;
    // New helpers start at the current generation: jobs that ran before they existed are not
    // theirs to run.
    const uint64_t start = generation_;
    spin_us_ = spin;
    for (int i = 0; i < helpers; ++i)
      workers_.emplace_back([this, i, start] { loop(i + 1, start); });
    helpers_.store(helpers);
  }
  int helpers() const { return helpers_.load(std::memory_order_relaxed); }

  // Returns false (and runs nothing) when another thread holds the pool.
  bool try_run(int parts, const std::function<void(int)>& fn) {
    std::unique_lock run_lock(run_mu_, std::try_to_lock);
    if (!run_lock.owns_lock()) return false;
    const int workers = std::min(parts, helpers() + 1);
    {
      std::lock_guard lk(mu_);
      fn_ = &fn;
      parts_ = parts;
      stride_ = workers;
      pending_ = workers - 1;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    std::exception_ptr mine;
    {
      RegionGuard g;
      try {
        for (int p = 0; p < parts; p += workers) fn(p);
      } catch (...) {
        mine = std::current_exception();
      }
    }
    spin_until(spin_us_, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
    fn_ = nullptr;
    std::exception_ptr err = mine ? mine : error_;
    error_ = nullptr;
    lk.unlock();
    if (err) std::rethrow_exception(err);
    return true;
  }

 private:
  void loop(int id, uint64_t seen) {
    t_in_region = true;
    std::unique_lock lk(mu_);
    while (true) {
      if (!stop_ && generation_ == seen) {
        lk.unlock();
        spin_until(spin_us_, [&] {
          return stop_flag_.load(std::memory_order_acquire) ||
                 generation_.load(std::memory_order_acquire) != seen;
        });
        lk.lock();
      }
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= stride_) continue;
      const auto* fn = fn_;
      const int parts = parts_, stride = stride_;
      lk.unlock();
      std::exception_ptr err;
      try {
        for (int p = id; p < parts; p += stride) (*fn)(p);
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
  std::mutex run_mu_, mu_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  std::atomic<int> helpers_{0};
  const std::function<void(int)>* fn_ = nullptr;
  int parts_ = 0, stride_ = 0;
  std::atomic<int> pending_{0};          // written under mu_; the caller polls it while spinning
  std::atomic<uint64_t> generation_{0};  // written under mu_; helpers poll it while spinning
  bool stop_ = false;
  std::atomic<bool> stop_flag_{false};  // stop_ for the spinning helpers
  int64_t spin_us_ = 0;                 // set by resize() while no helper runs
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: helpers must not be joined during exit
  return *p;
}

}  // namespace

int threads() {
  return pool().helpers() + 1;
}

void resize(int n) {
  NXD_CHECK(n >= 1, "[parallel::resize] need threads >= 1, got ", n);
  NXD_CHECK(!t_in_region, "[parallel::resize] called from inside a parallel region");
  if (pool().helpers() != n - 1) pool().resize(n - 1);
}

bool in_parallel_region() {
  return t_in_region;
}

void run(int parts, const std::function<void(int)>& fn) {
  if (parts <= 0) return;
  if (parts == 1 || t_in_region || pool().helpers() == 0 || !pool().try_run(parts, fn)) {
    for (int p = 0; p < parts; ++p) fn(p);  // serial: every part, in order, on the caller
  }
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t parts = std::min<int64_t>(threads(), std::max<int64_t>(1, n / grain));
  if (parts <= 1 || t_in_region) {
    fn(0, n);
    return;
  }
  const int64_t block = (n + parts - 1) / parts;
  run(static_cast<int>(parts), [&](int p) {
    const int64_t s = p * block, e = std::min(n, s + block);
    if (s < e) fn(s, e);
  });
}

}  // namespace nxd::parallel
