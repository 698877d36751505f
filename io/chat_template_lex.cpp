// Cutting a chat template into text and tags (io/chat_template_lex.h).
#include "nxd/io/chat_template_lex.h"

#include <algorithm>

#include "nxd/runtime/error.h"

namespace nxd::io::chat {

[[noreturn]] void fail(const std::string& origin, int line, const std::string& what) {
  throw ConfigError(str("[chat_template] ", origin, " line ", line, ": ", what));
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

namespace {
// The text and tags of the source, before any whitespace rule.
std::vector<Segment> cut(const std::string& s, const std::string& origin) {
  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  auto count_lines = [&](size_t from, size_t to) {
    line += static_cast<int>(std::count(s.begin() + from, s.begin() + to, '\n'));
  };
  while (pos < s.size()) {
    size_t open = s.find('{', pos);
    while (open != std::string::npos && open + 1 < s.size() && s[open + 1] != '{' &&
           s[open + 1] != '%' && s[open + 1] != '#')
      open = s.find('{', open + 1);
    if (open == std::string::npos || open + 1 >= s.size()) {
      out.push_back({SegKind::text, s.substr(pos), line});
      break;
    }
    if (open > pos) out.push_back({SegKind::text, s.substr(pos, open - pos), line});
    count_lines(pos, open);
    const char c = s[open + 1];
    const std::string close = c == '{' ? "}}" : c == '%' ? "%}" : "#}";
    const size_t end = s.find(close, open + 2);
    if (end == std::string::npos) fail(origin, line, str("unclosed '{", c, "'"));
    Segment seg{c == '{'   ? SegKind::output
                : c == '%' ? SegKind::statement
                           : SegKind::comment,
                "", line};
    size_t b = open + 2, e = end;
    if (b < e && s[b] == '-')
      seg.strip_before = true, ++b;
    else if (b < e && s[b] == '+')
      seg.keep_before = true, ++b;
    if (e > b && s[e - 1] == '-')
      seg.strip_after = true, --e;
    else if (e > b && s[e - 1] == '+')
      seg.keep_after = true, --e;
    seg.content = s.substr(b, e - b);
    out.push_back(std::move(seg));
    count_lines(open, end + 2);
    pos = end + 2;
  }
  return out;
}

// jinja2's whitespace rules: `-` strips all whitespace on that side; trim_blocks drops the first
// newline after a statement or comment; lstrip_blocks drops spaces and tabs before a statement or
// comment that starts its line.
void apply_whitespace(std::vector<Segment>& segs) {
  // jinja2 strips before a tag only when its line starts in this text segment: the text has a
  // newline, or is the template's start, or trim_blocks took the newline before it
  std::vector<bool> line_starting(segs.size(), false);
  for (size_t i = 0; i < segs.size(); ++i) {
    if (segs[i].kind != SegKind::text) continue;
    const bool after_block =
        i > 0 && (segs[i - 1].kind == SegKind::statement || segs[i - 1].kind == SegKind::comment) &&
        !segs[i - 1].keep_after && !segs[i - 1].strip_after;
    line_starting[i] = i == 0 || (after_block && !segs[i].content.empty() &&
                                  (segs[i].content[0] == '\n' || segs[i].content[0] == '\r'));
  }
  for (size_t i = 0; i < segs.size(); ++i) {
    if (segs[i].kind != SegKind::text) continue;
    std::string& t = segs[i].content;
    const bool block_like_before =
        i > 0 && (segs[i - 1].kind == SegKind::statement || segs[i - 1].kind == SegKind::comment);
    if (i > 0 && segs[i - 1].strip_after) {
      size_t k = 0;
      while (k < t.size() && is_space(t[k])) ++k;
      t.erase(0, k);
    } else if (block_like_before && !segs[i - 1].keep_after) {
      if (t.rfind("\r\n", 0) == 0)
        t.erase(0, 2);
      else if (!t.empty() && t[0] == '\n')
        t.erase(0, 1);
    }
    if (i + 1 < segs.size()) {
      const Segment& next = segs[i + 1];
      if (next.strip_before) {
        while (!t.empty() && is_space(t.back())) t.pop_back();
      } else if ((next.kind == SegKind::statement || next.kind == SegKind::comment) &&
                 !next.keep_before) {
        const size_t nl = t.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting[i]) {
          const bool only_ws = l_pos < t.size() &&
                               std::all_of(t.begin() + static_cast<std::ptrdiff_t>(l_pos), t.end(),
                                           [](char c) { return c == ' ' || c == '\t'; });
          if (only_ws) t.erase(l_pos);
        }
      }
    }
  }
}

}  // namespace

std::vector<Segment> cut_template(const std::string& source, const std::string& origin) {
  std::vector<Segment> segs = cut(source, origin);
  apply_whitespace(segs);
  return segs;
}

}  // namespace nxd::io::chat
