#include "nxd/io/bounded_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <vector>

#include "nxd/runtime/error.h"

namespace nxd::io {

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

// "what 'path'", or "'path'" without a what.
std::string named(const std::string& what, const std::string& path) {
  return str(what, what.empty() ? "" : " ", "'", shorten(path, ReadLimits::max_shown_path), "'");
}

[[noreturn]] void not_regular(const std::string& path, const std::string& what,
                              const std::string& tag, mode_t m) {
  throw IoError(
      str("[", tag, "] ", named(what, path), " is ", file_kind(m), ", not a regular file"));
}

}  // namespace

std::string shorten(const std::string& s, size_t n) {
  std::string out = s.size() <= n ? s : s.substr(0, n - 3) + "...";
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  if (s.size() > n) out += str(" (", s.size(), " characters)");
  return out;
}

std::string one_line(const std::string& message) {
  return shorten(message, 4096);
}

void check_regular_file(const std::string& path, const std::string& what, const std::string& tag) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw IoError(str("[", tag, "] cannot read ", named(what, path), ": ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) not_regular(path, what, tag, st.st_mode);
}

int open_regular_file(const std::string& path, const std::string& what, const std::string& tag) {
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    throw IoError(str("[", tag, "] cannot read ", named(what, path), ": ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    not_regular(path, what, tag, st.st_mode);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what, int64_t max_bytes,
                              const std::string& tag) {
  const int fd = open_regular_file(path, what, tag);
  std::string text;
  std::vector<char> buf(1 << 16);
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw IoError(str("[", tag, "] error reading ", named(what, path), ": ", std::strerror(e)));
    }
    if (n == 0) break;
    text.append(buf.data(), static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > max_bytes) {
      ::close(fd);
      throw IoError(
          str("[", tag, "] ", named(what, path), " is larger than ", max_bytes, " bytes"));
    }
  }
  ::close(fd);
  return text;
}

namespace {

// The one scan of JSON or YAML text behind check_flow_depth and check_item_count: outside quoted
// strings and YAML comments, the nesting of `[`/`{` against max_depth, and the items (commas
// inside brackets; for YAML, each non-blank line outside them) against max_items.
void scan_text(const std::string& text, bool yaml, const std::string& source,
               const std::string& tag, int max_depth, int64_t max_items) {
  int depth = 0;
  char quote = 0;
  bool comment = false, line_counted = false;
  int64_t line = 1, items = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line, comment = false, line_counted = false;
      continue;
    }
    if (comment) continue;
    if (quote) {
      if (c == '\\' && quote == '"')
        ++i;
      else if (c == quote)
        quote = 0;
      continue;
    }
    if (yaml && c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\n')) {
      comment = true;
      continue;
    }
    bool item = false;
    if (yaml && depth == 0 && !line_counted && c != ' ' && c != '\t' && c != '\r')
      item = line_counted = true;  // a block entry, key or scalar line
    if (c == '"' || (yaml && c == '\'')) {
      quote = c;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw ConfigError(
            str("[", tag, "] ", source, ":", line, ": nested deeper than ", max_depth, " levels"));
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    } else if (c == ',' && depth > 0) {
      item = true;
    }
    if (item && ++items > max_items)
      throw ConfigError(str("[", tag, "] ", source, ":", line, ": more than ", max_items,
                            " list items, keys or lines (counted before parsing); a file of this "
                            "kind has far fewer"));
  }
}

}  // namespace

void check_flow_depth(const std::string& text, bool yaml, const std::string& source,
                      const std::string& tag, int max_depth) {
  scan_text(text, yaml, source, tag, max_depth, std::numeric_limits<int64_t>::max());
}

void check_item_count(const std::string& text, bool yaml, const std::string& source,
                      const std::string& tag, int64_t max_items) {
  scan_text(text, yaml, source, tag, std::numeric_limits<int>::max(), max_items);
}

void check_utf8(const std::string& s, const std::string& source, const std::string& tag) {
  int64_t line = 1;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') ++line;
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
    if (ok && n == 2) ok = c >= 0xc2;  // no overlong forms
    if (!ok)
      throw ConfigError(str("[", tag, "] ", shorten(source), ":", line, ": not UTF-8 text (byte 0x",
                            "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15], " at offset ",
                            i, ")"));
    i += static_cast<size_t>(n);
  }
}

json read_json_file(const std::string& path, const std::string& what, const std::string& tag,
                    int64_t max_bytes) {
  const std::string text = read_regular_file(path, what, max_bytes, tag);
  check_flow_depth(text, /*yaml=*/false, shorten(path, ReadLimits::max_shown_path), tag);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(
        str("[", tag, "] ", named(what, path), " is not JSON: ", shorten(e.what(), 200)));
  }
}

int64_t json_int(const json& j, const std::string& key, int64_t lo, int64_t hi,
                 const std::string& source, const std::string& tag) {
  if (!j.is_object() || !j.contains(key))
    throw ConfigError(str("[", tag, "] ", source, ": '", key, "' is missing"));
  const json& v = j[key];
  if (!v.is_number_integer())
    throw ConfigError(
        str("[", tag, "] ", source, ": '", key, "' is ", shorten(v.dump()), ", not an integer"));
  const bool neg = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
  if (!neg && v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw ConfigError(str("[", tag, "] ", source, ": '", key, "' = ", v.dump(), " is outside [", lo,
                          ", ", hi, "]"));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw ConfigError(
        str("[", tag, "] ", source, ": '", key, "' = ", x, " is outside [", lo, ", ", hi, "]"));
  return x;
}

int64_t parse_int(const std::string& s, int64_t lo, int64_t hi, const std::string& what,
                  const std::string& tag) {
  int64_t x = 0;
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, x);
  if (s.empty() || ec != std::errc() || p != end || x < lo || x > hi)
    throw ConfigError(str("[", tag, "] ", what, " must be an integer in [", lo, ", ", hi,
                          "], got '", shorten(s), "'"));
  return x;
}

}  // namespace nxd::io
