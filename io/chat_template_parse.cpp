// Parsing a chat template (io/chat_template.h): the text is cut into text and tags with jinja2's
// whitespace rules as transformers sets them (trim_blocks, lstrip_blocks, `-` modifiers:
// chat_template_lex.cpp), each tag's expression is parsed (chat_template_expr.cpp), and the
// statements (if, for, set) nest into the program's body here.
#include <algorithm>
#include <memory>

#include "nxd/io/chat_template_ast.h"
#include "nxd/io/chat_template_expr.h"
#include "nxd/io/chat_template_lex.h"
#include "nxd/runtime/error.h"

namespace nxd::io {
namespace {
using chat::Body;
using chat::ExprParser;
using chat::ExprPtr;
using chat::fail;
using chat::kMaxDepth;
using chat::Node;
using chat::NodeKind;
using chat::SegKind;
using chat::Segment;
using chat::tokenize;

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
