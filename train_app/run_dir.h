#pragma once
// The output directory of a command-line run (nxd-train's --out, exp_manager.exp_dir): locked for
// the run, and never taken over from another run without being told (docs/design/run_safety.md,
// "Run directories").
//
//   <exp_dir>/nxd.lock   "pid <pid> host <host> started <UTC time>", held with flock() for the
//                        whole run: a second run into the same directory refuses, naming the
//                        owner; a lock file left by a run that died (no flock held) is stale and
//                        taken over. Removed when the run ends.
//
// A directory holding another run's outputs (metrics.csv with a row, checkpoints/, sample.txt) is
// refused unless the run resumes from it (exp_manager.resume_if_exists, or
// resume_from_checkpoint inside its checkpoints/) or exp_manager.existing_run=set_aside (`auto`,
// the default, means set_aside in kDefaultRunDir and refuse elsewhere: cli.cpp), which moves them
// (with config.yaml and tensorboard/) to <exp_dir>/previous_runs/<k>/ first. A resumed run keeps
// the earlier metrics.csv as metrics.<k>.csv. Nothing is ever deleted or overwritten.
#include <string>
#include <vector>

namespace nxd::train_app {

// exp_manager.exp_dir's default: exp_manager.existing_run=auto sets an earlier run aside here.
inline constexpr const char* kDefaultRunDir = "runs/nxd_train";

struct RunDirOptions {
  std::string out_dir;
  std::string checkpoint_dir;           // <out_dir>/checkpoints
  bool resume_if_exists = false;        // exp_manager.resume_if_exists
  std::string resume_from;              // exp_manager.resume_from_checkpoint ("" = none)
  std::string existing_run = "refuse";  // exp_manager.existing_run: refuse | set_aside
  std::string program = "nxd-train";    // for messages
};

class RunDir {
 public:
  // Takes the lock and checks (or sets aside) the directory's contents; ConfigError naming the
  // owner or the outputs found, IoError when the directory cannot be written.
  explicit RunDir(const RunDirOptions& opts);
  ~RunDir();  // releases the lock and removes nxd.lock
  RunDir(const RunDir&) = delete;
  RunDir& operator=(const RunDir&) = delete;
  // What was done besides locking (a stale lock taken over, outputs moved), one line each.
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  void lock(const RunDirOptions& o);
  void check_outputs(const RunDirOptions& o);
  std::string lock_path_;
  int fd_ = -1;
  std::vector<std::string> notes_;
};

// "pid 123 host h started 2026-11-25T14:00:00Z" of this process.
std::string lock_owner_line();

}  // namespace nxd::train_app
