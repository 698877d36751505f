#pragma once
// One launch of nxd-elastic: mpirun started with stdin from /dev/null, stdout passed through,
// stderr passed through and kept (to learn which rank failed), watched until it ends.
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace nxd::elastic {

struct LaunchOptions {
  std::vector<std::string> argv;  // argv[0] searched in PATH
  std::filesystem::path metrics;  // <exp_dir>/metrics.csv, watched for progress
  // Stopped when no new metrics row comes for max(stall_timeout_s, stall_pace_factor x the
  // launch's slowest step so far): a machine that slows down stretches the allowance with it, so
  // a slow step is not taken for a hang. The slowest step is the longest gap between two rows
  // seen; before the second row, the first row's elapsed_s (the first step, warm-up included),
  // or the time from the start to the first row if the row has none. 0 = off.
  double stall_timeout_s = 0;
  double stall_pace_factor = 4;
  double startup_timeout_s = 0;  // no first row for this long: stopped (0 = off)
};

struct LaunchResult {
  int code = -1;               // mpirun's exit code (128 + n when it died by signal n)
  bool started = false;        // false: argv[0] could not be started (err says why)
  bool stalled = false;        // killed by stall_timeout_s
  double stall_allowed_s = 0;  // when stalled: the allowance that ran out
  bool signalled = false;      // nxd-elastic got SIGTERM/SIGINT and passed it on
  int signal = 0;
  std::string err;  // all mpirun wrote to stderr
  // seconds from the start to the first metrics row this launch wrote (-1: none)
  double first_row_s = -1;
  double seconds = 0;  // wall time of the launch
};

// Installs nxd-elastic's SIGTERM/SIGINT handler (passed on to the running launch).
void install_signal_handlers();
LaunchResult run_launch(const LaunchOptions& o);
// Sleeps `seconds` unless SIGTERM/SIGINT comes first: returns that signal's number, else 0.
int sleep_unless_signalled(double seconds);

}  // namespace nxd::elastic
