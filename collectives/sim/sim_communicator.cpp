// Sim backend: shared-memory collectives between rank threads.
//
// Every collective is a rendezvous of the group's members. Each member posts its call (op,
// dtype, count, root, buffers, ready time) in the group's slot and waits at the group barrier;
// the last to arrive snapshots the calls and wakes the others. Every member then checks the
// calls match (all compute the same verdict, so all throw together), charges the modeled time
// of the collective to its SimClock, and moves data straight between the members' buffers:
//   all_reduce      member i reduces chunk i from every member's send buffer in rank order
//                   and writes it into every member's recv buffer; barrier.
//   reduce_scatter  member i reduces block i of every send buffer in rank order; barrier.
//   all_gather, broadcast, all_to_all, reduce: one copy/reduce pass; barrier.
// The final barrier keeps every buffer alive until the peers are done reading it.
// Point-to-point sends are buffered in a mailbox per (group, src, dst, tag); recv blocks.
//
// Waiting never spins: one world mutex guards all rendezvous state, with a condition variable
// per group and per rank. A world-wide count of running ranks detects deadlock (every live rank
// blocked), and every wait has a deadline (LaunchOptions::timeout_s).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

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

struct Group {
  explicit Group(std::vector<int> m)
      : members(std::move(m)), here(members.size(), 0), posted(members.size()) {
    name = "[";
    for (size_t i = 0; i < members.size(); ++i) name += (i ? "," : "") + std::to_string(members[i]);
    name += "]";
  }
  std::vector<int> members;  // global ranks
  std::string name;
  std::condition_variable cv;
  uint64_t gen = 0;
  int arrived = 0;
  std::vector<char> here;
  std::vector<CallDesc> posted;
  std::vector<CallDesc> snapshot;  // the calls of the last completed post phase
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
};

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
  bool aborted = false;
  std::string abort_msg;
  int fail_rank = -1;
  std::exception_ptr fail;

  void abort_locked(int rank, std::exception_ptr e, const std::string& msg) {
    if (aborted) return;
    aborted = true;
    fail_rank = rank;
    fail = std::move(e);
    abort_msg = msg;
    for (auto& [k, g] : groups) g->cv.notify_all();
    for (auto& r : ranks) r.cv.notify_all();
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
    if (aborted || running > 0) return;
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

std::string missing_str(const World& w, const Group& g) {
  std::string s;
  for (size_t i = 0; i < g.members.size(); ++i) {
    if (g.here[i]) continue;
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
  // Arrives at the group barrier and waits for the others (lock held). Throws on abort/timeout.
  // `call` describes the call for messages (built only when blocking or failing).
  void arrive_locked(std::unique_lock<std::mutex>& lk, const char* op, const CallDesc& call);
  void sync(const char* op, const CallDesc& what) {
    std::unique_lock lk(w_->mu);
    arrive_locked(lk, op, what);
  }
  int me() const { return ranks()[rank()]; }
  std::string mail_key(int src, int dst, int tag) const {
    return str(uid_, "|", src, ">", dst, "#", tag);
  }

  std::shared_ptr<World> w_;
  std::shared_ptr<Group> g_;
  std::string uid_;
  uint64_t seq_ = 0, splits_ = 0;
};

void SimCommunicator::arrive_locked(std::unique_lock<std::mutex>& lk, const char* op,
                                    const CallDesc& call) {
  World& w = *w_;
  Group& g = *g_;
  if (w.aborted) w.throw_aborted_locked(op, me());
  const int n = size(), i = rank();
  const uint64_t gen = g.gen;
  g.here[i] = 1;
  if (++g.arrived == n) {
    g.arrived = 0;
    std::fill(g.here.begin(), g.here.end(), 0);
    g.snapshot = g.posted;
    ++g.gen;
    for (int m = 0; m < n; ++m)
      if (m != i) w.unblock_locked(g.members[m]);
    g.cv.notify_all();
    return;
  }
  const std::string what = call.str();
  w.block_locked(me(), str(what, " on group ", g.name));
  w.check_deadlock_locked(me());
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(w.opts.timeout_s));
  while (g.gen == gen && !w.aborted) {
    if (g.cv.wait_until(lk, deadline) == std::cv_status::timeout && g.gen == gen && !w.aborted) {
      std::string msg =
          str("[", op, "] rank ", me(), " timed out after ", w.opts.timeout_s, " s in ", what,
              " on group ", g.name, "; ranks that never arrived:", missing_str(w, g));
      w.unblock_locked(me());
      w.abort_locked(me(), std::make_exception_ptr(CommError(msg)), msg);
      throw CommError(msg);
    }
  }
  if (g.gen == gen) w.throw_aborted_locked(op, me());
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

  std::vector<CallDesc> calls;
  {
    std::unique_lock lk(w_->mu);
    g_->posted[rank()] = d;
    arrive_locked(lk, name, d);
    calls = g_->snapshot;
  }
  const int p = size(), i = rank();
  for (int k = 0; k < p; ++k) {
    if (!calls[k].matches(calls[0])) {
      std::string msg = str("[", name, "] mismatched collectives on group ", g_->name, ":");
      for (int m = 0; m < p; ++m) msg += str("\n  rank ", ranks()[m], ": ", calls[m].str());
      throw CommError(msg);
    }
  }

  // Simulated time: the collective starts when the last member is ready.
  double start = 0;
  for (auto& c : calls) start = std::max(start, c.ready);
  const int64_t es = dtype_size(t);
  double bytes = double(n) * es;
  if (kind == CollKind::all_gather || kind == CollKind::reduce_scatter ||
      kind == CollKind::all_to_all)
    bytes *= p;
  CollCost cost = collective_cost(w_->machine, kind, ranks(), bytes, w_->opts.algorithm);
  const double finish = start + cost.seconds;
  if (clock)
    clock->record_comm(
        name, start, finish, async,
        str("bytes=", bytes, " group=", g_->name, " algo=", algorithm_name(cost.algorithm)));

  if (!d.meta && kind != CollKind::barrier && n > 0 && p > 1) {
    char* out = static_cast<char*>(r);
    auto src = [&](int k) { return static_cast<const char*>(calls[k].send); };
    switch (kind) {
      case CollKind::all_reduce: {
        int64_t per = (n + p - 1) / p;
        per = (per + 15) / 16 * 16;  // 64-byte aligned chunks for f32
        auto lo = [&](int k) { return std::min<int64_t>(n, k * per); };
        auto hi = [&](int k) { return std::min<int64_t>(n, (k + 1) * per); };
        // Reduce my chunk block by block (in rank order) and push each block into every
        // member's recv buffer while it is hot in cache. Only member i touches chunk i of any
        // buffer, so this is safe in place; the final barrier publishes the writes.
        constexpr int64_t kBlock = 16384;
        std::vector<const void*> srcs(p);
        for (int64_t b = lo(i); b < hi(i); b += kBlock) {
          const int64_t len = std::min(kBlock, hi(i) - b);
          for (int k = 0; k < p; ++k) srcs[k] = src(k) + b * es;
          reduce_buffers(out + b * es, srcs, len, t, op, p);
          for (int k = 0; k < p; ++k)
            if (k != i)
              std::memcpy(static_cast<char*>(calls[k].recv) + b * es, out + b * es, len * es);
        }
        break;
      }
      case CollKind::reduce_scatter: {
        std::vector<const void*> srcs(p);
        for (int k = 0; k < p; ++k) srcs[k] = src(k) + i * n * es;
        reduce_buffers(out, srcs, n, t, op, p);
        break;
      }
      case CollKind::all_gather:
        for (int k = 0; k < p; ++k)
          if (out + k * n * es != src(k)) std::memcpy(out + k * n * es, src(k), n * es);
        break;
      case CollKind::broadcast:
        if (i != root) std::memcpy(out, calls[root].recv, n * es);
        break;
      case CollKind::reduce:
        if (i == root) {
          std::vector<const void*> srcs(p);
          for (int k = 0; k < p; ++k) srcs[k] = src(k);
          reduce_buffers(out, srcs, n, t, op, p);
        }
        break;
      case CollKind::all_to_all:
        for (int k = 0; k < p; ++k) std::memcpy(out + k * n * es, src(k) + i * n * es, n * es);
        break;
      default:
        break;
    }
    sync(name, d);
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
  if (buf)
    m.bytes.assign(static_cast<const char*>(buf),
                   static_cast<const char*>(buf) + n * dtype_size(t));
  const int gdst = ranks()[dst];
  const std::string key = mail_key(me(), gdst, tag);
  std::unique_lock lk(w_->mu);
  if (w_->aborted) w_->throw_aborted_locked("send", me());
  w_->mail[key].push_back(std::move(m));
  RankState& rs = w_->ranks[gdst];
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
    for (;;) {
      if (w.aborted) w.throw_aborted_locked("recv", me());
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
        w.check_deadlock_locked(me());
        continue;
      }
      if (rs.cv.wait_until(lk, deadline) == std::cv_status::timeout) {
        it = w.mail.find(key);
        if (w.aborted || (it != w.mail.end() && !it->second.empty())) continue;
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
    w.unblock_locked(me());
    rs.waiting_key.clear();
  }
  NXD_CHECK_T(CommError, m.dtype == t && m.count == n, "[recv] rank ", me(), " expected ", t,
              " count ", n, " from rank ", gsrc, " (tag ", tag, ", group ", g_->name,
              "), but it sent ", m.dtype, " count ", m.count);
  if (buf && !m.bytes.empty()) std::memcpy(buf, m.bytes.data(), m.bytes.size());
  if (clock) {
    double bytes = double(n) * dtype_size(t);
    CollCost c = collective_cost(w_->machine, CollKind::send_recv, {gsrc, me()}, bytes);
    double start = std::max(clock->now(), m.sent_at);
    clock->record_comm(str("recv from ", gsrc), start,
                       m.sent_at + c.seconds > start ? m.sent_at + c.seconds : start, false,
                       str("bytes=", bytes));
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
  std::vector<int> all(n);
  for (int r = 0; r < n; ++r) all[r] = r;
  auto world_group = std::make_shared<Group>(all);
  w->groups["w"] = world_group;
  auto timeline = std::make_shared<Timeline>(n);
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
