// Config values: YAML/JSON files, --set overrides, typed access, YAML output and the key reference.
#include "nxd/train_app/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "nxd/runtime/error.h"
#include "nxd/train_app/config_limits.h"

namespace nxd::train_app {

using json = nlohmann::json;

namespace {

std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return str("boolean ", v.dump());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return str("integer ", v.dump());
    case json::value_t::number_float:
      return str("number ", v.dump());
    case json::value_t::string:
      return str("string ", shorten(v.dump()));
    case json::value_t::array:
      return str("list ", shorten(v.dump()));
    case json::value_t::object:
      return "a mapping";
    default:
      return shorten(v.dump());
  }
}

bool is_section(const std::string& path) {
  const std::string pre = path + ".";
  for (const auto& k : config_keys())
    if (k.key.compare(0, pre.size(), pre) == 0) return true;
  return false;
}

[[noreturn]] void unknown_key(const std::string& k, const std::string& src) {
  throw ConfigError(str("[config] unknown key '", shorten(k), "' (", shorten(src),
                        "); did you mean '", nearest_key(k),
                        "'? (nxd-train --help-config lists every key)"));
}

// Plain YAML scalar -> typed JSON value (YAML 1.2 core schema, plus yes/no as strings).
json plain_scalar(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  {
    int64_t v;
    const char* b = s.data();
    const char* e = b + s.size();
    if (*b == '+') ++b;
    auto r = std::from_chars(b, e, v);
    if (r.ec == std::errc() && r.ptr == e) return v;
  }
  {
    double v;
    const char* b = s.data();
    const char* e = b + s.size();
    if (*b == '+') ++b;
    auto r = std::from_chars(b, e, v);
    if (r.ec == std::errc() && r.ptr == e && s.find_first_of("0123456789") != std::string::npos)
      return v;
    if (s == ".inf" || s == ".Inf") return std::numeric_limits<double>::infinity();
    if (s == "-.inf" || s == "-.Inf") return -std::numeric_limits<double>::infinity();
  }
  return s;
}

json yaml_to_json(const YAML::Node& n, NodeBudget& budget, int depth) {
  budget.enter(depth);
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      if (n.Tag() == "!") return n.Scalar();  // quoted: always a string
      return plain_scalar(n.Scalar());
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& c : n) a.push_back(yaml_to_json(c, budget, depth + 1));
      return a;
    }
    case YAML::NodeType::Map: {
      json o = json::object();
      for (const auto& kv : n) {
        const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : std::string("(a mapping)");
        if (o.contains(k))
          throw ConfigError(str("[config] ", budget.source, ":", kv.first.Mark().line + 1,
                                ": duplicate key '", shorten(k),
                                "' (each key or section may appear once in a mapping)"));
        o[k] = yaml_to_json(kv.second, budget, depth + 1);
      }
      return o;
    }
  }
  return nullptr;
}

std::string format_number(double d) {
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  if (std::isnan(d)) return ".nan";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // stays a float when reloaded
  return s;
}

template <class J>
std::string yaml_scalar(const J& v) {
  if (v.is_null()) return "null";
  if (v.is_string()) return v.dump();  // a JSON string is a valid YAML double-quoted scalar
  if (v.is_number_float()) return format_number(v.template get<double>());
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + yaml_scalar(v[i]);
    return s + "]";
  }
  return v.dump();
}

void emit_yaml(std::ostringstream& os, const nlohmann::ordered_json& node, int indent) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    os << std::string(indent, ' ') << it.key() << ":";
    if (it->is_object()) {
      os << "\n";
      emit_yaml(os, *it, indent + 2);
    } else {
      os << " " << yaml_scalar(*it) << "\n";
    }
  }
}

}  // namespace

std::string config_reference_markdown() {
  std::ostringstream os;
  os << "# nxd-train configuration\n\n"
     << "Every key `nxd-train` accepts, with its type and default. This file is generated from "
        "the registry in\n`train_app/config_keys.cpp` (`nxd-train --help-config`); a test checks "
        "they "
        "agree.\n\n"
     << "Keys follow NxD Training's YAML names. Set them in a YAML or JSON file (`--config "
        "FILE`, nested\nmappings or dotted keys) or on the command line (`--set "
        "model.optim.lr=3e-4`, the value read as a\nYAML scalar or flow list). Later sources "
        "win: defaults, then the file, then each `--set` in order,\nthen `--out DIR` "
        "(`exp_manager.exp_dir`). The resolved configuration is written to "
        "`DIR/config.yaml`,\nwhich `--config` reads back.\n\n"
     << "| key | type | default | description |\n|---|---|---|---|\n";
  for (const auto& s : config_keys()) {
    std::string type = key_type_name(s.type);
    if (!s.choices.empty()) {
      type = "one of ";
      for (size_t i = 0; i < s.choices.size(); ++i) type += (i ? ", " : "") + s.choices[i];
    }
    if (s.nullable) type += " or null";
    os << "| `" << s.key << "` | " << type << " | `" << yaml_scalar(s.default_value) << "` | "
       << s.doc << " |\n";
  }
  os << nxdt_reference_markdown();
  return os.str();
}

