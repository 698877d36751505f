#pragma once
// Child processes for the end-to-end tests of the binaries: run one (directly or under a launcher
// such as mpirun) with its stdout and stderr captured, its exit code, and a timeout.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "support/files.h"

extern char** environ;

namespace nxd::testing {

struct ProcResult {
  int code = -1;           // the exit code; -1 when the process was killed or did not start
  bool timed_out = false;  // killed after the timeout (err then ends with a line saying so)
  std::string out, err;    // all it wrote to stdout and stderr
};

// Runs argv (argv[0]: the program's path, not searched in PATH) with stdin from /dev/null and
// stdout, stderr written to dir/stdout.txt, dir/stderr.txt, and waits for it. The child leads a
// new process group; after `timeout` the group gets SIGTERM (a launcher passes it on to its
// ranks), then SIGKILL 5 s later, and the result says timed_out.
inline ProcResult run_process(const std::vector<std::string>& argv,
                              const std::filesystem::path& dir,
                              std::chrono::seconds timeout = std::chrono::seconds(300)) {
  ProcResult r;
  const std::string out_path = (dir / "stdout.txt").string(),
                    err_path = (dir / "stderr.txt").string();
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&at, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &fa, &at, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) {
    r.err = "cannot start " + argv[0] + ": " + std::strerror(rc);
    return r;
  }
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + timeout;
  auto kill_at = clock::time_point::max();
  int st = 0;
  bool reaped = false;
  while (true) {
    const pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) reaped = true;
    if (w == pid || (w < 0 && errno != EINTR)) break;
    const auto now = clock::now();
    if (!r.timed_out && now >= deadline) {
      r.timed_out = true;
      kill(-pid, SIGTERM);
      kill_at = now + std::chrono::seconds(5);
    } else if (now >= kill_at) {
      kill(-pid, SIGKILL);
      kill_at = clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.code = reaped && !r.timed_out && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  if (r.timed_out)
    r.err += "\n[run_process] " + argv[0] + " timed out after " + std::to_string(timeout.count()) +
             " s and was killed\n";
  return r;
}

}  // namespace nxd::testing
