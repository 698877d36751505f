// Sim backend: groups (split) and sim::launch (launch.h): the world, one thread per rank, and
// errors rethrown with the failing rank.
#include <algorithm>
#include <thread>

#include "nxd/collectives/sim/sim_communicator.h"
#include "nxd/runtime/context.h"

namespace nxd::sim {
namespace detail {

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

namespace {

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
}  // namespace detail

using namespace detail;

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

namespace {

// The launch's shared state: the timeout (LaunchOptions::timeout_s or NXD_SIM_TIMEOUT), the spin
// before a wait sleeps, and the world group "w" of all n ranks.
std::shared_ptr<World> make_world(const LaunchOptions& o, const MachineSpec& m) {
  const int n = o.world_size;
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
  w->groups["w"] = std::make_shared<Group>(all);
  return w;
}

// Records the exception in flight as rank r's failure. Under memory exhaustion even the message
// copy may throw: the rank still counts as failed (the exception alone is kept).
void record_failure(World& w, int r, const char* what) noexcept {
  std::lock_guard lk(w.mu);
  try {
    w.abort_locked(r, std::current_exception(), what);
  } catch (...) {
    if (!w.aborted) {
      w.fail_rank = r;
      w.fail = std::current_exception();
      w.aborted.store(true);
    }
  }
}

// Rank r's modeled times and memory peak once its function has returned.
RankReport report_of(int r, SimClock& clock, Context& ctx) {
  RankReport rep;
  rep.rank = r;
  rep.sim_seconds = clock.now();
  rep.compute_seconds = clock.compute_seconds();
  rep.comm_seconds = clock.comm_seconds();
  rep.wait_seconds = clock.wait_seconds();
  rep.peak_bytes = ctx.memory().peak();
  return rep;
}

// What one rank's thread runs. Everything a rank allocates (its context, clock, communicator) is
// inside the try: a thread that starts but cannot build its rank under a memory limit fails the
// launch, never std::terminate.
struct RankRun {
  const std::shared_ptr<World>& w;
  const std::shared_ptr<Group>& world_group;
  const LaunchOptions& o;
  const MachineSpec& m;
  Timeline* timeline;
  const std::function<void()>& fn;
  LaunchResult& result;

  void operator()(int r) const {
    const int64_t cap = o.memory_capacity < 0 ? m.core.hbm_bytes : o.memory_capacity;
    try {
      Context ctx(ContextOptions{.rank = r,
                                 .world_size = o.world_size,
                                 .seed = o.seed,
                                 .memory_capacity = cap,
                                 .name = str("rank ", r)});
      auto clock = std::make_shared<SimClock>(m, r, timeline);
      ctx.set_cost_model(clock);
      set_world(ctx, std::make_shared<SimCommunicator>(w, world_group, r, "w"));
      ContextGuard guard(ctx);
      try {
        fn();
      } catch (const std::exception& e) {
        record_failure(*w, r, e.what());
      } catch (...) {
        record_failure(*w, r, "unknown exception");
      }
      result.ranks[r] = report_of(r, *clock, ctx);
    } catch (const std::exception& e) {
      record_failure(*w, r, e.what());
    } catch (...) {
      record_failure(*w, r, "unknown exception");
    }
    std::lock_guard lk(w->mu);
    if (w->ranks[r].s == RankState::running) --w->running;
    w->ranks[r].s = RankState::done;
    w->check_deadlock_locked(r);
  }
};

// The message when the thread of rank r of n cannot start (std::system_error (EAGAIN) or
// bad_alloc: a limit).
std::string thread_start_message(int r, int n, const std::exception& e) {
  return str("[sim::launch] cannot start the thread of rank ", r, " of ", n, ": ", e.what(),
             " (each sim rank is a thread: the process's thread or address-space limit, "
             "ulimit -u / ulimit -v, allows ",
             r, "; use fewer ranks or raise the limit)");
}

}  // namespace

LaunchResult launch(const LaunchOptions& o, const std::function<void()>& fn) {
  const int n = o.world_size;
  MachineSpec m = resolve_machine(o);
  auto w = make_world(o, m);
  const std::shared_ptr<Group> world_group = w->groups["w"];
  auto timeline =
      o.record_timeline || !o.timeline_path.empty() ? std::make_shared<Timeline>(n) : nullptr;

  const int prev_threads = num_threads();
  set_num_threads(1);
  LaunchResult result;
  result.machine = m;
  result.timeline = timeline;
  result.ranks.resize(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  const RankRun rank_run{w, world_group, o, m, timeline.get(), fn, result};
  for (int r = 0; r < n; ++r) {
    try {
      threads.emplace_back(rank_run, r);
    } catch (const std::exception& e) {
      const std::string msg = thread_start_message(r, n, e);
      {
        std::lock_guard lk(w->mu);
        w->abort_locked(r, std::make_exception_ptr(ConfigError(msg)), msg);
      }
      for (auto& t : threads) t.join();
      set_num_threads(prev_threads);
      throw ConfigError(msg);
    }
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
