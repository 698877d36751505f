#pragma once
// A timeline of every rank's compute and communication on the simulated clock, written as Chrome
// trace JSON (chrome://tracing, https://ui.perfetto.dev). Each rank appends only to its own lane,
// so ranks (threads) record without locks; write/events are called after the ranks finished.
// Rank r's events are on thread 2r (compute, blocking comm, waits), 2r+1 (async comm) and, for
// "phase" spans (a pipeline stage's forward or backward of one microbatch), 2*ranks + r.
#include <string>
#include <vector>

namespace nxd::sim {

struct TraceEvent {
  std::string name;
  const char* category = "compute";  // "compute", "comm", "comm-async", "wait", "phase"
  double start = 0;                  // seconds on the simulated clock
  double duration = 0;
  std::string args;  // optional extra text (e.g. "bytes=4096 algo=ring")
};

class Timeline {
 public:
  explicit Timeline(int ranks = 1) : lanes_(ranks) {}
  int ranks() const { return static_cast<int>(lanes_.size()); }
  // Called only by the thread of `rank`.
  void add(int rank, TraceEvent e) { lanes_.at(rank).push_back(std::move(e)); }
  const std::vector<TraceEvent>& events(int rank) const { return lanes_.at(rank); }
  std::string chrome_trace_json() const;
  void write_chrome_trace(const std::string& path) const;  // throws IoError

 private:
  std::vector<std::vector<TraceEvent>> lanes_;
};

}  // namespace nxd::sim
