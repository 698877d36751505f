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
  double stall_timeout_s = 0;     // no new metrics row for this long: stopped (0 = off)
  double startup_timeout_s = 0;   // the same before the first row (0 = off)
};

struct LaunchResult {
  int code = -1;           // mpirun's exit code (128 + n when it died by signal n)
  bool started = false;    // false: argv[0] could not be started (err says why)
  bool stalled = false;    // killed by stall_timeout_s
  bool signalled = false;  // nxd-elastic got SIGTERM/SIGINT and passed it on
  int signal = 0;
  std::string err;  // all mpirun wrote to stderr
  // seconds from the start to the first metrics row this launch wrote (-1: none)
  double first_row_s = -1;
  double seconds = 0;  // wall time of the launch
};

// Installs nxd-elastic's SIGTERM/SIGINT handler (passed on to the running launch).
void install_signal_handlers();
LaunchResult run_launch(const LaunchOptions& o);

}  // namespace nxd::elastic
