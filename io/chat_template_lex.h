#pragma once
// A chat template's text cut into text and tags, with jinja2's whitespace rules as transformers
// sets them (trim_blocks, lstrip_blocks, the `-` and `+` modifiers). Internal to
// chat_template_lex.cpp, chat_template_parse.cpp and chat_template_expr.cpp.
#include <string>
#include <vector>

namespace nxd::io::chat {

enum class SegKind { text, output, statement, comment };
struct Segment {
  SegKind kind;
  std::string content;
  int line;
  bool strip_before = false, strip_after = false, keep_before = false, keep_after = false;
};

// ConfigError "[chat_template] <origin> line <line>: <what>".
[[noreturn]] void fail(const std::string& origin, int line, const std::string& what);
bool is_space(char c);
// The segments of `source` in order, whitespace rules applied (empty texts may remain).
std::vector<Segment> cut_template(const std::string& source, const std::string& origin);

}  // namespace nxd::io::chat