// ---- Config ----

Config::Config() {
  for (const auto& s : config_keys()) values_[s.key] = s.default_value;
}

json parse_yaml(const std::string& text, const std::string& source) {
  io::check_utf8(text, source, "config");
  io::check_flow_depth(text, /*yaml=*/true, source, "config");
  io::check_item_count(text, /*yaml=*/true, source, "config", ConfigLimits::max_nodes);
  NodeBudget budget{source};
  try {
    return yaml_to_json(YAML::Load(text), budget, 0);
  } catch (const YAML::Exception& e) {
    throw ConfigError(str("[config] ", shorten(source), ":", e.mark.line + 1, ":",
                          e.mark.column + 1, ": YAML syntax error: ", shorten(e.msg, 200)));
  }
}

void Config::merge_file(const std::string& path) {
  const std::string text =
      io::read_regular_file(path, "config file", ConfigLimits::max_file_bytes, "config");
  const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  const json tree = is_json ? parse_json_config(text, path) : parse_yaml(text, path);
  check_dotted_duplicates(tree, path);
  if (tree.is_null()) return;  // empty file
  if (!tree.is_object()) {
    // a text file that is not a config parses as one long string: show its first line only
    std::string first = text.substr(0, text.find('\n'));
    if (first.size() > 80) first = first.substr(0, 77) + "...";
    throw ConfigError(str("[config] ", path,
                          " is not a configuration: expected a mapping of keys at the top level, "
                          "got ",
                          tree.is_string() ? "text" : describe(tree), " (first line: '", first,
                          "')"));
  }
  merge_json(nxdt_tree(tree, path, not_applicable_), path);
}

void Config::merge_json(const json& tree, const std::string& source) {
  NXD_CHECK_T(ConfigError, tree.is_object(), "[config] ", source, ": expected a mapping, got ",
              describe(tree));
  merge_node(tree, "", source);
}

void Config::merge_node(const json& node, const std::string& prefix, const std::string& src) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string k = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (find_key(k)) {
      set(k, *it, src);
    } else if (it->is_object()) {
      if (!is_section(k)) unknown_key(k, src);
      merge_node(*it, k, src);
    } else if (is_section(k)) {
      throw ConfigError(str("[config] '", k, "' is a section (", src,
                            "): expected a mapping of its keys, got ", describe(*it)));
    } else {
      unknown_key(k, src);
    }
  }
}

void Config::apply_override(const std::string& a) {
  const auto eq = a.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(str("[config] --set expects dotted.key=value, got '", shorten(a), "'"));
  io::check_utf8(a, "--set", "config");
  const std::string k = a.substr(0, eq), text = a.substr(eq + 1);
  const std::string src = str("--set ", shorten(a));
  if (!find_key(k)) {
    if (is_section(k))
      throw ConfigError(str("[config] '", k, "' is a section (", src, "); set one of its keys"));
    unknown_key(k, src);
  }
  json v;
  if (find_key(k)->type == KeyType::string) {
    // a string key takes the text as written unless it is a quoted YAML string: prompts and
    // paths may look like numbers or contain ": "
    try {
      v = parse_yaml(text, src);
    } catch (const ConfigError&) {
    }
    // a nullable one takes YAML's null (`null`, `~`) as null
    const bool null = find_key(k)->nullable && (text == "null" || text == "~" || text == "Null");
    if (!v.is_string() && !null) v = text;
    if (null) v = nullptr;
  } else {
    v = parse_yaml(text, src);
  }
  set(k, v, src);
}

