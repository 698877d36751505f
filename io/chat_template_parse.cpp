// Parsing a chat template (io/chat_template.h): the text is cut into text and tags with jinja2's
// whitespace rules as transformers sets them (trim_blocks, lstrip_blocks, `-` modifiers), each
// tag's expression is tokenized and parsed by precedence as jinja2's parser does, and every
// filter, test, method and function name is checked against the supported list.
#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

#include "nxd/io/bounded_read.h"
#include "nxd/io/chat_template_ast.h"
#include "nxd/io/chat_template_lex.h"
#include "nxd/runtime/error.h"

namespace nxd::io {
namespace {
using chat::Body;
using chat::Expr;
using chat::ExprKind;
using chat::ExprPtr;
using chat::fail;
using chat::is_space;
using chat::Node;
using chat::NodeKind;
using chat::SegKind;
using chat::Segment;

constexpr std::array kFilters = {"trim",       "length", "count",  "upper",   "lower",
                                 "capitalize", "string", "tojson", "default", "d",
                                 "join",       "first",  "last",   "list",    "items"};
constexpr std::array kTests = {"defined",  "undefined", "none",    "string", "number", "mapping",
                               "sequence", "iterable",  "boolean", "even",   "odd"};
constexpr std::array kMethods = {"strip",      "lstrip",   "rstrip", "upper",   "lower",
                                 "startswith", "endswith", "split",  "replace", "items",
                                 "keys",       "values",   "get"};
constexpr std::array kFunctions = {"raise_exception", "namespace", "range"};
constexpr int kMaxDepth = 64;  // nested expressions and blocks

template <size_t N>
bool known(const std::array<const char*, N>& names, const std::string& s) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return s == n; });
}

// --- expressions -------------------------------------------------------------------------------

