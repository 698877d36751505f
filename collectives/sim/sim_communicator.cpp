// Sim backend: shared-memory collectives between rank threads.
//
// Every collective is a rendezvous of the group's members. Each member posts its call (op,
// dtype, count, root, buffers, ready time) in its slot of the group and arrives; when the last
// member arrives, every member reads all the calls, checks they match (all compute the same
// verdict, so all throw together), charges the modeled time of the collective to its SimClock,
// and moves data straight between the members' buffers. The data phase is a list of work items
// per member (64 KiB blocks of that member's result):
//   all_reduce      member i's items are the blocks of chunk i (64-byte aligned): each is
//                   reduced from every member's send buffer in rank order (L1-sized blocks)
//                   and stored into every member's recv buffer.
//   reduce_scatter  member i's items reduce block i of every send buffer in rank order.
//   all_gather, broadcast, all_to_all, reduce: copies (or the reduction) into member i's output.
// A member claims its own items first, then whatever is left of the others' (so a descheduled
// peer does not stall the call; the bits do not depend on who does an item), and the call
// completes when the group's count of remaining items reaches zero, which also keeps every
// buffer alive until the peers are done with it.
// Point to point: a send whose receiver is already waiting in the matching recv (same key,
// dtype and count) copies straight into the posted buffer (one copy, outside the world mutex;
// the receiver does not leave, even on abort, until that copy is done). Otherwise the send is
// buffered in a mailbox per (group, src, dst, tag) and recv copies it out; mailbox buffers come
// from a small pool, so a stream of large messages does not fault in fresh pages every time.
// Either way send returns without waiting for the receiver, and a key's messages arrive in order.
//
// Arrivals are rounds of the group: a member's k-th call is round k, which every member has
// reached when the group's arrival counter is (k+1) x size. The call slots, claim cursors and
// remaining-item counters are double-buffered by round parity (a member can be at most one
// round ahead of any peer). A waiting member spins briefly (only when the world has no more
// ranks than hardware threads, so a spinner never takes a core from the peer it waits for;
// adaptively), then sleeps on a futex. The last arriver wakes hardware_threads - 1 sleepers to
// share the data phase; the others sleep until it is done. A sleeping member is marked blocked
// under the world mutex, which also guards the mailboxes; a world-wide count of running ranks
// detects deadlock (every live rank blocked), and every wait has a deadline
// (LaunchOptions::timeout_s).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/runtime/context.h"

namespace nxd::sim {
namespace {

using Clock = std::chrono::steady_clock;

struct CallDesc {
  CollKind kind = CollKind::barrier;
  DType dtype = DType::f32;
  int64_t count = 0;
  int root = -1;
  ReduceOp rop = ReduceOp::sum;
  bool reduces = false;
  bool meta = false;
  const void* send = nullptr;
  void* recv = nullptr;
  double ready = 0;
  uint64_t seq = 0;

  std::string str() const {
    std::string s = str_kind();
    s += nxd::str("(", dtype, ", count=", count);
    if (reduces) s += nxd::str(", ", reduce_op_name(rop));
    if (root >= 0) s += nxd::str(", root=", root);
    if (meta) s += ", meta";
    return s + nxd::str(") #", seq);
  }
  std::string str_kind() const { return coll_kind_name(kind); }
  bool matches(const CallDesc& o) const {
    return kind == o.kind && dtype == o.dtype && count == o.count && root == o.root &&
           (!reduces || rop == o.rop) && meta == o.meta;
  }
};

// Sleep/wake on a 32-bit word (futex on Linux; a short sleep elsewhere).
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, double max_s) {
#if defined(__linux__)
  max_s = std::clamp(max_s, 1e-6, 1.0);
  timespec ts{static_cast<time_t>(max_s), static_cast<long>((max_s - double(time_t(max_s))) * 1e9)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
#else
  if (word->load() == seen) std::this_thread::sleep_for(std::chrono::microseconds(50));
#endif
}
void futex_wake(std::atomic<uint32_t>* word, int count) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr,
          0);
#else
  (void)word;
  (void)count;
#endif
}
void futex_wake_all(std::atomic<uint32_t>* word) {
  futex_wake(word, INT_MAX);
}
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

struct Group {
  explicit Group(std::vector<int> m)
      : members(std::move(m)), arrived_round(members.size()), blocked_round(members.size(), 0) {
    for (auto& slot : posted) slot.resize(members.size());
    name = "[";
    for (size_t i = 0; i < members.size(); ++i) {
      if (i) name += ',';
      name += std::to_string(members[i]);
    }
    name += "]";
  }
  std::vector<int> members;  // global ranks
  std::string name;
  // Arrivals over the group's life: round k is complete when it reaches (k+1) x size.
  alignas(64) std::atomic<uint64_t> arrivals{0};
  // Futex word, bumped when a round completes (and on abort); sleepers counts members that may
  // be asleep on it (the last arriver wakes them only then).
  alignas(64) std::atomic<uint32_t> wake{0};
  std::atomic<int> sleepers{0};
  alignas(64) std::array<std::vector<CallDesc>, 2> posted;  // by round parity
  std::vector<std::atomic<uint64_t>> arrived_round;         // per member: last round arrived + 1
  std::vector<uint64_t> blocked_round;  // per member: round + 1 it sleeps in (world mutex)
  // The data phase of the call of each round parity: member m's work items are claimed from
  // cursor[parity][m] (its own first, then by any member that has finished its own), and
  // `remaining` counts the call's items not yet done (each member adds its own before arriving).
  struct alignas(64) Cursor {
    std::atomic<int64_t> next{0};
  };
  struct alignas(64) Remaining {
    std::atomic<int64_t> items{0};
  };
  std::array<std::vector<Cursor>, 2> cursor{std::vector<Cursor>(members.size()),
                                            std::vector<Cursor>(members.size())};
  std::array<Remaining, 2> remaining;
};

