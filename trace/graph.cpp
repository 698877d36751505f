#include "nxd/trace/graph.h"

#include <nlohmann/json.hpp>
#include <sstream>

namespace nxd::trace {

using nlohmann::json;

namespace {
constexpr const char* kKinds[] = {"param", "arg", "state", "intermediate", "constant"};

json attrs_to_json(const OpAttrs& a) {
  json j = json::array();
  for (const auto& [k, v] : a.items) {
    json e = {{"key", k}};
    if (auto* i = std::get_if<int64_t>(&v)) e["i"] = *i;
    if (auto* f = std::get_if<double>(&v)) e["f"] = *f;
    if (auto* s = std::get_if<std::string>(&v)) e["s"] = *s;
    if (auto* l = std::get_if<std::vector<int64_t>>(&v)) e["ints"] = *l;
    j.push_back(e);
  }
  return j;
}

OpAttrs attrs_from_json(const json& j) {
  OpAttrs a;
  for (const auto& e : j) {
    const std::string k = e.at("key").get<std::string>();
    if (e.contains("i"))
      a.set(k, e.at("i").get<int64_t>());
    else if (e.contains("f"))
      a.set(k, e.at("f").get<double>());
    else if (e.contains("s"))
      a.set(k, e.at("s").get<std::string>());
    else
      a.set(k, e.at("ints").get<std::vector<int64_t>>());
  }
  return a;
}

// `id` names one of the graph's n values.
void check_id(int id, size_t n, const std::string& where, const char* what) {
  if (id < 0 || static_cast<size_t>(id) >= n)
    throw TraceError(
        str("[trace] ", where, ": ", what, " refers to value ", id, " of ", n, " values"));
}
// `id` names one of the n values, or is -1 (none).
void check_id_or_none(int id, size_t n, const std::string& where, const char* what) {
  if (id != -1) check_id(id, n, where, what);
}

void validate(const Graph& g, const std::string& where) {
  const size_t n = g.values.size();
  for (size_t i = 0; i < n; ++i) {
    const Value& v = g.values[i];
    if (v.id != static_cast<int>(i))
      throw TraceError(str("[trace] ", where, ": value ", i, " has id ", v.id));
    int64_t numel = 1;
    for (int64_t d : v.shape) {
      if (d < 0) throw TraceError(str("[trace] ", where, ": value ", i, " has a negative dim"));
      if (d > 0 && numel > (int64_t{1} << 48) / d)
        throw TraceError(str("[trace] ", where, ": value ", i, " has more than 2^48 elements"));
      numel *= d;
    }
    check_id_or_none(v.alias_of, n, where, "an alias");
    if (v.producer < -1 || v.producer >= static_cast<int>(g.nodes.size()))
      throw TraceError(str("[trace] ", where, ": value ", i, " has producer ", v.producer));
  }
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    for (int id : g.nodes[k].inputs) check_id_or_none(id, n, where, "a node input");
    for (int id : g.nodes[k].outputs) {
      check_id(id, n, where, "a node output");
      if (g.values[id].producer != static_cast<int>(k))
        throw TraceError(str("[trace] ", where, ": node ", k, " (", g.nodes[k].op,
                             ") outputs value ", id, " which names producer ",
                             g.values[id].producer));
    }
  }
  auto check_kind = [&](const std::vector<int>& ids, ValueKind kind) {
    for (int id : ids) {
      check_id(id, n, where, value_kind_name(kind));
      if (g.values[id].kind != kind)
        throw TraceError(str("[trace] ", where, ": value ", id, " is listed as a ",
                             value_kind_name(kind), " but is a ",
                             value_kind_name(g.values[id].kind)));
    }
  };
  check_kind(g.params, ValueKind::param);
  check_kind(g.args, ValueKind::arg);
  check_kind(g.state, ValueKind::state);
  check_kind(g.constants, ValueKind::constant);
  for (int id : g.outputs) check_id(id, n, where, "an output");
}
}  // namespace

const char* value_kind_name(ValueKind k) {
  return kKinds[static_cast<int>(k)];
}

ValueKind value_kind_from(const std::string& s, const std::string& where) {
  for (int i = 0; i < 5; ++i)
    if (s == kKinds[i]) return static_cast<ValueKind>(i);
  throw TraceError(str("[trace] ", where, ": unknown value kind '", s, "'"));
}

