// Sim backend: the collective rendezvous and data phase (see sim_communicator.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "nxd/collectives/sim/sim_communicator.h"
#include "nxd/runtime/context.h"

namespace nxd::sim::detail {

using Clock = std::chrono::steady_clock;

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
                               WaitOptions opts) {
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
      if (opts.abortable && w.aborted.load(std::memory_order_relaxed)) break;
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
    if (opts.abortable && w.aborted.load()) {
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
    if (done() || (opts.abortable && w.aborted.load())) break;
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
  if (opts.abortable && w.aborted.load()) w.throw_aborted_locked(op, me());
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
      reduce_buffers_to({dsts_.data(), size_t(p)}, {srcs_.data(), size_t(p)}, len,
                        {d.dtype, d.rop, p});
      break;
    }
    case CollKind::reduce_scatter: {
      const int64_t off = j * per_item, len = std::min(per_item, n - off);
      for (int k = 0; k < p; ++k) srcs_[k] = snd(k) + (m * n + off) * es;
      void* dst = rcv(m) + off * es;
      reduce_buffers_to({&dst, 1}, {srcs_.data(), size_t(p)}, len, {d.dtype, d.rop, p});
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
      reduce_buffers_to({&dst, 1}, {srcs_.data(), size_t(p)}, len, {d.dtype, d.rop, p});
      break;
    }
    default:
      break;
  }
}

SimClock* SimCommunicator::post(CallDesc& d) {
  const CollKind kind = d.kind;
  const void* s = d.send;
  void* r = d.recv;
  const int64_t n = d.count;
  const int root = d.root;
  const char* name = coll_kind_name(kind);
  if (d.reduces)
    check_reduction(name, n, {d.dtype, d.rop});
  else
    check_count(name, n);
  if (root >= 0 || kind == CollKind::broadcast || kind == CollKind::reduce)
    check_member(name, "root", root);
  SimClock* clock = current_sim_clock();
  d.meta = s == nullptr && (r == nullptr || kind == CollKind::reduce) && kind != CollKind::barrier;
  d.ready = clock ? std::max(clock->now(), clock->comm_free()) : 0;
  d.seq = seq_++;
  // reduce: only the root needs a recv buffer.
  const bool needs_recv = kind != CollKind::reduce || rank() == root;
  NXD_CHECK(d.meta || kind == CollKind::barrier || n == 0 ||
                ((r != nullptr || !needs_recv) && (s != nullptr || kind == CollKind::broadcast)),
            "[", name, "] null buffer with count ", n, " on group ", g_->name);
  return clock;
}

SimCommunicator::Slot SimCommunicator::arrive(const CallDesc& d) {
  const char* name = coll_kind_name(d.kind);
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
  return {round, par, mine};
}

double SimCommunicator::model_time(const std::vector<CallDesc>& calls, const CallDesc& d,
                                   SimClock* clock, bool async) {
  const int p = size();
  const char* name = coll_kind_name(d.kind);
  // Simulated time: the collective starts when the last member is ready.
  double start = 0;
  for (int k = 0; k < p; ++k) start = std::max(start, calls[k].ready);
  double bytes = double(d.count) * dtype_size(d.dtype);
  if (d.kind == CollKind::all_gather || d.kind == CollKind::reduce_scatter ||
      d.kind == CollKind::all_to_all)
    bytes *= p;
  double finish = start;
  if (clock) {
    CollCost cost =
        collective_cost(w_->machine, d.kind, ranks(), links(), bytes, w_->opts.algorithm);
    finish = start + cost.seconds;
    clock->record_comm(name, start, finish, async,
                       clock->recording() ? str("bytes=", bytes, " group=", g_->name,
                                                " algo=", algorithm_name(cost.algorithm))
                                          : std::string());
  }
  return finish;
}

void SimCommunicator::move_data(const std::vector<CallDesc>& calls, const CallDesc& d,
                                const Slot& slot) {
  // Data phase: this member's items first, then any items left to the others (a descheduled
  // peer's share is done by whoever runs). Each item is one block of one member's result.
  Group& g = *g_;
  const int p = size(), i = rank();
  std::atomic<int64_t>& left = g.remaining[slot.par].items;
  // Items done are counted locally and taken off `left` once (the shared counter would
  // otherwise bounce between the members' caches on every item).
  int64_t done = 0;
  for (int q = 0; q < p; ++q) {
    const int m = (i + q) % p;
    const int64_t items = q == 0 ? slot.mine : items_of(d, m);
    if (items == 0) continue;
    std::atomic<int64_t>& next = g.cursor[slot.par][m].next;
    for (;;) {
      const int64_t j = next.fetch_add(1);
      if (j >= items) break;
      do_item(calls, m, j);
      ++done;
    }
  }
  if (done > 0 && left.fetch_sub(done) == done) release(slot.round, INT_MAX);  // the call's last
  // Completion: every member's result is written and nobody reads this member's buffers.
  wait_for(slot.round, [&] { return left.load() == 0; }, coll_kind_name(d.kind), d,
           {.abortable = false});
}

Work SimCommunicator::run(CallDesc d, Completion completion) {
  const bool async = completion == Completion::async;
  SimClock* clock = post(d);
  const Slot slot = arrive(d);
  const std::vector<CallDesc>& calls = g_->posted[slot.par];
  const double finish = model_time(calls, d, clock, async);
  const int64_t n = d.count;
  const int p = size();
  if (!d.meta && d.kind != CollKind::barrier && n > 0 && p > 1) {
    move_data(calls, d, slot);
  } else if (!d.meta && n > 0 && p == 1 && d.send != d.recv && d.send && d.recv &&
             d.kind != CollKind::broadcast) {
    std::memcpy(d.recv, d.send, n * dtype_size(d.dtype));
  }
  if (async) return Work(std::make_shared<WaitFinish>(clock, finish, coll_kind_name(d.kind)));
  return Work();
}

}  // namespace nxd::sim::detail