struct Message {
  DType dtype;
  int64_t count;
  bool meta;
  double sent_at;
  std::vector<char> bytes;
};

struct RankState {
  enum S { running, blocked, done } s = running;
  std::string what;  // the call it is in
  std::string waiting_key;
  std::condition_variable cv;
  // The receive this rank waits in, for direct delivery: `open` while it may be claimed by a
  // sender of waiting_key, `filling` while that sender copies into `buf`, `filled` after.
  struct Posted {
    enum S { none, open, filling, filled } s = none;
    void* buf = nullptr;
    DType dtype = DType::f32;
    int64_t count = 0;
    double sent_at = 0;
  } posted;
};

// Mailbox buffers kept for reuse (at most kPoolBuffers, kPoolBytes in all).
constexpr size_t kPoolBuffers = 8;
constexpr size_t kPoolBytes = size_t{1} << 30;

struct World {
  World(int n, MachineSpec m, LaunchOptions o)
      : size(n), machine(std::move(m)), opts(std::move(o)), running(n), ranks(n) {}
  int size;
  MachineSpec machine;
  LaunchOptions opts;
  std::mutex mu;
  int running;
  std::deque<RankState> ranks;
  std::map<std::string, std::shared_ptr<Group>> groups;
  std::map<std::string, std::deque<Message>> mail;
  std::vector<std::vector<char>> spare;  // mailbox buffer pool
  size_t spare_bytes = 0;
  std::atomic<bool> aborted{false};
  double spin_s = 0;  // how long a waiting member spins before it sleeps
  int helpers = 1;    // sleepers woken to share a data phase (hardware threads - 1)
  std::string abort_msg;
  int fail_rank = -1;
  std::exception_ptr fail;

  void abort_locked(int rank, std::exception_ptr e, const std::string& msg) {
    if (aborted) return;
    fail_rank = rank;
    fail = std::move(e);
    abort_msg = msg;
    aborted.store(true);
    for (auto& [k, g] : groups) {
      g->wake.fetch_add(1);
      futex_wake_all(&g->wake);
    }
    for (auto& r : ranks) r.cv.notify_all();
  }
  // The smallest pooled buffer that holds `n` bytes (or an empty one).
  std::vector<char> take_buffer_locked(size_t n) {
    size_t best = spare.size();
    for (size_t i = 0; i < spare.size(); ++i)
      if (spare[i].capacity() >= n &&
          (best == spare.size() || spare[i].capacity() < spare[best].capacity()))
        best = i;
    if (best == spare.size()) return {};
    std::vector<char> b = std::move(spare[best]);
    spare.erase(spare.begin() + static_cast<std::ptrdiff_t>(best));
    spare_bytes -= b.capacity();
    return b;
  }
  // Keeps `b` for reuse and evicts the oldest buffers beyond the pool's limits into the result
  // (for the caller to free outside the mutex): a stream of new sizes replaces stale ones.
  std::vector<std::vector<char>> give_back_locked(std::vector<char>&& b) {
    std::vector<std::vector<char>> evicted;
    if (b.capacity() == 0) return evicted;
    spare_bytes += b.capacity();
    spare.push_back(std::move(b));
    size_t drop = 0;
    while (spare.size() - drop > kPoolBuffers || spare_bytes > kPoolBytes) {
      spare_bytes -= spare[drop].capacity();
      evicted.push_back(std::move(spare[drop++]));
    }
    spare.erase(spare.begin(), spare.begin() + static_cast<std::ptrdiff_t>(drop));
    return evicted;
  }
  void block_locked(int r, std::string what) {
    ranks[r].s = RankState::blocked;
    ranks[r].what = std::move(what);
    --running;
  }
  void unblock_locked(int r) {
    if (ranks[r].s == RankState::blocked) {
      ranks[r].s = RankState::running;
      ++running;
    }
  }
  std::string states_locked() const {
    std::string s;
    for (int r = 0; r < size; ++r) {
      s += str("\n  rank ", r, ": ");
      switch (ranks[r].s) {
        case RankState::running:
          s += "running";
          break;
        case RankState::blocked:
          s += ranks[r].what;
          break;
        case RankState::done:
          s += "returned from its function";
          break;
      }
    }
    return s;
  }
  // If no rank can make progress, aborts with every rank's call.
  void check_deadlock_locked(int me) {
    if (aborted.load() || running > 0) return;
    bool any_blocked = false;
    for (auto& r : ranks) any_blocked |= r.s == RankState::blocked;
    if (!any_blocked) return;
    std::string msg =
        str("[sim] deadlock: every live rank is blocked in a call no peer can match "
            "(mismatched groups or order, or a missing peer):",
            states_locked());
    abort_locked(me, std::make_exception_ptr(CommError(msg)), msg);
  }
  [[noreturn]] void throw_aborted_locked(const char* op, int me) const {
    throw CommError(
        str("[", op, "] rank ", me, " stopped because rank ", fail_rank, " failed: ", abort_msg));
  }
};

