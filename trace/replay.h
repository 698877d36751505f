#pragma once
// The replay registry: op name -> the function that reruns it from its recorded inputs and
// attributes, calling the same nxd op (and so the same kernels) the forward called. The built-in
// ops are the ones nxd's models run (autograd/ops, the tensor-parallel mappings over the TP group
// of parallel_state, the vocabulary-parallel lookup); register_op adds a user's own.
#include <functional>
#include <string>
#include <vector>

#include "nxd/runtime/trace_hook.h"

namespace nxd::trace {

using ReplayFn =
    std::function<std::vector<Tensor>(const std::vector<Tensor>& in, const OpAttrs& a)>;

struct OpInfo {
  ReplayFn fn;
  bool effect = false;  // writes an input in place (a cache update): never dead, never skipped
};

// Registers (or replaces) op `name`. Thread-safe; lookups of built-ins need no registration.
void register_op(const std::string& name, OpInfo info);
// The op's entry, or null when unknown.
const OpInfo* find_op(const std::string& name);
bool op_has_effect(const std::string& name);

}  // namespace nxd::trace