enum class TokKind { name, integer, floating, string, op, end };
struct Token {
  TokKind kind;
  std::string text;
};

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
    explicit DepthGuard(ExprParser& p) : p_(p) {
      if (++p_.depth_ > kMaxDepth) fail(p_.origin_, p_.line_, "expression nested too deeply");
    }
    ~DepthGuard() { --p_.depth_; }
    ExprParser& p_;
  };
  static ExprPtr make(ExprKind k, std::string name, ExprPtr a = nullptr, ExprPtr b = nullptr) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->name = std::move(name);
    if (a) e->args.push_back(std::move(a));
    if (b) e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr ternary() {
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
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (at_name("or")) ++p_, e = make(ExprKind::binary, "or", std::move(e), and_expr());
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (at_name("and")) ++p_, e = make(ExprKind::binary, "and", std::move(e), not_expr());
    return e;
  }
  ExprPtr not_expr() {
    DepthGuard g(*this);
    if (at_name("not")) return ++p_, make(ExprKind::unary, "not", not_expr());
    return compare();
  }
  ExprPtr compare() {
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
  ExprPtr math1() {
    ExprPtr e = concat();
    while (at_op("+") || at_op("-")) {
      std::string op = t_[p_++].text;
      e = make(ExprKind::binary, op, std::move(e), concat());
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (at_op("~")) ++p_, e = make(ExprKind::binary, "~", std::move(e), math2());
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = unary();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      std::string op = t_[p_++].text;
      e = make(ExprKind::binary, op, std::move(e), unary());
    }
    return e;
  }
  ExprPtr unary() {
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
  ExprPtr primary() {
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
  void arguments(Expr& e) {
    expect_op("(");
    while (!at_op(")")) {
      if (t_[p_].kind == TokKind::name && t_[p_ + 1].kind == TokKind::op &&
          t_[p_ + 1].text == "=") {
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
  ExprPtr postfix(ExprPtr e) {
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
  ExprPtr filters(ExprPtr e) {
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

  std::vector<Token> t_;
  size_t p_ = 0;
  const std::string& origin_;
  int line_;
  int depth_ = 0;
};

// --- statements --------------------------------------------------------------------------------

class StatementParser {
 public:
  StatementParser(std::vector<Segment> segs, const std::string& origin)
      : segs_(std::move(segs)), origin_(origin) {}

  Body parse_top() {
    std::string end;
    Body b = body({}, end);
    return b;
  }

 private:
  // Nodes until a statement whose first word is in `stops` (returned in `stop`, its parser left
  // in `rest_`), or the end of the template (stop = "").
  Body body(const std::vector<std::string>& stops, std::string& stop) {
    if (++depth_ > kMaxDepth) fail(origin_, line_, "blocks nested too deeply");
    Body out;
    stop.clear();
    while (i_ < segs_.size()) {
      Segment& s = segs_[i_++];
      line_ = s.line;
      if (s.kind == SegKind::comment) continue;
      if (s.kind == SegKind::text) {
        if (s.content.empty()) continue;
        Node n;
        n.kind = NodeKind::text;
        n.text = std::move(s.content);
        out.push_back(std::move(n));
        continue;
      }
      ExprParser p(tokenize(s.content, origin_, s.line), origin_, s.line);
      if (s.kind == SegKind::output) {
        Node n;
        n.kind = NodeKind::output;
        n.line = s.line;
        n.expr = p.parse_all();
        out.push_back(std::move(n));
        continue;
      }
      if (p.at_end()) fail(origin_, s.line, "empty statement tag");
      const std::string word = p.take_name();
      if (std::find(stops.begin(), stops.end(), word) != stops.end()) {
        stop = word;
        rest_ = std::make_unique<ExprParser>(std::move(p));
        --depth_;
        return out;
      }
      if (word == "if")
        out.push_back(if_chain(p));
      else if (word == "for")
        out.push_back(for_loop(p));
      else if (word == "set")
        out.push_back(set(p));
      else if (word == "elif" || word == "else" || word == "endif" || word == "endfor")
        fail(origin_, s.line, str("'", word, "' without its opening tag"));
      else
        fail(origin_, s.line, str("unsupported tag '", word, "'"));
    }
    if (!stops.empty()) fail(origin_, line_, str("missing '{% ", stops.back(), " %}'"));
    --depth_;
    return out;
  }

  Node if_chain(ExprParser& p) {
    Node n;
    n.kind = NodeKind::if_chain;
    n.line = line_;
    ExprPtr cond = p.parse_all();
    for (;;) {
      std::string stop;
      Body b = body({"elif", "else", "endif"}, stop);
      n.branches.emplace_back(std::move(cond), std::move(b));
      if (stop == "elif") {
        cond = rest_->parse_all();
        continue;
      }
      if (stop == "else") {
        rest_->expect_end();
        n.else_body = body({"endif"}, stop);
      }
      rest_->expect_end();
      return n;
    }
  }

  Node for_loop(ExprParser& p) {
    Node n;
    n.kind = NodeKind::for_loop;
    n.line = line_;
    n.targets.push_back(p.take_name());
    while (p.at_op(",")) {
      p.expect_op(",");
      n.targets.push_back(p.take_name());
    }
    p.expect_name("in");
    n.expr = p.expression_without_if();
    if (p.at_name("if")) fail(origin_, line_, "unsupported loop filter 'for ... if'");
    if (p.at_name("recursive")) fail(origin_, line_, "unsupported 'recursive' loop");
    p.expect_end();
    std::string stop;
    n.body = body({"else", "endfor"}, stop);
    if (stop == "else") fail(origin_, line_, "unsupported 'for ... else'");
    rest_->expect_end();
    return n;
  }

  Node set(ExprParser& p) {
    Node n;
    n.kind = NodeKind::set;
    n.line = line_;
    n.targets.push_back(p.take_name());
    if (p.at_op(".")) {
      p.expect_op(".");
      n.targets.push_back(p.take_name());
    }
    if (p.at_op(",")) fail(origin_, line_, "unsupported 'set' of several names");
    if (p.at_end()) fail(origin_, line_, "unsupported block 'set' (without '=')");
    p.expect_op("=");
    n.expr = p.parse_all();
    return n;
  }

  std::vector<Segment> segs_;
  const std::string& origin_;
  size_t i_ = 0;
  int line_ = 1;
  int depth_ = 0;
  std::unique_ptr<ExprParser> rest_;  // the stopping tag's parser, after its first word
};

}  // namespace

std::unique_ptr<const ChatTemplate::Program> parse_chat_template(const std::string& source,
                                                                 const std::string& origin) {
  std::vector<Segment> segs = chat::cut_template(source, origin);
  auto prog = std::make_unique<ChatTemplate::Program>();
  prog->body = StatementParser(std::move(segs), origin).parse_top();
  return prog;
}

}  // namespace nxd::io