// Members of `g` that have not arrived at `round`.
std::string missing_str(const World& w, const Group& g, uint64_t round) {
  std::string s;
  for (size_t i = 0; i < g.members.size(); ++i) {
    if (g.arrived_round[i].load() > round) continue;
    int r = g.members[i];
    s += str("\n  rank ", r, ": ");
    switch (w.ranks[r].s) {
      case RankState::running:
        s += "still running (never arrived)";
        break;
      case RankState::blocked:
        s += w.ranks[r].what;
        break;
      case RankState::done:
        s += "returned from its function";
        break;
    }
  }
  return s;
}

class WaitFinish : public Work::Impl {
 public:
  WaitFinish(SimClock* c, double t, std::string name) : clock_(c), t_(t), name_(std::move(name)) {}
  void wait() override {
    if (clock_) clock_->wait_until(t_, "wait " + name_);
    clock_ = nullptr;
  }
  bool test() override { return true; }

 private:
  SimClock* clock_;
  double t_;
  std::string name_;
};

class SimCommunicator final : public Communicator {
 public:
  SimCommunicator(std::shared_ptr<World> w, std::shared_ptr<Group> g, int idx, std::string uid)
      : Communicator(idx, g->members), w_(std::move(w)), g_(std::move(g)), uid_(std::move(uid)) {}

  const char* backend() const override { return "sim"; }

  void all_reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    run(CollKind::all_reduce, s, r, n, t, op, true, -1, false);
  }
  void all_gather(const void* s, void* r, int64_t n, DType t) override {
    run(CollKind::all_gather, s, r, n, t, ReduceOp::sum, false, -1, false);
  }
  void reduce_scatter(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    run(CollKind::reduce_scatter, s, r, n, t, op, true, -1, false);
  }
  void broadcast(void* b, int64_t n, DType t, int root) override {
    run(CollKind::broadcast, b, b, n, t, ReduceOp::sum, false, root, false);
  }
  void reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op, int root) override {
    run(CollKind::reduce, s, r, n, t, op, true, root, false);
  }
  void all_to_all(const void* s, void* r, int64_t n, DType t) override {
    NXD_CHECK(!s || s != r, "[all_to_all] in-place all_to_all is not supported (group ", g_->name,
              ")");
    run(CollKind::all_to_all, s, r, n, t, ReduceOp::sum, false, -1, false);
  }
  void barrier() override {
    run(CollKind::barrier, nullptr, nullptr, 0, DType::f32, ReduceOp::sum, false, -1, false);
  }
  Work iall_reduce(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    return run(CollKind::all_reduce, s, r, n, t, op, true, -1, true);
  }
  Work iall_gather(const void* s, void* r, int64_t n, DType t) override {
    return run(CollKind::all_gather, s, r, n, t, ReduceOp::sum, false, -1, true);
  }
  Work ireduce_scatter(const void* s, void* r, int64_t n, DType t, ReduceOp op) override {
    return run(CollKind::reduce_scatter, s, r, n, t, op, true, -1, true);
  }
  Work ibroadcast(void* b, int64_t n, DType t, int root) override {
    return run(CollKind::broadcast, b, b, n, t, ReduceOp::sum, false, root, true);
  }

  void send(const void* buf, int64_t n, DType t, int dst, int tag) override;
  void recv(void* buf, int64_t n, DType t, int src, int tag) override;
  std::shared_ptr<Communicator> split(int color, int key) override;

 private:
  Work run(CollKind kind, const void* s, void* r, int64_t n, DType t, ReduceOp op, bool reduces,
           int root, bool async);
  // Waits until done() (spin, then sleep as a blocked rank; throws on abort or timeout). `call`
  // names the call in messages (formatted only when sleeping or failing).
  // `abortable` false: a world abort does not end the wait (the data phase of a call always
  // completes, and peers may still be writing into this member's buffers).
  template <class Done>
  void wait_for(uint64_t round, Done done, const char* op, const CallDesc& call,
                bool abortable = true);
  void release(uint64_t round, int count);
  int64_t items_of(const CallDesc& d, int m) const;
  void do_item(const std::vector<CallDesc>& calls, int m, int64_t j);
  int me() const { return ranks()[rank()]; }
  std::string mail_key(int src, int dst, int tag) const {
    return str(uid_, "|", src, ">", dst, "#", tag);
  }
  const GroupLinks& links() {
    if (!links_) links_ = group_links(w_->machine, ranks());
    return *links_;
  }

  std::shared_ptr<World> w_;
  std::shared_ptr<Group> g_;
  std::string uid_;
  uint64_t seq_ = 0, splits_ = 0, round_ = 0;
  std::optional<GroupLinks> links_;
  double spin_budget_ = 10e-6;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
};