std::string graph_to_json(const Graph& g) {
  json vs = json::array();
  for (const Value& v : g.values)
    vs.push_back({{"id", v.id},
                  {"kind", value_kind_name(v.kind)},
                  {"name", v.name},
                  {"dtype", dtype_name(v.dtype)},
                  {"shape", v.shape},
                  {"producer", v.producer},
                  {"alias_of", v.alias_of}});
  json ns = json::array();
  for (const Node& n : g.nodes)
    ns.push_back({{"op", n.op},
                  {"attrs", attrs_to_json(n.attrs)},
                  {"inputs", n.inputs},
                  {"outputs", n.outputs}});
  json j = {{"values", vs},        {"nodes", ns},      {"params", g.params},
            {"args", g.args},      {"state", g.state}, {"constants", g.constants},
            {"outputs", g.outputs}};
  return j.dump(1);
}

Graph graph_from_json(const std::string& text, const std::string& where) {
  Graph g;
  try {
    const json j = json::parse(text);
    for (const auto& v : j.at("values")) {
      Value x;
      x.id = v.at("id").get<int>();
      x.kind = value_kind_from(v.at("kind").get<std::string>(), where);
      x.name = v.at("name").get<std::string>();
      x.dtype = dtype_from_name(v.at("dtype").get<std::string>());
      x.shape = v.at("shape").get<Shape>();
      x.producer = v.at("producer").get<int>();
      x.alias_of = v.at("alias_of").get<int>();
      g.values.push_back(std::move(x));
    }
    for (const auto& n : j.at("nodes")) {
      Node x;
      x.op = n.at("op").get<std::string>();
      x.attrs = attrs_from_json(n.at("attrs"));
      x.inputs = n.at("inputs").get<std::vector<int>>();
      x.outputs = n.at("outputs").get<std::vector<int>>();
      g.nodes.push_back(std::move(x));
    }
    g.params = j.at("params").get<std::vector<int>>();
    g.args = j.at("args").get<std::vector<int>>();
    g.state = j.at("state").get<std::vector<int>>();
    g.constants = j.at("constants").get<std::vector<int>>();
    g.outputs = j.at("outputs").get<std::vector<int>>();
  } catch (const TraceError&) {
    throw;
  } catch (const std::exception& e) {
    throw TraceError(str("[trace] ", where, ": not a valid graph: ", e.what()));
  }
  validate(g, where);
  return g;
}

namespace {
std::string attr_str(const AttrValue& v) {
  std::ostringstream os;
  if (auto* i = std::get_if<int64_t>(&v)) os << *i;
  if (auto* f = std::get_if<double>(&v)) os << *f;
  if (auto* s = std::get_if<std::string>(&v)) os << '"' << *s << '"';
  if (auto* l = std::get_if<std::vector<int64_t>>(&v)) os << shape_str(*l);
  return os.str();
}
std::string type_str(const Value& v) {
  return str(dtype_name(v.dtype), shape_str(v.shape));
}
}  // namespace

std::string graph_dump(const Graph& g) {
  std::ostringstream os;
  for (const Value& v : g.values)
    if (v.kind != ValueKind::intermediate)
      os << "%" << v.id << " = " << value_kind_name(v.kind) << " \"" << v.name << "\" "
         << type_str(v) << "\n";
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    os << "[" << k << "] ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", %" : "%") << n.outputs[i];
    os << " = " << n.op << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i)
      os << (i ? ", " : "") << (n.inputs[i] < 0 ? std::string("none") : str("%", n.inputs[i]));
    os << ")";
    for (const auto& [key, v] : n.attrs.items) os << " " << key << "=" << attr_str(v);
    for (int o : n.outputs) {
      os << " " << type_str(g.values[o]);
      if (g.values[o].alias_of >= 0) os << " (view of %" << g.values[o].alias_of << ")";
    }
    os << "\n";
  }
  os << "return";
  for (size_t i = 0; i < g.outputs.size(); ++i) os << (i ? ", %" : " %") << g.outputs[i];
  os << "\n";
  return os.str();
}

}  // namespace nxd::trace
