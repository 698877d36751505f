#pragma once
// nxd-elastic's loop: launch, read the failure, drop what died, relaunch resharded
// (docs/design/run_safety.md, "Run safety": elastic recovery).
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "plan.h"

namespace nxd::elastic {

struct SupervisorOptions {
  std::vector<Host> hosts;
  int max_restarts = 3;
  std::vector<std::string> mpirun;          // mpirun and its extra arguments
  std::string train_bin;                    // nxd-train
  std::vector<std::string> train_args;      // the user's nxd-train arguments
  LayoutRequest request;                    // TP, PP, global batch, micro batch
  std::function<bool(const Layout&)> fits;  // the configuration resolves with this layout
  std::filesystem::path exp_dir;            // <exp_dir>: metrics.csv, elastic.log
  std::filesystem::path checkpoint_dir;
  double stall_timeout_s = 0;
  double probe_timeout_s = 30;
  bool keep_failed_slots = false;  // a failed rank's slot is used again (same size)
  // The wait before a relaunch: restart_backoff_s after a launch that failed before its first
  // step, doubled for each such launch in a row up to restart_backoff_max_s (a command that fails
  // at once is not relaunched in a tight loop); a launch that trained a step starts it over.
  double restart_backoff_s = 1;
  double restart_backoff_max_s = 60;
};

// Runs to the end; returns the exit code (0 done, 1 failed after the restarts, 128+n signalled,
// 2 a user mistake nxd-train reported).
int supervise(const SupervisorOptions& o);

}  // namespace nxd::elastic
