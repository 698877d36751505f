#pragma once
// Limits of the configuration reader (docs/design/run_safety.md, "Hostile input"): what a --config
// file may be, how deep and how large a parsed configuration may grow, and how much of a value a
// message shows. Each refusal is a ConfigError or IoError naming the file (or key).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "nxd/io/bounded_read.h"

namespace nxd::train_app {

// The file, depth and message limits are the I/O floor's, shared by every reader
// (io/bounded_read.h: regular files only, sizes, nesting, values shortened in messages).
struct ConfigLimits {
  static constexpr int64_t max_file_bytes = 16 << 20;  // a --config file
  static constexpr int max_depth = io::ReadLimits::max_depth;
  static constexpr int64_t max_nodes = 100000;  // values after YAML aliases expand
  static constexpr size_t max_shown = io::ReadLimits::max_shown;
};

using io::shorten;

// JSON text as a tree, refusing duplicate keys in a mapping and nesting beyond max_depth.
nlohmann::json parse_json_config(const std::string& text, const std::string& source);

// ConfigError when one key is given twice in one file through different spellings
// (`model.hidden_size: 4` and `model: {hidden_size: 5}`).
void check_dotted_duplicates(const nlohmann::json& tree, const std::string& source);

// Counts the values a conversion makes (YAML aliases expand: a small file can name billions).
struct NodeBudget {
  std::string source;
  int64_t nodes = 0;
  void enter(int depth);  // ConfigError beyond max_depth or max_nodes
};

}  // namespace nxd::train_app