void Config::set(const std::string& k, const json& value, const std::string& src) {
  const KeySpec* spec = find_key(k);
  if (!spec) unknown_key(k, src);
  auto wrong = [&](const char* expected) {
    throw ConfigError(
        str("[config] ", k, ": expected ", expected, ", got ", describe(value), " (", src, ")"));
  };
  json v = value;
  if (v.is_null()) {
    if (!spec->nullable) wrong(key_type_name(spec->type));
    values_[k] = v;
    given_.insert(k);
    return;
  }
  switch (spec->type) {
    case KeyType::integer:
      if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::floor(d) != d || std::abs(d) > 9e15) wrong("an integer");
        v = static_cast<int64_t>(d);
      } else if (!v.is_number_integer()) {
        wrong("an integer");
      }
      break;
    case KeyType::number:
      if (!v.is_number()) wrong("a number");
      v = v.get<double>();
      break;
    case KeyType::boolean:
      if (!v.is_boolean()) wrong("a boolean (true or false)");
      break;
    case KeyType::string:
      if (v.is_number() || v.is_boolean()) v = v.dump();  // YAML `prompt: 42` means "42"
      if (!v.is_string()) wrong("a string");
      if (!spec->choices.empty() && std::find(spec->choices.begin(), spec->choices.end(),
                                              v.get<std::string>()) == spec->choices.end()) {
        std::string c;
        for (size_t i = 0; i < spec->choices.size(); ++i) c += (i ? ", " : "") + spec->choices[i];
        throw ConfigError(
            str("[config] ", k, ": ", shorten(v.dump()), " is not one of ", c, " (", src, ")"));
      }
      break;
    case KeyType::string_list:  // a list of strings, or one string (a pattern)
      if (v.is_string()) break;
      if (!v.is_array()) wrong("a list of strings or a string");
      for (const auto& e : v)
        if (!e.is_string()) wrong("a list of strings or a string");
      break;
    case KeyType::number_list: {
      if (!v.is_array()) wrong(str("a list of ", spec->list_size, " numbers").c_str());
      if (spec->list_size > 0 && static_cast<int64_t>(v.size()) != spec->list_size)
        wrong(str("a list of ", spec->list_size, " numbers").c_str());
      json out = json::array();
      for (const auto& e : v) {
        if (!e.is_number()) wrong("a list of numbers");
        out.push_back(e.get<double>());
      }
      v = out;
      break;
    }
  }
  values_[k] = v;
  given_.insert(k);
}

const json& Config::get(const std::string& k) const {
  auto it = values_.find(k);
  if (it == values_.end()) throw InternalError(str("[config] internal: unknown key '", k, "'"));
  return it->second;
}

int64_t Config::get_int(const std::string& k) const {
  const json& v = get(k);
  NXD_INTERNAL_CHECK(v.is_number_integer(), "[config] ", k, " is ", v.dump());
  return v.get<int64_t>();
}
double Config::get_double(const std::string& k) const {
  const json& v = get(k);
  NXD_INTERNAL_CHECK(v.is_number(), "[config] ", k, " is ", v.dump());
  return v.get<double>();
}
bool Config::get_bool(const std::string& k) const {
  const json& v = get(k);
  NXD_INTERNAL_CHECK(v.is_boolean(), "[config] ", k, " is ", v.dump());
  return v.get<bool>();
}
std::string Config::get_string(const std::string& k) const {
  const json& v = get(k);
  NXD_INTERNAL_CHECK(v.is_string(), "[config] ", k, " is ", v.dump());
  return v.get<std::string>();
}
std::vector<double> Config::get_doubles(const std::string& k) const {
  return get(k).get<std::vector<double>>();
}

json Config::tree() const {
  json root = json::object();
  // registry order, so config.yaml reads like the docs
  for (const auto& s : config_keys()) {
    json* node = &root;
    std::string rest = s.key;
    for (auto p = rest.find('.'); p != std::string::npos; p = rest.find('.')) {
      node = &(*node)[rest.substr(0, p)];
      rest = rest.substr(p + 1);
    }
    (*node)[rest] = values_.at(s.key);
  }
  return root;
}

std::string Config::to_yaml() const {
  // registry order, so config.yaml reads like the docs (json objects would sort their keys)
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  for (const auto& s : config_keys()) {
    nlohmann::ordered_json* node = &root;
    std::string rest = s.key;
    for (auto p = rest.find('.'); p != std::string::npos; p = rest.find('.')) {
      node = &(*node)[rest.substr(0, p)];
      rest = rest.substr(p + 1);
    }
    (*node)[rest] = values_.at(s.key);
  }
  std::ostringstream os;
  emit_yaml(os, root, 0);
  return os.str();
}

}  // namespace nxd::train_app
