#pragma once
// Limits of the configuration reader (docs/DESIGN.md, "Hostile input"): what a --config file or
// a data file may be, how deep and how large a parsed configuration may grow, and how much of a
// value a message shows. Each refusal is a ConfigError or IoError naming the file (or key).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace nxd::trainer {

struct ConfigLimits {
  static constexpr int64_t max_file_bytes = 16 << 20;  // a --config file
  static constexpr int max_depth = 64;                 // nested mappings and lists
  static constexpr int64_t max_nodes = 100000;         // values after YAML aliases expand
  static constexpr size_t max_shown = 80;              // characters of a value in a message
};

// The whole of a regular file (not a directory, FIFO or device: refused before opening, so a
// FIFO cannot block), at most max_bytes; IoError naming `what` and the path otherwise.
std::string read_regular_file(const std::string& path, const std::string& what, int64_t max_bytes);
// IoError unless path is a regular file (what: "data.path" etc.).
void check_regular_file(const std::string& path, const std::string& what);

// s cut to at most n characters ("..." and the full length when cut), on one line.
std::string shorten(const std::string& s, size_t n = ConfigLimits::max_shown);

// The nesting of `[`/`{` in JSON or YAML flow text (outside quoted strings and YAML comments):
// ConfigError naming source when deeper than max_depth. Cheap; run before parsing.
void check_flow_depth(const std::string& text, bool yaml, const std::string& source);

// ConfigError naming source and the line unless s is valid UTF-8 (the configuration is written
// back as YAML and shown in messages).
void check_utf8(const std::string& s, const std::string& source);

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

}  // namespace nxd::trainer
