#pragma once
// The parsed form of a chat template (io/chat_template.h): statements and expressions. Internal
// to chat_template_parse.cpp (which builds it) and chat_template.cpp (which renders it).
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "nxd/io/chat_template.h"

namespace nxd::io::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  literal,  // value
  name,     // name
  attr,     // args[0].name
  index,    // args[0][args[1]]
  slice,    // args[0][args[1]:args[2]] (null args: open ends)
  call,     // name(args..., kwargs...) for a function; args[0].name(args[1:]...) for a method
  filter,   // args[0] | name(args[1:]..., kwargs...)
  test,     // args[0] is [not] name
  unary,    // name: "not", "-"
  binary,   // args[0] name args[1]: + - * / // % ~ == != < <= > >= in "not in" and or
  ternary,  // args[0] if args[1] else args[2] (args[2] null: undefined)
  list,     // [args...]
};

struct Expr {
  ExprKind kind = ExprKind::literal;
  nlohmann::ordered_json value;  // literal
  std::string name;
  bool negate = false;     // test: "is not"
  bool is_method = false;  // call: a method of args[0]
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node;
using Body = std::vector<Node>;

enum class NodeKind { text, output, if_chain, for_loop, set };

struct Node {
  NodeKind kind = NodeKind::text;
  std::string text;                                // text
  ExprPtr expr;                                    // output, for (iterable), set (value)
  std::vector<std::pair<ExprPtr, Body>> branches;  // if/elif conditions and bodies
  Body else_body;                                  // if chain's else
  std::vector<std::string> targets;                // for: loop names; set: name [, attr]
  Body body;                                       // for
  int line = 0;
};

}  // namespace nxd::io::chat

namespace nxd::io {
struct ChatTemplate::Program {
  chat::Body body;
};
// Parses the template text (chat_template_parse.cpp).
std::unique_ptr<const ChatTemplate::Program> parse_chat_template(const std::string& source,
                                                                 const std::string& origin);
}  // namespace nxd::io
