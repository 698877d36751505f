#pragma once
// A chat template's expressions: a tag's text tokenized and parsed by precedence as jinja2's
// parser does, with every filter, test, method and function name checked against the supported
// list. Internal to chat_template_expr.cpp and chat_template_parse.cpp (the statements).
#include <cstddef>
#include <string>
#include <vector>

#include "nxd/io/chat_template_ast.h"
#include "nxd/io/chat_template_lex.h"
#include "nxd/runtime/error.h"

namespace nxd::io::chat {

constexpr int kMaxDepth = 64;  // nested expressions and blocks

enum class TokKind { name, integer, floating, string, op, end };
struct Token {
  TokKind kind;
  std::string text;
};

// The tokens of a tag's text (origin and line name it in errors), ending with one of kind end.
std::vector<Token> tokenize(const std::string& s, const std::string& origin, int line);

// A recursive-descent parser over one tag's tokens: parse_all for a whole expression; the
// statement parser reads a statement's words with take_name, at_op, expect_op, ...
class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, const std::string& origin, int line)
      : t_(std::move(toks)), origin_(origin), line_(line) {}

  ExprPtr parse_all() {
    ExprPtr e = expression();
    expect_end();
    return e;
  }
  ExprPtr expression() { return ternary(); }
  ExprPtr expression_without_if() { return or_expr(); }  // a loop's iterable (jinja2's too)
  bool at_op(const char* op) const { return t_[p_].kind == TokKind::op && t_[p_].text == op; }
  bool at_name(const char* n) const { return t_[p_].kind == TokKind::name && t_[p_].text == n; }
  bool at_end() const { return t_[p_].kind == TokKind::end; }
  std::string take_name() {
    if (t_[p_].kind != TokKind::name) error("a name");
    return t_[p_++].text;
  }
  void expect_op(const char* op) {
    if (!at_op(op)) error(str("'", op, "'"));
    ++p_;
  }
  void expect_name(const char* n) {
    if (!at_name(n)) error(str("'", n, "'"));
    ++p_;
  }
  void expect_end() {
    if (!at_end()) error("the end of the tag");
  }
  [[noreturn]] void error(const std::string& wanted) const {
    const Token& tok = t_[p_];
    fail(origin_, line_,
         str("expected ", wanted, ", found ",
             tok.kind == TokKind::end ? "the end" : "'" + tok.text + "'"));
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(ExprParser& p);
    ~DepthGuard() { --p_.depth_; }
    ExprParser& p_;
  };
  static ExprPtr make(ExprKind k, std::string name, ExprPtr a = nullptr, ExprPtr b = nullptr);
  ExprPtr ternary();
  ExprPtr or_expr();
  ExprPtr and_expr();
  ExprPtr not_expr();
  ExprPtr compare();
  ExprPtr math1();
  ExprPtr concat();
  ExprPtr math2();
  ExprPtr unary();
  ExprPtr primary();
  void arguments(Expr& e);
  ExprPtr postfix(ExprPtr e);
  ExprPtr filters(ExprPtr e);

  std::vector<Token> t_;
  size_t p_ = 0;
  const std::string& origin_;
  int line_;
  int depth_ = 0;
};

}  // namespace nxd::io::chat
