#pragma once
// One reading discipline for every file and value nxd takes from outside (a training config, a
// transformers folder's config.json, a tokenizer.json, a trace, a checkpoint's side files; docs/
// docs/design/run_safety.md, "Hostile input"): regular files only (a directory, FIFO or device is
// refused before anything blocks on it), a size limit checked while reading, the nesting of
// JSON/YAML text checked before parsing (a parser recurses once per level), integers range-checked
// before they size anything, and values cut short in messages. Each refusal names the file (or key)
// and is a user error (IoError, ConfigError): tools exit with code 2. `tag` is the message's
// "[tag]".
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace nxd::io {

struct ReadLimits {
  static constexpr size_t max_shown = 80;              // characters of a value in a message
  static constexpr size_t max_shown_path = 1024;       // ... of a path (its end names the file)
  static constexpr int max_depth = 64;                 // nested mappings and lists
  static constexpr int64_t max_json_bytes = 64 << 20;  // config.json, tokenizer.json, manifests
};

// s cut to at most n characters ("..." and the full length when cut), on one line.
std::string shorten(const std::string& s, size_t n = ReadLimits::max_shown);
// An error message as the tools print it: one line, at most 4,096 characters (a value from
// outside echoed whole can be 150 KB; the message keeps its start and says how long it was).
std::string one_line(const std::string& message);

// A file descriptor open for reading on `path`, which must be a regular file: opened without
// blocking (a FIFO cannot hang it) and checked with fstat. IoError naming `what` and the path.
int open_regular_file(const std::string& path, const std::string& what, const std::string& tag);
// IoError unless path is a regular file (what: "data.path" etc.).
void check_regular_file(const std::string& path, const std::string& what, const std::string& tag);
// The whole of a regular file, at most max_bytes (IoError naming `what` and the path otherwise).
std::string read_regular_file(const std::string& path, const std::string& what, int64_t max_bytes,
                              const std::string& tag);

// The nesting of `[`/`{` in JSON or YAML flow text (outside quoted strings and YAML comments):
// ConfigError naming source and the line when deeper than max_depth. Cheap; run before parsing.
void check_flow_depth(const std::string& text, bool yaml, const std::string& source,
                      const std::string& tag, int max_depth = ReadLimits::max_depth);
// How many values JSON or YAML text can make, counted before parsing (a parser builds every node
// first: yaml-cpp holds a 16 MB flow list `[1,1,...]` as 8 million nodes, 3.8 GiB): the commas
// inside `[`/`{` plus, for YAML, the non-blank, non-comment lines outside them (each block entry
// or key is on a line of its own; a block scalar's lines are counted too, which only overcounts).
// ConfigError naming source, the line and max_items beyond it.
void check_item_count(const std::string& text, bool yaml, const std::string& source,
                      const std::string& tag, int64_t max_items);
// ConfigError naming source and the line unless s is valid UTF-8.
void check_utf8(const std::string& s, const std::string& source, const std::string& tag);

// A JSON file from outside: regular, at most max_bytes, nested at most max_depth, parsed.
// IoError for the file, ConfigError naming the file for its text.
nlohmann::json read_json_file(const std::string& path, const std::string& what,
                              const std::string& tag,
                              int64_t max_bytes = ReadLimits::max_json_bytes);

// j[key] as an integer in [lo, hi]: ConfigError naming source, key and the value (shortened) for
// a missing key, a non-integer (64.5, "8") or a value out of range.
int64_t json_int(const nlohmann::json& j, const std::string& key, int64_t lo, int64_t hi,
                 const std::string& source, const std::string& tag);

// A command-line or environment value as an integer in [lo, hi]: the whole string, decimal
// (ConfigError naming `what` and the value, shortened, otherwise: "1e6", "16abc", "").
int64_t parse_int(const std::string& s, int64_t lo, int64_t hi, const std::string& what,
                  const std::string& tag);

}  // namespace nxd::io
