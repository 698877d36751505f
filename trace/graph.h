#pragma once
// The traced graph of one rank and one input shape (a bucket): values (parameters, arguments,
// state, intermediates and constants) and nodes (one recorded op each, replayed by calling the
// same nxd op through the registry in replay.h). Serialized as JSON (docs/design/trace.md, "Traced
// models": the file format).
#include <cstdint>
#include <string>
#include <vector>

#include "nxd/runtime/trace_hook.h"

namespace nxd::trace {

// A model that cannot be traced (a host read of traced data, an op with no replay), or a trace
// file that is damaged, of another version or of another model. Tools exit with code 2.
class TraceError : public UserError {
 public:
  using UserError::UserError;
};

enum class ValueKind { param, arg, state, intermediate, constant };
const char* value_kind_name(ValueKind k);
ValueKind value_kind_from(const std::string& s, const std::string& where);

struct Value {
  int id = 0;
  ValueKind kind = ValueKind::intermediate;
  std::string name;  // param: the module's parameter name; state: its key; arg: "arg<i>"
  DType dtype = DType::f32;
  Shape shape;
  int producer = -1;  // the node that defines it (intermediates)
  int alias_of = -1;  // a view: the value whose storage it shares (its root base)
  int64_t nbytes() const { return shape_numel(shape) * dtype_size(dtype); }
};

struct Node {
  std::string op;
  OpAttrs attrs;
  std::vector<int> inputs;  // value ids; -1 = an absent optional input
  std::vector<int> outputs;
};

struct Graph {
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<int> params, args, state, constants;  // value ids by kind, in binding order
  std::vector<int> outputs;                         // value ids returned, in order
};

// JSON text of the graph (stable key order: equal graphs give equal text) and back. from_json
// validates ids, kinds, dtypes and shapes (TraceError naming `where` and the entry).
std::string graph_to_json(const Graph& g);
Graph graph_from_json(const std::string& text, const std::string& where);

// A readable listing: one line per value binding and per node, "%3 = linear(%0, %1) f32[2,8]".
std::string graph_dump(const Graph& g);

}  // namespace nxd::trace
