#pragma once
// Capture: runs a forward with this rank's recorder active and returns the graph of every op it
// ran (runtime/trace_hook.h is the hook the ops call). Tracing runs on host or meta tensors.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nxd/trace/graph.h"

namespace nxd::trace {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
// The forward: arguments -> outputs. It may read parameters and state it captured itself; the
// tracer tells them apart by identity (TraceInputs).
using ForwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& args)>;

struct TraceInputs {
  NamedTensors params;  // the weights, by name (a module's named_parameters())
  std::vector<Tensor> args;
  NamedTensors state;  // tensors the forward updates in place (K/V caches), by name
};

struct TraceResult {
  Graph graph;
  std::vector<Tensor> outputs;    // what the forward returned while tracing
  std::vector<Tensor> constants;  // values of the graph's constants (host tracing), in order
};

// Runs fn(in.args) without autograd, recording every outermost op into a graph. Inputs of ops
// that are none of params, args, state or earlier outputs become constants (tensors the forward
// made itself, e.g. with full()). Throws TraceError when the forward reads a traced value on the
// host outside an op (naming the read and the op that produced the value), when an op reads a
// raw view of a traced value, or when an output was not computed by ops.
TraceResult trace_graph(const ForwardFn& fn, const TraceInputs& in);

}  // namespace nxd::trace
