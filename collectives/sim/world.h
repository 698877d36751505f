#pragma once
// Sim backend internals: the world of one sim::launch (its ranks' states, the groups, the
// mailboxes of point-to-point messages and their buffer pool, abort and deadlock detection), a
// group's rendezvous state, and the description of a collective call that members match.
// See sim_communicator.h for how they are used.
#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/sim/collective_cost.h"
#include "nxd/collectives/sim/futex.h"
#include "nxd/collectives/sim/launch.h"

namespace nxd::sim::detail {

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

struct Group {
  explicit Group(std::vector<int> m)
      : members(std::move(m)), arrived_round(members.size()), blocked_round(members.size(), 0) {
    for (auto& slot : posted) slot.resize(members.size());
    name.push_back('[');  // appending: GCC 12 -Wrestrict false positive on operator=
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

// Members of `g` that have not arrived at `round`, with what each is doing (for messages).
std::string missing_str(const World& w, const Group& g, uint64_t round);

}  // namespace nxd::sim::detail
