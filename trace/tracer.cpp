#include "nxd/trace/tracer.h"

#include <unordered_map>

#include "nxd/runtime/context.h"
#include "nxd/trace/replay.h"

namespace nxd::trace {

namespace {

class Recorder : public OpRecorder {
 public:
  Graph g;
  std::vector<Tensor> constants;

  int add_value(const Tensor& t, ValueKind kind, std::string name, int producer = -1) {
    Value v;
    v.id = static_cast<int>(g.values.size());
    v.kind = kind;
    v.name = std::move(name);
    v.dtype = t.dtype();
    v.shape = t.shape();
    v.producer = producer;
    auto it = by_storage_.find(t.storage().get());
    if (it != by_storage_.end() && kind == ValueKind::intermediate)
      v.alias_of = it->second;
    else
      by_storage_.emplace(t.storage().get(), v.id);
    by_impl_[t.impl()] = v.id;
    keep_.push_back(t);
    g.values.push_back(v);
    switch (kind) {
      case ValueKind::param:
        g.params.push_back(v.id);
        break;
      case ValueKind::arg:
        g.args.push_back(v.id);
        break;
      case ValueKind::state:
        g.state.push_back(v.id);
        break;
      case ValueKind::constant:
        g.constants.push_back(v.id);
        break;
      default:
        break;
    }
    return v.id;
  }

  int find(const Tensor& t) const {
    auto it = by_impl_.find(t.impl());
    return it == by_impl_.end() ? -1 : it->second;
  }

  std::string describe(int id) const {
    const Value& v = g.values[id];
    const std::string type = str(dtype_name(v.dtype), shape_str(v.shape));
    if (v.kind == ValueKind::intermediate)
      return str("%", id, " (", type, ", output of '", g.nodes[v.producer].op, "')");
    return str("%", id, " (", type, ", ", value_kind_name(v.kind), " '", v.name, "')");
  }

  int input_id(const char* op, size_t i, const Tensor& t) {
    if (!t.defined()) return -1;
    if (int id = find(t); id >= 0) return id;
    auto it = by_storage_.find(t.storage().get());
    if (it != by_storage_.end() && g.values[it->second].kind != ValueKind::param)
      throw TraceError(str("[trace] op '", op, "' input ", i, " (", t.desc(),
                           ") is a raw view of the traced value ", describe(it->second),
                           " made outside nxd ops: the trace would not follow it"));
    const int id = add_value(t, ValueKind::constant, str("const", g.constants.size()));
    constants.push_back(t.is_meta() ? t : t.detach().clone());
    return id;
  }

  void record(const char* op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
              const OpAttrs& attrs) override {
    bool all_known = true;
    for (const Tensor& y : outputs)
      if (y.defined() && find(y) < 0) all_known = false;
    if (all_known && !op_has_effect(op)) return;  // the identity (e.g. dropout in eval mode)
    Node n;
    n.op = op;
    n.attrs = attrs;
    for (size_t i = 0; i < inputs.size(); ++i) n.inputs.push_back(input_id(op, i, inputs[i]));
    const int k = static_cast<int>(g.nodes.size());
    g.nodes.push_back(n);
    for (const Tensor& y : outputs) {
      NXD_CHECK(y.defined(), "[trace] op '", op, "' returned an undefined output");
      g.nodes[k].outputs.push_back(add_value(y, ValueKind::intermediate, "", k));
    }
  }

  void host_read(const char* what, const Tensor& t, int d) override {
    if (d > 0 || !t.defined()) return;  // an op reading its own inputs
    auto it = by_storage_.find(t.storage().get());
    if (it == by_storage_.end() || g.values[it->second].kind == ValueKind::param ||
        g.values[it->second].kind == ValueKind::constant)
      return;
    throw TraceError(str("[trace] ", what, " reads the traced value ", describe(it->second),
                         " on the host while tracing: the graph would keep only the branch taken "
                         "now; make the decision an op or pass it as a separate input"));
  }

 private:
  std::unordered_map<const TensorImpl*, int> by_impl_;
  std::unordered_map<const Storage*, int> by_storage_;
  std::vector<Tensor> keep_;  // keeps every traced tensor's address unique while tracing
};

class RecorderGuard {
 public:
  explicit RecorderGuard(OpRecorder* r) : slot_(current_context().ext<TraceSlot>()) {
    NXD_CHECK(slot_.recorder == nullptr, "[trace] a trace is already running on this rank");
    slot_.recorder = r;
  }
  ~RecorderGuard() { slot_.recorder = nullptr; }

 private:
  TraceSlot& slot_;
};

}  // namespace

TraceResult trace_graph(const ForwardFn& fn, const TraceInputs& in) {
  Recorder rec;
  for (const auto& [name, t] : in.params) rec.add_value(t, ValueKind::param, name);
  for (size_t i = 0; i < in.args.size(); ++i)
    rec.add_value(in.args[i], ValueKind::arg, str("arg", i));
  for (const auto& [name, t] : in.state) rec.add_value(t, ValueKind::state, name);
  std::vector<Tensor> outs;
  {
    NoGradGuard ng;
    RecorderGuard guard(&rec);
    outs = fn(in.args);
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const int id = rec.find(outs[i]);
    if (id < 0 || rec.g.values[id].kind == ValueKind::param)
      throw TraceError(str("[trace] output ", i, " (", outs[i].desc(),
                           ") was not computed by traced ops from the arguments"));
    rec.g.outputs.push_back(id);
  }
  return TraceResult{std::move(rec.g), std::move(outs), std::move(rec.constants)};
}

}  // namespace nxd::trace