// Unblocks (for deadlock accounting) the members asleep in `round` and wakes up to `count` of
// them; called after the condition they wait for became true.
void SimCommunicator::release(uint64_t round, int count) {
  World& w = *w_;
  Group& g = *g_;
  g.wake.fetch_add(1);
  if (g.sleepers.load() == 0) return;  // seq_cst: pairs with the sleepers' registration
  {
    std::lock_guard lk(w.mu);
    for (size_t m = 0; m < g.members.size(); ++m)
      if (g.blocked_round[m] == round + 1) {
        g.blocked_round[m] = 0;
        w.unblock_locked(g.members[m]);
      }
  }
  futex_wake(&g.wake, count);
}

template <class Done>
void SimCommunicator::wait_for(uint64_t round, Done done, const char* op, const CallDesc& call,
                               bool abortable) {
  World& w = *w_;
  Group& g = *g_;
  // Adaptive spin: the budget doubles (up to World::spin_s) when a spin ends with the condition
  // true and halves when the member had to sleep anyway (a loaded machine, or a slow peer).
  if (w.spin_s > 0) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(spin_budget_));
    for (int k = 0;; ++k) {
      if (done()) {
        spin_budget_ = std::min(w.spin_s, 2 * spin_budget_ + 1e-6);
        return;
      }
      if (abortable && w.aborted.load(std::memory_order_relaxed)) break;
      // Pause for the first few microseconds, then yield: when the peer waits for this core
      // (fewer free cores than expected), it runs instead of the spinner.
      if (k < 256)
        cpu_relax();
      else
        std::this_thread::yield();
      if ((k & 15) == 15 && Clock::now() >= until) break;
    }
    spin_budget_ = std::max(1e-6, spin_budget_ / 2);
  } else if (done()) {
    return;
  }
  const int i = rank();
  const std::string what = str(call.str(), " on group ", g.name);
  {
    std::unique_lock lk(w.mu);
    if (abortable && w.aborted.load()) {
      if (done()) return;
      w.throw_aborted_locked(op, me());
    }
    g.sleepers.fetch_add(1);
    if (done()) {
      g.sleepers.fetch_sub(1);
      return;
    }
    w.block_locked(me(), what);
    g.blocked_round[i] = round + 1;
    w.check_deadlock_locked(me());
  }
  const auto t0 = Clock::now();
  for (;;) {
    const uint32_t seen = g.wake.load();
    if (done() || (abortable && w.aborted.load())) break;
    const double left = w.opts.timeout_s - std::chrono::duration<double>(Clock::now() - t0).count();
    if (left <= 0) break;
    futex_wait(&g.wake, seen, left);
  }
  std::unique_lock lk(w.mu);
  g.sleepers.fetch_sub(1);
  if (g.blocked_round[i] == round + 1) {
    g.blocked_round[i] = 0;
    w.unblock_locked(me());
  }
  if (done()) return;
  if (abortable && w.aborted.load()) w.throw_aborted_locked(op, me());
  std::string msg = str("[", op, "] rank ", me(), " timed out after ", w.opts.timeout_s, " s in ",
                        what, "; ranks that never arrived:", missing_str(w, g, round));
  w.abort_locked(me(), std::make_exception_ptr(CommError(msg)), msg);
  throw CommError(msg);
}

namespace {
constexpr int64_t kItemBytes = 64 << 10;  // one work item of a data phase
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
// all_reduce: member m's chunk, 64-byte aligned so members never write the same cache line.
std::pair<int64_t, int64_t> ar_chunk(int64_t n, int p, int m, int64_t es) {
  const int64_t line = std::max<int64_t>(1, 64 / es);
  const int64_t per = ceil_div(ceil_div(n, p), line) * line;
  const int64_t lo = std::min<int64_t>(n, m * per);
  return {lo, std::min<int64_t>(n, lo + per)};
}
}  // namespace

// Work items of member m for the call `d` (the same on every member when the calls match).
int64_t SimCommunicator::items_of(const CallDesc& d, int m) const {
  const int p = size();
  if (d.meta || d.kind == CollKind::barrier || d.count == 0 || p == 1) return 0;
  const int64_t es = dtype_size(d.dtype), per_item = std::max<int64_t>(1, kItemBytes / es);
  const int64_t n = d.count;
  switch (d.kind) {
    case CollKind::all_reduce: {
      auto [lo, hi] = ar_chunk(n, p, m, es);
      return ceil_div(hi - lo, per_item);
    }
    case CollKind::reduce_scatter:
      return ceil_div(n, per_item);
    case CollKind::all_gather:
    case CollKind::all_to_all:
      return p * ceil_div(n, per_item);
    case CollKind::broadcast:
      return m == d.root ? 0 : ceil_div(n, per_item);
    case CollKind::reduce:
      return m == d.root ? ceil_div(n, per_item) : 0;
    default:
      return 0;
  }
}

