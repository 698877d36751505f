#pragma once
// Compile (what compiler_args mean in nxd): passes over a traced graph and the static memory
// plan, and the executor that replays the result.
//   dce   dead-code elimination: nodes whose outputs reach no graph output and that write no state
//   plan  every intermediate that is not a view and not (the base of) an output gets an offset in
//         one arena, assigned by liveness (greedy, largest first; inclusive intervals so an op's
//         output never overlaps its inputs); views alias their base, which lives until the last
//         use of any of its views. The replay places each op's output at its offset.
//   fuse  linear followed by a residual add -> one linear_add (trace/fuse.h)
// Passes run in the order dce, fuse, plan. Arguments: "-O1" dce and plan (the default), "-O2"
// those and fuse, "-O0" none; "--no-dce", "--no-plan", "--fuse", "--no-fuse" one each.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nxd/trace/graph.h"
#include "nxd/trace/replay.h"

namespace nxd::trace {

struct CompileOptions {
  bool dce = true;
  bool fuse = false;  // trace/fuse.h: measured slower (docs/design/trace.md), so off by default
  bool plan = true;
};
// Parses compiler_args (space-separated); an unknown flag is a TraceError naming it.
CompileOptions parse_compiler_args(const std::string& args);

struct MemoryPlan {
  std::vector<int64_t> offset;     // per value: its arena offset, or -1 (not in the arena)
  std::vector<int> last_use;       // per value: the last node reading it (or its views), or -1
  int64_t arena_bytes = 0;         // the arena's size
  int64_t intermediate_bytes = 0;  // all planned intermediates side by side (no reuse)
};

struct CompiledGraph {
  Graph graph;  // after the passes
  MemoryPlan plan;
  CompileOptions options;
  int fused_nodes = 0;                          // linear+add pairs fused
  int removed_nodes = 0;                        // by dce
  std::vector<const OpInfo*> ops;               // per node (resolved at compile time)
  std::vector<std::vector<int>> release_after;  // per node: values dropped after it runs
};

// Runs the passes and resolves every op (TraceError naming an op with no replay).
CompiledGraph compile(Graph g, const CompileOptions& opts);
// The graph's listing followed by its plan (one line per placed value), for compiler_workdir.
std::string plan_dump(const CompiledGraph& c);

// Per-rank buffers of one compiled graph: its arena.
struct ReplayState {
  std::shared_ptr<Storage> arena;
  int64_t placed = 0;  // outputs the last run placed in the arena (the plan at work)
};

struct Bindings {
  const std::vector<Tensor>* params = nullptr;  // by the graph's param order
  const std::vector<Tensor>* args = nullptr;
  const std::vector<Tensor>* state = nullptr;
  const std::vector<Tensor>* constants = nullptr;
};

// Replays the graph on this rank: the outputs, in order. Inputs are checked against the graph's
// shapes and dtypes (ShapeError naming the argument).
std::vector<Tensor> run(const CompiledGraph& c, const Bindings& b, ReplayState& st);

}  // namespace nxd::trace
