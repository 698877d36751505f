#include "nxd/train/config_limits.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "nxd/runtime/error.h"

namespace nxd::trainer {

using json = nlohmann::json;

namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

void check_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw IoError(
        str("[config] cannot read ", what, " '", shorten(path), "': ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    throw IoError(str("[config] ", what, " '", shorten(path), "' is ", file_kind(st.st_mode),
                      ", not a regular file"));
}

std::string read_regular_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  check_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str("[config] cannot read ", what, " '", shorten(path), "'"));
  std::string text;
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    text.append(buf.data(), static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(text.size()) > max_bytes)
      throw IoError(
          str("[config] ", what, " '", shorten(path), "' is larger than ", max_bytes, " bytes"));
  }
  if (in.bad()) throw IoError(str("[config] error reading ", what, " '", shorten(path), "'"));
  return text;
}

std::string shorten(const std::string& s, size_t n) {
  std::string out = s.size() <= n ? s : s.substr(0, n - 3) + "...";
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  if (s.size() > n) out += str(" (", s.size(), " characters)");
  return out;
}

void check_flow_depth(const std::string& text, bool yaml, const std::string& source) {
  int depth = 0;
  char quote = 0;
  bool comment = false;
  int64_t line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') ++line, comment = false;
    if (comment) continue;
    if (quote) {
      if (c == '\\' && quote == '"')
        ++i;
      else if (c == quote)
        quote = 0;
      continue;
    }
    if (c == '"' || (yaml && c == '\''))
      quote = c;
    else if (yaml && c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\n'))
      comment = true;
    else if (c == '[' || c == '{') {
      if (++depth > ConfigLimits::max_depth)
        throw ConfigError(str("[config] ", source, ":", line, ": nested deeper than ",
                              ConfigLimits::max_depth, " levels"));
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

void check_utf8(const std::string& s, const std::string& source) {
  int64_t line = 1;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') ++line;
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (ok && n == 2) ok = c >= 0xc2;  // no overlong forms
    if (!ok)
      throw ConfigError(str("[config] ", shorten(source), ":", line, ": not UTF-8 text (byte 0x",
                            "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15], " at offset ",
                            i, ")"));
    i += static_cast<size_t>(n);
  }
}

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
  check_utf8(text, source);
  check_flow_depth(text, /*yaml=*/false, source);
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

}  // namespace nxd::trainer
