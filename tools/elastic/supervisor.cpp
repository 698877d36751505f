#include "supervisor.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "launch.h"
#include "nxd/checkpoint/checkpoint.h"

namespace fs = std::filesystem;

namespace nxd::elastic {

namespace {

std::string fmt_s(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

// stderr and <exp_dir>/elastic.log (once nxd-train created the folder)
void note(const SupervisorOptions& o, const std::string& line) {
  std::fprintf(stderr, "nxd-elastic: %s\n", line.c_str());
  std::fflush(stderr);
  static std::vector<std::string> pending;  // lines from before the folder existed
  std::time_t t = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  pending.push_back(std::string(when) + " " + line + "\n");
  std::error_code ec;
  if (!fs::is_directory(o.exp_dir, ec)) return;
  std::ofstream f(o.exp_dir / "elastic.log", std::ios::app);
  for (const auto& l : pending) f << l;
  pending.clear();
}

std::set<std::string> metrics_pieces(const fs::path& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("metrics.", 0) == 0 && n.size() > 12 && n.substr(n.size() - 4) == ".csv" &&
        n != "metrics.csv")
      names.insert(n);
  }
  return names;
}

int piece_number(const std::string& name) {  // metrics.<k>.csv
  return std::atoi(name.substr(8, name.size() - 12).c_str());
}

std::vector<std::string> launch_argv(const SupervisorOptions& o, const std::vector<Host>& hosts,
                                     const Layout& l, bool restart) {
  std::vector<std::string> a = o.mpirun;
  a.insert(a.end(), {"-np", std::to_string(l.world()), "--host", host_arg(hosts), o.train_bin});
  a.insert(a.end(), o.train_args.begin(), o.train_args.end());
  for (const std::string& s : std::vector<std::string>{
           "backend.kind=mpi", "backend.world_size=" + std::to_string(l.world()),
           "data.micro_batch_size=" + std::to_string(l.micro_batch)})
    a.insert(a.end(), {"--set", s});
  if (restart)  // the same run goes on from its newest checkpoint; an injected fault happened once
    a.insert(a.end(),
             {"--set", "exp_manager.resume_if_exists=true", "--set", "backend.fail_rank=-1"});
  return a;
}

// Hosts that still answer a trivial mpirun (one process running `true`).
std::set<std::string> dead_hosts(const SupervisorOptions& o, const std::vector<Host>& hosts) {
  std::set<std::string> dead;
  for (const auto& h : hosts) {
    if (h.slots == 0) continue;
    std::vector<std::string> a = o.mpirun;
    a.insert(a.end(), {"-np", "1", "--host", h.name + ":1", "true"});
    const LaunchResult r =
        run_launch({.argv = a, .metrics = {}, .startup_timeout_s = o.probe_timeout_s});
    if (!r.started || r.code != 0) dead.insert(h.name);
  }
  return dead;
}

// The newest complete checkpoint's step (-1: none).
int64_t newest_step(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return -1;
  const auto tag = ckpt::newest_checkpoint(dir);
  return tag ? tag_step(*tag) : -1;
}

// Merges this session's metrics.<k>.csv pieces and metrics.csv into metrics.csv (each step once,
// the latest launch's row kept); the pieces stay as they are.
void merge_session_metrics(const SupervisorOptions& o, const std::set<std::string>& before) {
  std::vector<std::pair<int, fs::path>> ordered;
  for (const auto& n : metrics_pieces(o.exp_dir))
    if (!before.count(n)) ordered.push_back({piece_number(n), o.exp_dir / n});
  if (ordered.empty()) return;
  std::sort(ordered.begin(), ordered.end());
  std::vector<fs::path> pieces;
  for (auto& [k, p] : ordered) pieces.push_back(p);
  pieces.push_back(o.exp_dir / "metrics.csv");
  const MergeResult m = merge_metrics(pieces);
  if (!m.ok) {
    note(o, "metrics.csv not merged: " + m.why);
    return;
  }
  const fs::path tmp = o.exp_dir / ".metrics.csv.elastic";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << m.text;
    if (!f.flush()) {
      note(o, "metrics.csv not merged: cannot write " + tmp.string());
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, o.exp_dir / "metrics.csv", ec);
  if (ec) {
    note(o, "metrics.csv not merged: " + ec.message());
    return;
  }
  note(o, "metrics.csv: " + std::to_string(m.rows) + " rows merged from " +
              std::to_string(pieces.size()) +
              " launches (each step once, the latest launch's "
              "row kept; the pieces stay as metrics.<k>.csv)");
}

// Removes the slots of dead hosts and (unless keep_failed_slots) each failed rank's slot; says
// what it removed.
std::string drop_what_died(const SupervisorOptions& o, std::vector<Host>& hosts,
                           const FailureReport& f, const std::set<std::string>& dead) {
  const std::vector<Host> launched = hosts;  // the rank -> host map of the failed launch
  std::string why;
  for (auto& h : hosts)
    if (dead.count(h.name)) h.slots = 0, why += " host " + h.name + " lost;";
  if (o.keep_failed_slots) return why;
  for (int k : f.ranks) {
    const auto name = host_of_rank(launched, k);
    if (!name || dead.count(*name)) continue;
    for (auto& h : hosts)
      if (h.name == *name && h.slots > 0) {
        --h.slots;
        why += " rank " + std::to_string(k) + "'s slot on " + h.name + " dropped;";
      }
  }
  return why;
}

// Waits (30 s at most) until no process of the failed launch holds <exp_dir>/nxd.lock: mpirun
// can end before every rank it started has exited, and a relaunch finding the lock held would
// be refused as another run. A shared flock() taken and dropped at once, as nxd-train's is
// non-blocking.
void wait_for_lock_release(const SupervisorOptions& o) {
  const fs::path lock = o.exp_dir / "nxd.lock";
  for (int i = 0; i < 300; ++i) {
    const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // removed: its run ended
    const bool free = ::flock(fd, LOCK_SH | LOCK_NB) == 0;
    ::close(fd);  // drops the shared lock too
    if (free) return;
    if (i == 0) note(o, "waiting for the failed launch's ranks to release " + lock.string());
    ::usleep(100 * 1000);
  }
  note(o, lock.string() + " is still held after 30 s: relaunching anyway");
}

// The exit code when a launch ends the run (done, signalled, a user mistake, not started).
std::optional<int> end_code(const SupervisorOptions& o, const LaunchResult& r, int launch) {
  if (!r.started) {
    note(o, r.err);
    return 2;
  }
  if (r.signalled) {
    note(o, std::string("stopped by ") + (r.signal == SIGINT ? "SIGINT" : "SIGTERM") +
                " (passed on to the ranks; mpirun exit " + std::to_string(r.code) + ")");
    return 128 + r.signal;
  }
  if (r.code == 0) return 0;
  if (r.code == 2) {  // nxd-train's user mistake: a relaunch would fail alike
    note(o, "launch " + std::to_string(launch + 1) +
                " ended with exit 2 (a user mistake nxd-train reported): not restarted");
    return 2;
  }
  return std::nullopt;
}

struct Failure {
  int64_t resume = -1, lost = 0;
};

// What died (ranks named by mpirun, hosts that no longer answer): their slots leave `hosts`;
// logs the failure.
Failure assess_failure(const SupervisorOptions& o, std::vector<Host>& hosts, const LaunchResult& r,
                       int launch) {
  const FailureReport f = parse_failure(r.err);
  const std::set<std::string> dead = dead_hosts(o, hosts);
  std::string ranks;
  for (int k : f.ranks) {
    if (!ranks.empty()) ranks += ',';
    ranks += std::to_string(k);
  }
  const std::string why = drop_what_died(o, hosts, f, dead);
  const int64_t last = r.first_row_s >= 0 ? last_step(o.exp_dir / "metrics.csv") : -1;
  Failure out;
  out.resume = newest_step(o.checkpoint_dir);
  out.lost = last >= 0 ? last - std::max<int64_t>(out.resume, 0) : 0;
  note(o, "launch " + std::to_string(launch + 1) + " failed after " + fmt_s(r.seconds) +
              " (mpirun exit " + std::to_string(r.code) + (r.stalled ? ", stalled" : "") +
              "; failed ranks: " + (ranks.empty() ? "not named" : ranks) + ";" +
              (why.empty() ? " nothing dropped;" : why) + " last step " + std::to_string(last) +
              ", newest checkpoint step " + std::to_string(out.resume) + ", " +
              std::to_string(out.lost) + " steps lost)");
  return out;
}

// The wait before relaunch launch + 2: --restart-backoff, doubled (up to --restart-backoff-max)
// after each launch that trained no step. The exit code (128 + the signal) if a signal ends it.
std::optional<int> back_off(const SupervisorOptions& o, const LaunchResult& r, int launch,
                            double& backoff) {
  backoff = r.first_row_s >= 0 || backoff <= 0 ? o.restart_backoff_s
                                               : std::min(2 * backoff, o.restart_backoff_max_s);
  if (backoff <= 0) return std::nullopt;
  note(o, "waiting " + fmt_s(backoff) + " before launch " + std::to_string(launch + 2) +
              (r.first_row_s >= 0 ? "" : " (the last launch trained no step)") +
              " (--restart-backoff, --restart-backoff-max)");
  if (const int sig = sleep_unless_signalled(backoff)) {
    note(o, std::string("stopped by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                " while waiting to relaunch");
    return 128 + sig;
  }
  return std::nullopt;
}

// "restart <n>: <old layout> -> <new layout>, resuming at step ..." for the summary.
std::string restart_note(size_t n, const Layout& old, const Layout& now, const Failure& f,
                         double relaunch_s) {
  return "restart " + std::to_string(n) + ": " + describe(old) + " -> " + describe(now) + ", " +
         (f.resume >= 0 ? "resuming at step " + std::to_string(f.resume)
                        : std::string("from step 0 (no complete checkpoint)")) +
         " (" + std::to_string(f.lost) + " steps lost); relaunched " + fmt_s(relaunch_s) +
         " after the failure";
}

std::string summary_note(int code, double total, size_t restarts, int64_t lost_total,
                         const Layout& layout) {
  return std::string("summary: ") +
         (code == 0
              ? "done"
              : (code > 128 ? "stopped (exit " : "failed (exit ") + std::to_string(code) + ")") +
         " in " + fmt_s(total) + ", " + std::to_string(restarts) + " restart(s), " +
         std::to_string(lost_total) + " steps trained again, final layout " + describe(layout);
}

}  // namespace

int supervise(const SupervisorOptions& o) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::vector<Host> hosts = o.hosts;
  auto layout = choose_layout(o.request, total_slots(hosts), o.fits);
  // metrics.<k>.csv there before the first relaunch: not this session's pieces (the first launch
  // may itself resume an earlier run; its history is left as nxd-train keeps it)
  std::set<std::string> pieces_before;
  std::vector<std::string> restarts;
  int64_t lost_total = 0;
  int code = 1;
  double backoff = 0;  // the wait before the next relaunch (0: none yet)
  for (int launch = 0;; ++launch) {
    note(o, "launch " + std::to_string(launch + 1) + " on " + host_arg(hosts) + ": " +
                describe(*layout));
    const LaunchResult r = run_launch(
        {.argv = launch_argv(o, hosts, *layout, launch > 0),
         .metrics = o.exp_dir / "metrics.csv",
         .stall_timeout_s = o.stall_timeout_s,
         .startup_timeout_s = o.stall_timeout_s > 0 ? std::max(o.stall_timeout_s, 120.0) : 0});
    if (!restarts.empty()) {  // the restart before this launch: how long until it trained again
      restarts.back() += r.first_row_s >= 0
                             ? "; first step " + fmt_s(r.first_row_s) + " after the relaunch"
                             : "; no step trained";
      note(o, restarts.back());
    }
    if (const auto end = end_code(o, r, launch)) {
      code = *end;
      break;
    }
    const auto failed_at = clock::now();
    const Layout old = *layout;
    const Failure f = assess_failure(o, hosts, r, launch);
    lost_total += f.lost;
    if (launch >= o.max_restarts) {
      note(o, "giving up: " + std::to_string(o.max_restarts) + " restarts used (--max-restarts)");
      code = 1;
      break;
    }
    const auto next = choose_layout(o.request, total_slots(hosts), o.fits);
    if (!next) {
      note(o, "giving up: " + std::to_string(total_slots(hosts)) + " slots left (" +
                  host_arg(hosts) +
                  "), fewer than TP x PP = " + std::to_string(o.request.tp * o.request.pp) +
                  " or no DP that divides the global batch and resolves");
      code = 1;
      break;
    }
    layout = next;
    wait_for_lock_release(o);
    if (const auto stopped = back_off(o, r, launch, backoff)) {
      code = *stopped;
      break;
    }
    if (restarts.empty()) pieces_before = metrics_pieces(o.exp_dir);
    restarts.push_back(
        restart_note(restarts.size() + 1, old, *layout, f,
                     std::chrono::duration<double>(clock::now() - failed_at).count()));
  }
  if (!restarts.empty()) merge_session_metrics(o, pieces_before);
  const double total = std::chrono::duration<double>(clock::now() - t0).count();
  note(o, summary_note(code, total, restarts.size(), lost_total, *layout));
  return code;
}

}  // namespace nxd::elastic