// Item j of member m: a block of member m's result, reduced in rank order or copied.
void SimCommunicator::do_item(const std::vector<CallDesc>& calls, int m, int64_t j) {
  const CallDesc& d = calls[m];
  const int p = size();
  const int64_t es = dtype_size(d.dtype), per_item = std::max<int64_t>(1, kItemBytes / es);
  const int64_t n = d.count;
  auto snd = [&](int k) { return static_cast<const char*>(calls[k].send); };
  auto rcv = [&](int k) { return static_cast<char*>(calls[k].recv); };
  srcs_.resize(p);
  dsts_.resize(p);
  switch (d.kind) {
    case CollKind::all_reduce: {
      auto [lo, hi] = ar_chunk(n, p, m, es);
      const int64_t b = lo + j * per_item, len = std::min(per_item, hi - b);
      for (int k = 0; k < p; ++k) {
        srcs_[k] = snd(k) + b * es;
        const int dk = k == 0 ? m : (k <= m ? k - 1 : k);  // member m's buffer first
        dsts_[k] = rcv(dk) + b * es;
      }
      reduce_buffers_to(dsts_.data(), p, srcs_.data(), p, len, d.dtype, d.rop, p);
      break;
    }
    case CollKind::reduce_scatter: {
      const int64_t off = j * per_item, len = std::min(per_item, n - off);
      for (int k = 0; k < p; ++k) srcs_[k] = snd(k) + (m * n + off) * es;
      void* dst = rcv(m) + off * es;
      reduce_buffers_to(&dst, 1, srcs_.data(), p, len, d.dtype, d.rop, p);
      break;
    }
    case CollKind::all_gather:
    case CollKind::all_to_all: {
      const int64_t per = ceil_div(n, per_item);
      const int k = static_cast<int>(j / per);
      const int64_t off = (j % per) * per_item, len = std::min(per_item, n - off);
      const char* src = snd(k) + ((d.kind == CollKind::all_to_all ? m * n : 0) + off) * es;
      char* dst = rcv(m) + (k * n + off) * es;
      if (dst != src) std::memcpy(dst, src, len * es);
      break;
    }
    case CollKind::broadcast: {
      const int64_t off = j * per_item, len = std::min(per_item, n - off);
      std::memcpy(rcv(m) + off * es, rcv(d.root) + off * es, len * es);
      break;
    }
    case CollKind::reduce: {
      const int64_t off = j * per_item, len = std::min(per_item, n - off);
      for (int k = 0; k < p; ++k) srcs_[k] = snd(k) + off * es;
      void* dst = rcv(m) + off * es;
      reduce_buffers_to(&dst, 1, srcs_.data(), p, len, d.dtype, d.rop, p);
      break;
    }
    default:
      break;
  }
}

