#include "nxd/trace/compile.h"

#include <algorithm>
#include <sstream>

#include "nxd/runtime/context.h"
#include "nxd/trace/fuse.h"

namespace nxd::trace {

CompileOptions parse_compiler_args(const std::string& args) {
  CompileOptions o;
  std::istringstream is(args);
  std::string w;
  while (is >> w) {
    if (w == "-O0") {
      o.dce = o.fuse = o.plan = false;
    } else if (w == "-O1") {
      o.dce = o.plan = true;
      o.fuse = false;
    } else if (w == "-O2") {
      o.dce = o.fuse = o.plan = true;
    } else if (w == "--fuse") {
      o.fuse = true;
    } else if (w == "--no-dce") {
      o.dce = false;
    } else if (w == "--no-plan") {
      o.plan = false;
    } else if (w == "--no-fuse") {
      o.fuse = false;
    } else {
      throw TraceError(str("[compiler_args] unknown flag '", w,
                           "' (known: -O0 -O1 -O2 --no-dce --no-plan --fuse --no-fuse)"));
    }
  }
  return o;
}

namespace {

int root_of(const Graph& g, int id) {
  return g.values[id].alias_of >= 0 ? g.values[id].alias_of : id;
}

// Drops nodes whose outputs are never read and that have no effect; returns how many.
int dead_code_elimination(Graph& g) {
  std::vector<char> live(g.values.size(), 0);
  for (int o : g.outputs) live[o] = 1;
  std::vector<char> keep(g.nodes.size(), 0);
  for (int k = static_cast<int>(g.nodes.size()) - 1; k >= 0; --k) {
    const Node& n = g.nodes[k];
    bool needed = op_has_effect(n.op);
    for (int o : n.outputs) needed = needed || live[o] || live[root_of(g, o)];
    if (!needed) continue;
    keep[k] = 1;
    for (int i : n.inputs)
      if (i >= 0) live[i] = live[root_of(g, i)] = 1;
  }
  std::vector<Node> nodes;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    if (!keep[k]) {
      for (int o : g.nodes[k].outputs) g.values[o].producer = -1;
      continue;
    }
    for (int o : g.nodes[k].outputs) g.values[o].producer = static_cast<int>(nodes.size());
    nodes.push_back(std::move(g.nodes[k]));
  }
  const int removed = static_cast<int>(g.nodes.size() - nodes.size());
  g.nodes = std::move(nodes);
  return removed;
}

MemoryPlan plan_memory(const Graph& g, bool place) {
  const size_t n = g.values.size();
  MemoryPlan p;
  p.offset.assign(n, -1);
  p.last_use.assign(n, -1);
  for (size_t k = 0; k < g.nodes.size(); ++k)
    for (int i : g.nodes[k].inputs)
      if (i >= 0) {
        p.last_use[i] = static_cast<int>(k);
        p.last_use[root_of(g, i)] = std::max(p.last_use[root_of(g, i)], static_cast<int>(k));
      }
  if (!place) return p;
  std::vector<char> excluded(n, 0);
  for (int o : g.outputs) excluded[o] = excluded[root_of(g, o)] = 1;
  std::vector<int> cand;
  for (size_t v = 0; v < n; ++v) {
    const Value& x = g.values[v];
    if (x.kind == ValueKind::intermediate && x.alias_of < 0 && x.producer >= 0 && !excluded[v] &&
        p.last_use[v] >= 0 && g.nodes[x.producer].outputs.size() == 1)
      cand.push_back(static_cast<int>(v));
  }
  std::stable_sort(cand.begin(), cand.end(),
                   [&](int a, int b) { return g.values[a].nbytes() > g.values[b].nbytes(); });
  constexpr int64_t kAlign = 64;
  struct Placed {
    int64_t begin, end;
    int from, to;
  };
  std::vector<Placed> placed;
  for (int v : cand) {
    const Value& x = g.values[v];
    const int from = x.producer, to = p.last_use[v];
    const int64_t size = (x.nbytes() + kAlign - 1) / kAlign * kAlign;
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Placed& q : placed)
      if (q.from <= to && from <= q.to) busy.emplace_back(q.begin, q.end);
    std::sort(busy.begin(), busy.end());
    int64_t off = 0;
    for (const auto& [b, e] : busy) {
      if (off + size <= b) break;
      off = std::max(off, e);
    }
    placed.push_back({off, off + size, from, to});
    p.offset[v] = off;
    p.arena_bytes = std::max(p.arena_bytes, off + size);
    p.intermediate_bytes += size;
  }
  return p;
}

}  // namespace

