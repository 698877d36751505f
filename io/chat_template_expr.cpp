// Parsing a chat template's expressions (chat_template_expr.h): the tokenizer, then one function
// per precedence level as in jinja2's parser.
#include "nxd/io/chat_template_expr.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <memory>
#include <string_view>

#include "nxd/io/bounded_read.h"

namespace nxd::io::chat {
namespace {

constexpr std::array kFilters = {"trim",       "length", "count",  "upper",   "lower",
                                 "capitalize", "string", "tojson", "default", "d",
                                 "join",       "first",  "last",   "list",    "items"};
constexpr std::array kTests = {"defined",  "undefined", "none",    "string", "number", "mapping",
                               "sequence", "iterable",  "boolean", "even",   "odd"};
constexpr std::array kMethods = {"strip",      "lstrip",   "rstrip", "upper",   "lower",
                                 "startswith", "endswith", "split",  "replace", "items",
                                 "keys",       "values",   "get"};
constexpr std::array kFunctions = {"raise_exception", "namespace", "range"};

template <size_t N>
bool known(const std::array<const char*, N>& names, const std::string& s) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return s == n; });
}

}  // namespace

std::vector<Token> tokenize(const std::string& s, const std::string& origin, int line) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({TokKind::name, s.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      TokKind kind = TokKind::integer;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        kind = TokKind::floating;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      out.push_back({kind, s.substr(i, j - i)});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          v += s[j];
          continue;
        }
        const char e = s[++j];
        v += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
      }
      if (j >= s.size()) fail(origin, line, "unterminated string");
      out.push_back({TokKind::string, std::move(v)});
      i = j + 1;
    } else {
      static const std::array<const char*, 6> two = {"==", "!=", "<=", ">=", "//", "**"};
      std::string op(1, c);
      for (const char* t : two)
        if (s.compare(i, 2, t) == 0) op = t;
      if (op == "**") fail(origin, line, "unsupported operator '**'");
      if (std::string_view("()[]{}.,:|~+-*/%<>=!").find(c) == std::string_view::npos)
        fail(origin, line, str("unexpected character '", c, "'"));
      out.push_back({TokKind::op, op});
      i += op.size();
    }
  }
  out.push_back({TokKind::end, ""});
  return out;
}

ExprParser::DepthGuard::DepthGuard(ExprParser& p) : p_(p) {
  if (++p_.depth_ > kMaxDepth) fail(p_.origin_, p_.line_, "expression nested too deeply");
}

ExprPtr ExprParser::make(ExprKind k, std::string name, ExprPtr a, ExprPtr b) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->name = std::move(name);
  if (a) e->args.push_back(std::move(a));
  if (b) e->args.push_back(std::move(b));
  return e;
}

ExprPtr ExprParser::ternary() {
  DepthGuard g(*this);
  ExprPtr e = or_expr();
  while (at_name("if")) {
    ++p_;
    ExprPtr cond = or_expr();
    ExprPtr other;
    if (at_name("else")) {
      ++p_;
      other = ternary();
    }
    auto t = make(ExprKind::ternary, "", std::move(e), std::move(cond));
    t->args.push_back(std::move(other));
    e = std::move(t);
  }
  return e;
}

ExprPtr ExprParser::or_expr() {
  ExprPtr e = and_expr();
  while (at_name("or")) ++p_, e = make(ExprKind::binary, "or", std::move(e), and_expr());
  return e;
}

ExprPtr ExprParser::and_expr() {
  ExprPtr e = not_expr();
  while (at_name("and")) ++p_, e = make(ExprKind::binary, "and", std::move(e), not_expr());
  return e;
}

ExprPtr ExprParser::not_expr() {
  DepthGuard g(*this);
  if (at_name("not")) return ++p_, make(ExprKind::unary, "not", not_expr());
  return compare();
}

ExprPtr ExprParser::compare() {
  ExprPtr e = math1();
  for (;;) {
    std::string op;
    if (t_[p_].kind == TokKind::op &&
        (at_op("==") || at_op("!=") || at_op("<") || at_op("<=") || at_op(">") || at_op(">=")))
      op = t_[p_++].text;
    else if (at_name("in"))
      ++p_, op = "in";
    else if (at_name("not") && t_[p_ + 1].kind == TokKind::name && t_[p_ + 1].text == "in")
      p_ += 2, op = "not in";
    else
      return e;
    e = make(ExprKind::binary, op, std::move(e), math1());
  }
}

ExprPtr ExprParser::math1() {
  ExprPtr e = concat();
  while (at_op("+") || at_op("-")) {
    std::string op = t_[p_++].text;
    e = make(ExprKind::binary, op, std::move(e), concat());
  }
  return e;
}

ExprPtr ExprParser::concat() {
  ExprPtr e = math2();
  while (at_op("~")) ++p_, e = make(ExprKind::binary, "~", std::move(e), math2());
  return e;
}

ExprPtr ExprParser::math2() {
  ExprPtr e = unary();
  while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
    std::string op = t_[p_++].text;
    e = make(ExprKind::binary, op, std::move(e), unary());
  }
  return e;
}