Work SimCommunicator::run(CollKind kind, const void* s, void* r, int64_t n, DType t, ReduceOp op,
                          bool reduces, int root, bool async) {
  const char* name = coll_kind_name(kind);
  check_args(name, n, t, op, reduces);
  if (root >= 0 || kind == CollKind::broadcast || kind == CollKind::reduce)
    check_member(name, "root", root);
  SimClock* clock = current_sim_clock();
  CallDesc d;
  d.kind = kind;
  d.dtype = t;
  d.count = n;
  d.root = root;
  d.rop = op;
  d.reduces = reduces;
  d.meta = s == nullptr && (r == nullptr || kind == CollKind::reduce) && kind != CollKind::barrier;
  d.send = s;
  d.recv = r;
  d.ready = clock ? std::max(clock->now(), clock->comm_free()) : 0;
  d.seq = seq_++;
  // reduce: only the root needs a recv buffer.
  const bool needs_recv = kind != CollKind::reduce || rank() == root;
  NXD_CHECK(d.meta || kind == CollKind::barrier || n == 0 ||
                ((r != nullptr || !needs_recv) && (s != nullptr || kind == CollKind::broadcast)),
            "[", name, "] null buffer with count ", n, " on group ", g_->name);

  World& w = *w_;
  Group& g = *g_;
  const int p = size(), i = rank();
  if (w.aborted.load(std::memory_order_acquire)) {
    std::lock_guard lk(w.mu);
    w.throw_aborted_locked(name, me());
  }
  // Round parity picks the slots; a peer cannot reuse them before this member arrives again.
  const uint64_t round = round_++;
  const int par = static_cast<int>(round & 1);
  std::vector<CallDesc>& calls = g.posted[par];
  calls[i] = d;
  const int64_t mine = items_of(d, i);
  g.cursor[par][i].next.store(0, std::memory_order_relaxed);
  if (mine > 0) g.remaining[par].items.fetch_add(mine);
  g.arrived_round[i].store(round + 1, std::memory_order_relaxed);
  const uint64_t target = (round + 1) * static_cast<uint64_t>(p);
  auto matched = [&] {
    for (int k = 1; k < p; ++k)
      if (!calls[k].matches(calls[0])) return false;
    return true;
  };
  if (g.arrivals.fetch_add(1) + 1 == target) {
    // Last to arrive. With data to move, the members that are awake (this one and any
    // spinner) do it, and only `helpers` sleepers are woken to share it; the others sleep on
    // until the data phase is done.
    const bool work = g.remaining[par].items.load() > 0 && matched();
    release(round, work ? w.helpers : INT_MAX);
  } else {
    wait_for(
        round, [&] { return g.arrivals.load() >= target; }, name, d);
  }
  if (!matched()) {
    if (mine > 0) g.remaining[par].items.fetch_sub(mine);
    std::string msg = str("[", name, "] mismatched collectives on group ", g.name, ":");
    for (int m = 0; m < p; ++m) msg += str("\n  rank ", ranks()[m], ": ", calls[m].str());
    throw CommError(msg);
  }

  // Simulated time: the collective starts when the last member is ready.
  double start = 0;
  for (int k = 0; k < p; ++k) start = std::max(start, calls[k].ready);
  const int64_t es = dtype_size(t);
  double bytes = double(n) * es;
  if (kind == CollKind::all_gather || kind == CollKind::reduce_scatter ||
      kind == CollKind::all_to_all)
    bytes *= p;
  double finish = start;
  if (clock) {
    CollCost cost = collective_cost(w.machine, kind, ranks(), links(), bytes, w.opts.algorithm);
    finish = start + cost.seconds;
    clock->record_comm(name, start, finish, async,
                       clock->recording() ? str("bytes=", bytes, " group=", g.name,
                                                " algo=", algorithm_name(cost.algorithm))
                                          : std::string());
  }

  if (!d.meta && kind != CollKind::barrier && n > 0 && p > 1) {
    // Data phase: this member's items first, then any items left to the others (a descheduled
    // peer's share is done by whoever runs). Each item is one block of one member's result.
    std::atomic<int64_t>& left = g.remaining[par].items;
    // Items done are counted locally and taken off `left` once (the shared counter would
    // otherwise bounce between the members' caches on every item).
    int64_t done = 0;
    for (int q = 0; q < p; ++q) {
      const int m = (i + q) % p;
      const int64_t items = q == 0 ? mine : items_of(d, m);
      if (items == 0) continue;
      std::atomic<int64_t>& next = g.cursor[par][m].next;
      for (;;) {
        const int64_t j = next.fetch_add(1);
        if (j >= items) break;
        do_item(calls, m, j);
        ++done;
      }
    }
    if (done > 0 && left.fetch_sub(done) == done) release(round, INT_MAX);  // the call's last
    // Completion: every member's result is written and nobody reads this member's buffers.
    wait_for(
        round, [&] { return left.load() == 0; }, name, d, /*abortable=*/false);
  } else if (!d.meta && n > 0 && p == 1 && s != r && s && r && kind != CollKind::broadcast) {
    std::memcpy(r, s, n * es);
  }
  if (async) return Work(std::make_shared<WaitFinish>(clock, finish, name));
  return Work();
}

void SimCommunicator::send(const void* buf, int64_t n, DType t, int dst, int tag) {
  check_member("send", "destination", dst);
  check_args("send", n, t, ReduceOp::sum, false);
  SimClock* clock = current_sim_clock();
  Message m{t, n, buf == nullptr, clock ? clock->now() : 0, {}};
  const size_t nbytes = static_cast<size_t>(n * dtype_size(t));
  const int gdst = ranks()[dst];
  const std::string key = mail_key(me(), gdst, tag);
  World& w = *w_;
  RankState& rs = w.ranks[gdst];
  std::unique_lock lk(w.mu);
  if (w.aborted.load()) w.throw_aborted_locked("send", me());
  RankState::Posted& pr = rs.posted;
  if (buf && nbytes > 0 && rs.s == RankState::blocked && rs.waiting_key == key &&
      pr.s == RankState::Posted::open && pr.buf && pr.dtype == t && pr.count == n) {
    // The receiver waits in the matching recv: copy into its buffer. It stays in recv until
    // the copy is done, so the buffer outlives it even if the world aborts meanwhile.
    pr.s = RankState::Posted::filling;
    pr.sent_at = m.sent_at;
    void* dst_buf = pr.buf;
    lk.unlock();
    std::memcpy(dst_buf, buf, nbytes);
    lk.lock();
    pr.s = RankState::Posted::filled;
    w.unblock_locked(gdst);
    rs.waiting_key.clear();
    rs.cv.notify_all();
    return;
  }
  if (buf && nbytes > 0) {
    m.bytes = w.take_buffer_locked(nbytes);
    lk.unlock();
    m.bytes.assign(static_cast<const char*>(buf), static_cast<const char*>(buf) + nbytes);
    lk.lock();
    if (w.aborted.load()) w.throw_aborted_locked("send", me());
  }
  w.mail[key].push_back(std::move(m));
  if (rs.s == RankState::blocked && rs.waiting_key == key) {
    w_->unblock_locked(gdst);
    rs.waiting_key.clear();
  }
  rs.cv.notify_all();
}

