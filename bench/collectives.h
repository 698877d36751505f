#pragma once
// nxd-bench-collectives' shared parts: flags, rows and one call of the op (collectives.cpp: the
// flags, the sim backend and main; collectives_mpi.cpp: the MPI backend).
#include <string>
#include <utility>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/sim/collective_cost.h"
#include "nxd/collectives/sim/launch.h"

namespace nxd::bench::coll {

using sim::CollKind;

struct Args {
  std::string backend = "sim";
  std::string op = "all_reduce";
  int64_t min_bytes = 8, max_bytes = 256 << 20;
  std::string instance;
  int ranks = 0;
  DType dtype = DType::f32;
  int iters = 0;   // 0: by size
  int rounds = 0;  // timed rounds per row; 0: 3 on sim, 5 on MPI
  sim::Algorithm algorithm = sim::Algorithm::automatic;
  std::vector<std::string> algos;  // MPI: nxd algorithms forced in turn (mpi, ring, rdh)
  double host_budget_gib = 8;
};

CollKind parse_op(const std::string& s);

// What a row runs: the op on `ranks` members in `dtype`.
struct Shape {
  CollKind kind = CollKind::all_reduce;
  int ranks = 1;
  DType dtype = DType::f32;
};
// Elements per rank call for a row of `bytes` (nccl-tests: S is the full array; for all-gather
// the output, for reduce-scatter the input, for all-to-all the per-rank buffer).
int64_t count_for(const Shape& s, int64_t bytes);
// Elements of the host buffers (a, b) one rank needs for a call of `n` elements.
std::pair<int64_t, int64_t> buffer_elems(const Shape& s, int64_t n);

// One call: the op on `a` (send, or the in-place buffer) and `b` (recv), `count` elements.
struct Row {
  CollKind kind = CollKind::all_reduce;
  void* a = nullptr;
  void* b = nullptr;
  int64_t count = 0;
  DType dtype = DType::f32;
};
void run_op(Communicator& c, const Row& row);

int iters_for(const Args& a, int64_t bytes);
std::vector<int64_t> sizes(const Args& a);

// --backend mpi (collectives_mpi.cpp); throws ConfigError when nxd was built without MPI.
int run_mpi(const Args& a, int argc, char** argv);

}  // namespace nxd::bench::coll
