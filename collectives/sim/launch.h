#pragma once
// The sim backend: world_size ranks as threads of this process on a modeled Neuron machine.
//
// sim::launch(options, fn) runs fn on every rank, each in its own Context (made current with a
// ContextGuard) holding: the world communicator (nxd::world()), a SimClock as cost model (kernels
// and collectives advance it), and a memory counter whose capacity is the core's HBM (16 GiB on
// NeuronCore-v2), so an allocation beyond it throws OutOfDeviceMemory. BLAS runs single-threaded
// while ranks run. Data really moves through shared memory: each rank reduces its own chunk of
// every all-reduce directly from the peers' buffers in rank order and writes it into every
// member's output, so results are bitwise identical on every rank and every run. A collective
// costs two rendezvous of the group (arrival, completion); a waiting rank spins briefly when the
// world has no more ranks than hardware threads (adaptively: less after spins that failed), then
// sleeps on a futex. NXD_SIM_SPIN_US sets the longest spin in microseconds (0: never spin;
// default 50, or 0 when ranks outnumber hardware threads).
//
// Non-blocking calls (iall_reduce, ...) move their data when issued, in issue order, and run on
// the rank's comm stream of the simulated clock: they overlap the compute charged before wait(),
// which advances the clock to the collective's modeled finish. irecv is deferred to wait(), so a
// receive posted before the matching send never blocks.
//
// Failures never hang: ranks calling mismatched collectives on a group (op, dtype, count, root,
// reduce op) all get a CommError listing each rank's call; when every live rank is blocked
// (e.g. calls on different groups, a recv nobody sends) they get a CommError naming each rank's
// call; a rank waiting longer than `timeout_s` in one call gets a CommError naming the ranks that
// never arrived; an exception in one rank stops the others (they get CommError) and launch
// rethrows the first failure, same error type, prefixed with its rank.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nxd/collectives/sim/collective_cost.h"
#include "nxd/runtime/sim/clock.h"
#include "nxd/runtime/sim/machine.h"
#include "nxd/runtime/sim/timeline.h"

namespace nxd::sim {

struct LaunchOptions {
  int world_size = 1;
  // Instance type (see machine()); empty: trn1.32xlarge, or a cluster of them for > 32 ranks.
  std::string instance;
  std::optional<MachineSpec> machine;  // overrides `instance`: a user-defined machine
  uint64_t seed = 0;                   // every rank's Context seed
  // Wall-clock limit on one wait in one call (a longer wait is a CommError); 0: the
  // NXD_SIM_TIMEOUT environment variable, else 300 s.
  double timeout_s = 0;
  int64_t memory_capacity = -1;                // bytes per rank; -1: the core's HBM; 0: unlimited
  Algorithm algorithm = Algorithm::automatic;  // intra-instance collective algorithm to model
  // The timeline of every kernel and collective (LaunchResult::timeline) is recorded only when
  // asked for: it grows with every call, so a long run would otherwise fill the host's memory.
  bool record_timeline = false;
  std::string
      timeline_path;  // if set, the timeline is recorded and written there as a Chrome trace
};

struct RankReport {
  int rank = 0;
  double sim_seconds = 0;      // the rank's simulated clock at the end
  double compute_seconds = 0;  // modeled kernel time
  double comm_seconds = 0;     // modeled communication time
  double wait_seconds = 0;     // waiting for peers on the simulated clock
  int64_t peak_bytes = 0;      // peak device memory
};

struct LaunchResult {
  MachineSpec machine;
  std::vector<RankReport> ranks;
  std::shared_ptr<Timeline> timeline;  // null unless record_timeline or timeline_path was set
  double sim_seconds() const;          // the slowest rank
};

LaunchResult launch(const LaunchOptions& options, const std::function<void()>& fn);
LaunchResult launch(int world_size, const std::function<void()>& fn);

// The machine a launch of `world_size` ranks uses for these options (throws ConfigError).
MachineSpec resolve_machine(const LaunchOptions& options);

}  // namespace nxd::sim