void SimCommunicator::recv(void* buf, int64_t n, DType t, int src, int tag) {
  check_member("recv", "source", src);
  check_args("recv", n, t, ReduceOp::sum, false);
  SimClock* clock = current_sim_clock();
  const int gsrc = ranks()[src];
  const std::string key = mail_key(gsrc, me(), tag);
  Message m;
  {
    std::unique_lock lk(w_->mu);
    World& w = *w_;
    RankState& rs = w.ranks[me()];
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(w.opts.timeout_s));
    RankState::Posted& pr = rs.posted;
    for (;;) {
      if (pr.s == RankState::Posted::filled) {  // a sender copied straight into buf
        m = Message{t, n, false, pr.sent_at, {}};
        break;
      }
      if (pr.s == RankState::Posted::filling) {  // never leave while a sender writes into buf
        rs.cv.wait(lk);
        continue;
      }
      if (w.aborted.load()) {
        pr.s = RankState::Posted::none;
        w.throw_aborted_locked("recv", me());
      }
      auto it = w.mail.find(key);
      if (it != w.mail.end() && !it->second.empty()) {
        m = std::move(it->second.front());
        it->second.pop_front();
        break;
      }
      if (rs.s != RankState::blocked) {
        w.block_locked(me(), str("recv(", t, ", count=", n, ") from rank ", gsrc, " tag ", tag,
                                 " on group ", g_->name));
        rs.waiting_key = key;
        pr = RankState::Posted{RankState::Posted::open, buf, t, n, 0};
        w.check_deadlock_locked(me());
        continue;
      }
      if (rs.cv.wait_until(lk, deadline) == std::cv_status::timeout) {
        it = w.mail.find(key);
        if (w.aborted.load() || pr.s != RankState::Posted::open ||
            (it != w.mail.end() && !it->second.empty()))
          continue;
        pr.s = RankState::Posted::none;
        std::string msg = str("[recv] rank ", me(), " timed out after ", w.opts.timeout_s,
                              " s waiting for a message from rank ", gsrc, " (tag ", tag,
                              ", group ", g_->name, "); rank ", gsrc, " is ",
                              w.ranks[gsrc].s == RankState::blocked ? "in " + w.ranks[gsrc].what
                              : w.ranks[gsrc].s == RankState::done  ? std::string("done")
                                                                    : std::string("running"));
        w.unblock_locked(me());
        rs.waiting_key.clear();
        w.abort_locked(me(), std::make_exception_ptr(CommError(msg)), msg);
        throw CommError(msg);
      }
    }
    pr.s = RankState::Posted::none;
    w.unblock_locked(me());
    rs.waiting_key.clear();
  }
  if (!m.bytes.empty() && m.dtype == t && m.count == n && buf)
    std::memcpy(buf, m.bytes.data(), m.bytes.size());
  if (m.bytes.capacity() > 0) {
    std::vector<std::vector<char>> evicted;
    std::lock_guard lk(w_->mu);
    evicted = w_->give_back_locked(std::move(m.bytes));
  }
  NXD_CHECK_T(CommError, m.dtype == t && m.count == n, "[recv] rank ", me(), " expected ", t,
              " count ", n, " from rank ", gsrc, " (tag ", tag, ", group ", g_->name,
              "), but it sent ", m.dtype, " count ", m.count);
  if (clock) {
    double bytes = double(n) * dtype_size(t);
    CollCost c = collective_cost(w_->machine, CollKind::send_recv, {gsrc, me()}, bytes);
    double start = std::max(clock->now(), m.sent_at);
    clock->record_comm(clock->recording() ? str("recv from ", gsrc) : std::string("recv"), start,
                       m.sent_at + c.seconds > start ? m.sent_at + c.seconds : start, false,
                       clock->recording() ? str("bytes=", bytes) : std::string());
  }
}

std::shared_ptr<Communicator> SimCommunicator::split(int color, int key) {
  int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * size());
  all_gather(mine, all.data(), 2, DType::i64);
  const uint64_t s = splits_++;
  if (color < 0) return nullptr;
  std::vector<std::pair<int64_t, int>> order;
  for (int j = 0; j < size(); ++j)
    if (all[2 * j] == color) order.push_back({all[2 * j + 1], j});
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  int idx = -1;
  for (auto& [k, j] : order) {
    if (j == rank()) idx = static_cast<int>(members.size());
    members.push_back(ranks()[j]);
  }
  std::string uid = str(uid_, "/", s, ":", color);
  std::shared_ptr<Group> g;
  {
    std::lock_guard lk(w_->mu);
    auto& slot = w_->groups[uid];
    if (!slot) slot = std::make_shared<Group>(members);
    g = slot;
  }
  return std::make_shared<SimCommunicator>(w_, g, idx, uid);
}

