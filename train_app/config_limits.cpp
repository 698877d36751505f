#include "nxd/train_app/config_limits.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "nxd/runtime/error.h"

namespace nxd::train_app {

using json = nlohmann::json;

void NodeBudget::enter(int depth) {
  if (depth > ConfigLimits::max_depth)
    throw ConfigError(
        str("[config] ", source, ": nested deeper than ", ConfigLimits::max_depth, " levels"));
  if (++nodes > ConfigLimits::max_nodes)
    throw ConfigError(
        str("[config] ", source, ": more than ", ConfigLimits::max_nodes,
            " values (counted after YAML aliases expand); a configuration has far fewer"));
}

namespace {
void collect_leaves(const json& node, const std::string& prefix, std::set<std::string>& seen,
                    const std::string& source) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string k = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object() && !it->empty()) {
      collect_leaves(*it, k, seen, source);
    } else if (!seen.insert(k).second) {
      throw ConfigError(str("[config] ", source, ": '", shorten(k),
                            "' is given twice (as a dotted key and in its section)"));
    }
  }
}
}  // namespace

void check_dotted_duplicates(const json& tree, const std::string& source) {
  std::set<std::string> seen;
  if (tree.is_object()) collect_leaves(tree, "", seen, source);
}

json parse_json_config(const std::string& text, const std::string& source) {
  io::check_utf8(text, source, "config");
  io::check_flow_depth(text, /*yaml=*/false, source, "config");
  io::check_item_count(text, /*yaml=*/false, source, "config", ConfigLimits::max_nodes);
  std::vector<std::set<std::string>> keys;  // the keys seen in each open object
  std::string duplicate;
  auto cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    (void)depth;
    switch (ev) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string k = parsed.get<std::string>();
        if (!keys.back().insert(k).second && duplicate.empty()) duplicate = k;
        break;
      }
      default:
        break;
    }
    return true;
  };
  json tree;
  try {
    tree = json::parse(text, cb);
  } catch (const json::exception& e) {  // syntax, or a number out of range
    throw ConfigError(str("[config] ", source, ": JSON syntax error: ", shorten(e.what(), 200)));
  }
  if (!duplicate.empty())
    throw ConfigError(str("[config] ", source, ": duplicate key '", shorten(duplicate),
                          "' (each key may appear once in a mapping)"));
  return tree;
}

}  // namespace nxd::train_app