CompiledGraph compile(Graph g, const CompileOptions& opts) {
  CompiledGraph c;
  c.options = opts;
  if (opts.dce) c.removed_nodes = dead_code_elimination(g);
  if (opts.fuse) c.fused_nodes = fuse_linear_residual(g);
  c.plan = plan_memory(g, opts.plan);
  for (const Node& n : g.nodes) {
    const OpInfo* info = find_op(n.op);
    if (!info)
      throw TraceError(str("[trace] op '", n.op, "' has no replay function (register_op)"));
    c.ops.push_back(info);
  }
  c.release_after.assign(g.nodes.size(), {});
  std::vector<char> keep(g.values.size(), 0);
  for (int o : g.outputs) keep[o] = 1;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (g.values[v].kind == ValueKind::intermediate && !keep[v] && c.plan.last_use[v] >= 0)
      c.release_after[c.plan.last_use[v]].push_back(static_cast<int>(v));
  c.graph = std::move(g);
  return c;
}

std::string plan_dump(const CompiledGraph& c) {
  std::ostringstream os;
  os << graph_dump(c.graph);
  os << "\n# passes: dce=" << (c.options.dce ? "on" : "off")
     << " fuse=" << (c.options.fuse ? "on" : "off") << " plan=" << (c.options.plan ? "on" : "off")
     << "; dce removed " << c.removed_nodes << " nodes; " << c.fused_nodes
     << " linear+add pairs fused; " << c.graph.nodes.size() << " nodes remain\n";
  os << "# arena " << c.plan.arena_bytes << " bytes for " << c.plan.intermediate_bytes
     << " bytes of planned intermediates\n";
  for (size_t v = 0; v < c.plan.offset.size(); ++v)
    if (c.plan.offset[v] >= 0)
      os << "%" << v << " offset=" << c.plan.offset[v] << " bytes=" << c.graph.values[v].nbytes()
         << " live=[" << c.graph.values[v].producer << "," << c.plan.last_use[v] << "]\n";
  return os.str();
}

namespace {

void bind(std::vector<Tensor>& vals, const Graph& g, const std::vector<int>& ids,
          const std::vector<Tensor>* ts, const char* what) {
  const size_t have = ts ? ts->size() : 0;
  NXD_CHECK(have == ids.size(), "[trace] the graph takes ", ids.size(), " ", what, ", got ", have);
  for (size_t i = 0; i < ids.size(); ++i) {
    const Value& v = g.values[ids[i]];
    const Tensor& t = (*ts)[i];
    NXD_CHECK_SHAPE(t.defined() && t.shape() == v.shape && t.dtype() == v.dtype, "[trace] ", what,
                    " ", i, " ('", v.name, "') must be ", dtype_name(v.dtype), shape_str(v.shape),
                    ", got ", t.defined() ? t.desc() : "undefined");
    vals[ids[i]] = t;
  }
}

}  // namespace

std::vector<Tensor> run(const CompiledGraph& c, const Bindings& b, ReplayState& st) {
  const Graph& g = c.graph;
  std::vector<Tensor> vals(g.values.size());
  bind(vals, g, g.params, b.params, "parameters");
  bind(vals, g, g.args, b.args, "arguments");
  bind(vals, g, g.state, b.state, "state tensors");
  bind(vals, g, g.constants, b.constants, "constants");
  const bool place =
      c.plan.arena_bytes > 0 && !(b.args && !b.args->empty() && (*b.args)[0].is_meta());
  if (place && !st.arena) st.arena = Storage::allocate(c.plan.arena_bytes, Device::host);
  PlacementSlot* slot = place ? &current_context().ext<PlacementSlot>() : nullptr;
  NoGradGuard ng;
  st.placed = 0;
  std::vector<Tensor> in;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    in.clear();
    for (int i : n.inputs) in.push_back(i >= 0 ? vals[i] : Tensor());
    const int64_t off = n.outputs.size() == 1 ? c.plan.offset[n.outputs[0]] : -1;
    if (slot && off >= 0) {
      slot->data = static_cast<char*>(st.arena->data()) + off;
      slot->nbytes = g.values[n.outputs[0]].nbytes();
      slot->armed = true;
    }
    std::vector<Tensor> out;
    try {
      out = c.ops[k]->fn(in, n.attrs);
    } catch (...) {
      if (slot) slot->armed = false;
      throw;
    }
    if (slot) {
      slot->armed = false;
      if (off >= 0 && !out.empty() && out[0].storage()->data() == slot->data) ++st.placed;
    }
    NXD_CHECK(out.size() == n.outputs.size(), "[trace] replay of '", n.op, "' gave ", out.size(),
              " outputs, the trace had ", n.outputs.size());
    for (size_t j = 0; j < out.size(); ++j) {
      const Value& v = g.values[n.outputs[j]];
      NXD_CHECK_SHAPE(out[j].shape() == v.shape && out[j].dtype() == v.dtype, "[trace] replay of '",
                      n.op, "' (node ", k, ") gave ", out[j].desc(), ", the trace had ",
                      dtype_name(v.dtype), shape_str(v.shape));
      vals[n.outputs[j]] = std::move(out[j]);
    }
    for (int v : c.release_after[k]) vals[v] = Tensor();
  }
  std::vector<Tensor> outs;
  for (int o : g.outputs) outs.push_back(vals[o]);
  return outs;
}

}  // namespace nxd::trace