[[noreturn]] void rethrow_with_rank(int rank, std::exception_ptr e) {
  const std::string p = str("[sim::launch] rank ", rank, " failed: ");
  try {
    std::rethrow_exception(e);
  } catch (const ShapeError& x) {
    throw ShapeError(p + x.what());
  } catch (const InvalidArgument& x) {
    throw InvalidArgument(p + x.what());
  } catch (const ConfigError& x) {
    throw ConfigError(p + x.what());
  } catch (const IoError& x) {
    throw IoError(p + x.what());
  } catch (const UserError& x) {
    throw UserError(p + x.what());
  } catch (const CommError& x) {
    throw CommError(p + x.what());
  } catch (const OutOfDeviceMemory& x) {
    throw OutOfDeviceMemory(p + x.what());
  } catch (const InternalError& x) {
    throw InternalError(p + x.what());
  } catch (const Error& x) {
    throw Error(p + x.what());
  } catch (const std::exception& x) {
    throw Error(p + x.what());
  }
}

}  // namespace

double LaunchResult::sim_seconds() const {
  double t = 0;
  for (auto& r : ranks) t = std::max(t, r.sim_seconds);
  return t;
}

MachineSpec resolve_machine(const LaunchOptions& o) {
  NXD_CHECK_T(ConfigError, o.world_size >= 1, "[sim::launch] world size must be >= 1, got ",
              o.world_size);
  MachineSpec m;
  if (o.machine)
    m = *o.machine;
  else if (!o.instance.empty())
    m = machine(o.instance);
  else {
    MachineSpec t = machine("trn1.32xlarge");
    m = cluster(t, (o.world_size + t.cores_per_instance() - 1) / t.cores_per_instance());
  }
  NXD_CHECK_T(ConfigError, o.world_size <= m.world_size(), "[sim::launch] world size ",
              o.world_size, " exceeds the ", m.world_size(), " NeuronCores of ", m.name);
  return m;
}

LaunchResult launch(const LaunchOptions& o, const std::function<void()>& fn) {
  const int n = o.world_size;
  MachineSpec m = resolve_machine(o);
  LaunchOptions opts = o;
  if (opts.timeout_s == 0) {
    const char* e = std::getenv("NXD_SIM_TIMEOUT");
    opts.timeout_s = e ? std::atof(e) : 300.0;
  }
  NXD_CHECK_T(ConfigError, opts.timeout_s > 0, "[sim::launch] timeout must be > 0 s, got ",
              opts.timeout_s, " (LaunchOptions::timeout_s or NXD_SIM_TIMEOUT)");
  auto w = std::make_shared<World>(n, m, opts);
  // Spin before sleeping only when every rank can have its own hardware thread: otherwise the
  // spinner may hold the core its peer needs. NXD_SIM_SPIN_US overrides (0: never spin).
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  w->spin_s = n <= static_cast<int>(hw) ? 50e-6 : 0;
  w->helpers = static_cast<int>(hw) - 1;
  if (const char* e = std::getenv("NXD_SIM_SPIN_US"))
    w->spin_s = std::max(0.0, std::atof(e)) * 1e-6;
  std::vector<int> all(n);
  for (int r = 0; r < n; ++r) all[r] = r;
  auto world_group = std::make_shared<Group>(all);
  w->groups["w"] = world_group;
  auto timeline =
      o.record_timeline || !o.timeline_path.empty() ? std::make_shared<Timeline>(n) : nullptr;
  const int64_t cap = o.memory_capacity < 0 ? m.core.hbm_bytes : o.memory_capacity;

  const int prev_threads = num_threads();
  set_num_threads(1);
  LaunchResult result;
  result.machine = m;
  result.timeline = timeline;
  result.ranks.resize(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      {
        Context ctx(ContextOptions{.rank = r,
                                   .world_size = n,
                                   .seed = opts.seed,
                                   .memory_capacity = cap,
                                   .name = str("rank ", r)});
        auto clock = std::make_shared<SimClock>(m, r, timeline.get());
        ctx.set_cost_model(clock);
        set_world(ctx, std::make_shared<SimCommunicator>(w, world_group, r, "w"));
        ContextGuard guard(ctx);
        try {
          fn();
        } catch (const std::exception& e) {
          std::lock_guard lk(w->mu);
          w->abort_locked(r, std::current_exception(), e.what());
        } catch (...) {
          std::lock_guard lk(w->mu);
          w->abort_locked(r, std::current_exception(), "unknown exception");
        }
        RankReport& rep = result.ranks[r];
        rep.rank = r;
        rep.sim_seconds = clock->now();
        rep.compute_seconds = clock->compute_seconds();
        rep.comm_seconds = clock->comm_seconds();
        rep.wait_seconds = clock->wait_seconds();
        rep.peak_bytes = ctx.memory().peak();
      }
      std::lock_guard lk(w->mu);
      if (w->ranks[r].s == RankState::running) --w->running;
      w->ranks[r].s = RankState::done;
      w->check_deadlock_locked(r);
    });
  }
  for (auto& t : threads) t.join();
  set_num_threads(prev_threads);
  if (w->fail) rethrow_with_rank(w->fail_rank, w->fail);
  if (!o.timeline_path.empty()) timeline->write_chrome_trace(o.timeline_path);
  return result;
}

LaunchResult launch(int world_size, const std::function<void()>& fn) {
  LaunchOptions o;
  o.world_size = world_size;
  return launch(o, fn);
}

}  // namespace nxd::sim
