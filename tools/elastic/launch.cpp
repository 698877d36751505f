#include "launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "plan.h"

extern char** environ;

namespace nxd::elastic {

namespace {

volatile sig_atomic_t g_signal = 0;

void on_signal(int sig) {
  g_signal = sig;
}

// The inode of a file (0 if none): a resumed nxd-train moves the old metrics.csv aside and
// writes a new one, so a new inode with a row is this launch's first step.
ino_t inode_of(const std::filesystem::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? st.st_ino : 0;
}

// The elapsed_s column of metrics.csv's last row (seconds since the launch began training; -1 if
// there is none): the first step's time without mpirun's startup.
double last_elapsed_s(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string header, line, last;
  if (!std::getline(f, header)) return -1;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  auto field = [](const std::string& s, size_t k) {
    std::stringstream ss(s);
    std::string x;
    for (size_t i = 0; i <= k; ++i)
      if (!std::getline(ss, x, ',')) return std::string();
    return x;
  };
  for (size_t k = 0;; ++k) {
    const std::string name = field(header, k);
    if (name.empty()) return -1;
    if (name != "elapsed_s") continue;
    const std::string v = field(last, k);
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    return !v.empty() && end && *end == '\0' ? x : -1;
  }
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Starts argv in a process group of its own (killed whole on a stall), stdin from /dev/null and
// stderr into `stderr_fd`; posix_spawnp's error code, 0 on success.
int spawn_in_own_group(const std::vector<std::string>& argv, int stderr_fd, pid_t& pid) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, stderr_fd, 2);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);  // its own group: killed whole on stall
  posix_spawnattr_setpgroup(&at, 0);
  const int rc = posix_spawnp(&pid, args[0], &fa, &at, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  return rc;
}

// Waits up to 200 ms for the launch's stderr and passes what comes on to ours and into `err`;
// false once the pipe is closed.
bool forward_stderr(int fd, std::string& err) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 200) > 0) {
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      err.append(buf, n);
      (void)!::write(2, buf, n);
    } else if (n == 0 || errno != EINTR) {
      return false;
    }
  }
  return true;
}

// What is left in the pipe (ranks' last words), without blocking: a rank mpirun left behind may
// still hold the pipe.
void drain_stderr(int fd, std::string& err) {
  ::fcntl(fd, F_SETFL, O_NONBLOCK);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) {
    err.append(buf, n);
    (void)!::write(2, buf, n);
  }
}

// The launch's progress (rows of this launch's metrics.csv, the slowest step so far) and the
// stall rule on it.
struct Progress {
  Clock::time_point t0;
  ino_t old_inode;
  int64_t rows = 0;
  double pace = 0;  // seconds: the slowest step so far (see LaunchOptions)
  Clock::time_point progress_at = Clock::now();
  Clock::time_point kill_at = Clock::time_point::max();

  void update(const LaunchOptions& o, LaunchResult& r) {
    const ino_t ino = inode_of(o.metrics);
    if (ino == 0 || ino == old_inode) return;
    const int64_t now_rows = data_rows(o.metrics);
    if (now_rows <= rows) return;
    if (rows == 0) {  // the first step's time (elapsed_s), else all the launch took so far
      r.first_row_s = seconds_since(t0), pace = r.first_row_s;
      const double e = last_elapsed_s(o.metrics);
      if (e > 0 && e < pace) pace = e;
    } else if (rows == 1 || seconds_since(progress_at) > pace)
      pace = seconds_since(progress_at);
    rows = now_rows, progress_at = Clock::now();
  }

  // Stalled: no new row for the allowance (before the first row: startup_timeout_s): TERM to
  // mpirun, which ends its ranks; if it has not ended 10 s later, KILL to its whole group.
  void stop_if_stalled(const LaunchOptions& o, LaunchResult& r, pid_t pid) {
    const double allowed = rows == 0 ? o.startup_timeout_s
                           : o.stall_timeout_s > 0
                               ? std::max(o.stall_timeout_s, o.stall_pace_factor * pace)
                               : 0;
    if (allowed > 0 && !r.stalled && seconds_since(progress_at) > allowed) {
      r.stalled = true, r.stall_allowed_s = allowed;
      char note[200];
      std::snprintf(note, sizeof note,
                    "nxd-elastic: no new step for %.1f s (--stall-timeout %.1f s, slowest step "
                    "so far %.1f s): stopping the launch\n",
                    allowed, o.stall_timeout_s, pace);
      (void)!::write(2, note, std::strlen(note));
      ::kill(pid, SIGTERM);  // mpirun ends its ranks (TERM, then KILL)
      kill_at = Clock::now() + std::chrono::seconds(10);
    }
    if (Clock::now() > kill_at) {  // mpirun did not end: its whole group
      ::kill(-pid, SIGKILL);
      kill_at = Clock::time_point::max();
    }
  }
};

}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

LaunchResult run_launch(const LaunchOptions& o) {
  LaunchResult r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    r.err = std::string("pipe: ") + std::strerror(errno);
    return r;
  }
  pid_t pid = -1;
  const auto t0 = Clock::now();
  const ino_t old_inode = inode_of(o.metrics);
  const int rc = spawn_in_own_group(o.argv, fds[1], pid);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    r.err = "cannot start " + o.argv[0] + ": " + std::strerror(rc);
    return r;
  }
  r.started = true;
  Progress progress{.t0 = t0, .old_inode = old_inode};
  bool open = true, passed_on = false;
  int status = 0;
  for (;;) {
    if (open)
      open = forward_stderr(fds[0], r.err);
    else
      ::usleep(100 * 1000);
    if (g_signal && !passed_on) {  // mpirun passes it on to the ranks (they checkpoint)
      r.signalled = true, r.signal = g_signal, passed_on = true;
      ::kill(pid, g_signal);
    }
    progress.update(o, r);
    progress.stop_if_stalled(o, r, pid);
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
  }
  if (open) drain_stderr(fds[0], r.err);
  ::close(fds[0]);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = seconds_since(t0);
  return r;
}

int sleep_unless_signalled(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!g_signal && std::chrono::steady_clock::now() < end) ::usleep(20 * 1000);
  return g_signal;
}

}  // namespace nxd::elastic