ExprPtr ExprParser::unary() {
  DepthGuard g(*this);
  ExprPtr e;
  if (at_op("-")) {
    ++p_;
    e = make(ExprKind::unary, "-", unary());
  } else if (at_op("+")) {
    ++p_;
    e = unary();
  } else {
    e = postfix(primary());
  }
  return filters(std::move(e));
}

ExprPtr ExprParser::primary() {
  const Token tok = t_[p_];
  auto lit = [&](nlohmann::ordered_json v) {
    ++p_;
    auto e = make(ExprKind::literal, "");
    e->value = std::move(v);
    return e;
  };
  switch (tok.kind) {
    case TokKind::string: {
      std::string v = tok.text;
      ++p_;
      while (t_[p_].kind == TokKind::string) v += t_[p_++].text;  // adjacent literals join
      auto e = make(ExprKind::literal, "");
      e->value = v;
      return e;
    }
    case TokKind::integer:
      try {
        return lit(std::stoll(tok.text));
      } catch (const std::exception&) {
        fail(origin_, line_, str("integer out of range: ", shorten(tok.text)));
      }
    case TokKind::floating:
      return lit(std::stod(tok.text));
    case TokKind::name: {
      if (tok.text == "true" || tok.text == "True") return lit(true);
      if (tok.text == "false" || tok.text == "False") return lit(false);
      if (tok.text == "none" || tok.text == "None") return lit(nullptr);
      ++p_;
      if (at_op("(")) {
        if (!known(kFunctions, tok.text))
          fail(origin_, line_, str("unsupported function '", tok.text, "'"));
        auto call = make(ExprKind::call, tok.text);
        arguments(*call);
        return call;
      }
      return make(ExprKind::name, tok.text);
    }
    case TokKind::op:
      if (tok.text == "(") {
        ++p_;
        ExprPtr e = expression();
        if (at_op(",")) fail(origin_, line_, "unsupported tuple literal");
        expect_op(")");
        return e;
      }
      if (tok.text == "[") {
        ++p_;
        auto list = make(ExprKind::list, "");
        while (!at_op("]")) {
          list->args.push_back(expression());
          if (!at_op(",")) break;
          ++p_;
        }
        expect_op("]");
        return list;
      }
      if (tok.text == "{") fail(origin_, line_, "unsupported dict literal");
      break;
    case TokKind::end:
      break;
  }
  error("a value");
}

// (args..., name=value...) after a function, method or filter name
void ExprParser::arguments(Expr& e) {
  expect_op("(");
  while (!at_op(")")) {
    if (t_[p_].kind == TokKind::name && t_[p_ + 1].kind == TokKind::op && t_[p_ + 1].text == "=") {
      std::string k = t_[p_].text;
      p_ += 2;
      e.kwargs.emplace_back(std::move(k), expression());
    } else {
      if (!e.kwargs.empty()) error("a keyword argument");
      e.args.push_back(expression());
    }
    if (!at_op(",")) break;
    ++p_;
  }
  expect_op(")");
}

ExprPtr ExprParser::postfix(ExprPtr e) {
  for (;;) {
    if (at_op(".")) {
      ++p_;
      std::string n = take_name();
      if (at_op("(")) {
        if (!known(kMethods, n)) fail(origin_, line_, str("unsupported method '", n, "'"));
        auto call = make(ExprKind::call, n, std::move(e));
        call->is_method = true;
        arguments(*call);
        e = std::move(call);
      } else {
        e = make(ExprKind::attr, n, std::move(e));
      }
    } else if (at_op("[")) {
      ++p_;
      ExprPtr a, b;
      if (!at_op(":")) a = expression();
      if (at_op(":")) {
        ++p_;
        if (!at_op("]") && !at_op(":")) b = expression();
        if (at_op(":")) fail(origin_, line_, "unsupported slice step");
        expect_op("]");
        auto s = make(ExprKind::slice, "", std::move(e));
        s->args.push_back(std::move(a));
        s->args.push_back(std::move(b));
        e = std::move(s);
      } else {
        expect_op("]");
        e = make(ExprKind::index, "", std::move(e), std::move(a));
      }
    } else if (at_op("(")) {
      fail(origin_, line_, "unsupported call of a value");
    } else {
      return e;
    }
  }
}

ExprPtr ExprParser::filters(ExprPtr e) {
  for (;;) {
    if (at_op("|")) {
      ++p_;
      std::string n = take_name();
      if (!known(kFilters, n)) fail(origin_, line_, str("unsupported filter '", n, "'"));
      auto f = make(ExprKind::filter, n, std::move(e));
      if (at_op("(")) arguments(*f);
      e = std::move(f);
    } else if (at_name("is")) {
      ++p_;
      bool negate = false;
      if (at_name("not")) ++p_, negate = true;
      std::string n = take_name();
      if (!known(kTests, n)) fail(origin_, line_, str("unsupported test '", n, "'"));
      if (at_op("(")) fail(origin_, line_, str("unsupported arguments to test '", n, "'"));
      auto t = make(ExprKind::test, n, std::move(e));
      t->negate = negate;
      e = std::move(t);
    } else {
      return e;
    }
  }
}

}  // namespace nxd::io::chat
