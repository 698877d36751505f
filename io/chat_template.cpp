// Rendering a chat template (io/chat_template.h) with Python's semantics for the values it
// touches: str() of values, truthiness, `and`/`or` returning an operand, negative indices and
// slices, transformers' tojson (json.dumps with ensure_ascii=False).
#include "nxd/io/chat_template.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "nxd/io/bounded_read.h"
#include "nxd/io/chat_template_ast.h"
#include "nxd/io/chat_template_values.h"
#include "nxd/runtime/error.h"

namespace nxd::io {
namespace {
using chat::Body;
using chat::Expr;
using chat::ExprKind;
using chat::Node;
using chat::NodeKind;
using json = nlohmann::ordered_json;

using namespace chat;  // Value and the built-ins (chat_template_values.h)

constexpr size_t kMaxOutput = size_t{256} << 20;  // bytes of one render

class Renderer {
 public:
  Renderer(const json& globals) {
    scopes_.emplace_back();
    for (auto it = globals.begin(); it != globals.end(); ++it)
      scopes_.back()[it.key()] = Value::of(it.value());
  }

  void render(const Body& body) {
    for (const Node& n : body) node(n);
  }
  std::string take() { return std::move(out_); }

 private:
  void step() {
    if (++steps_ > kMaxSteps) fail(str("more than ", kMaxSteps, " steps"));
  }
  void emit(const std::string& s) {
    out_ += s;
    if (out_.size() > kMaxOutput) fail(str("output over ", kMaxOutput, " bytes"));
  }

  void node(const Node& n) {
    step();
    line_ = n.line;
    switch (n.kind) {
      case NodeKind::text:
        emit(n.text);
        break;
      case NodeKind::output:
        emit(to_str(eval(*n.expr)));
        break;
      case NodeKind::if_chain: {
        for (const auto& [cond, body] : n.branches)
          if (truthy(eval(*cond))) return render(body);
        render(n.else_body);
        break;
      }
      case NodeKind::for_loop:
        for_loop(n);
        break;
      case NodeKind::set: {
        Value v = eval(*n.expr);
        if (n.targets.size() == 1) {
          scopes_.back()[n.targets[0]] = std::move(v);
          break;
        }
        Value ns = lookup(n.targets[0]);
        if (ns.kind != Value::Kind::ns)
          fail(str("'set ", n.targets[0], ".", n.targets[1], "' needs a namespace()"));
        (*ns.ns)[n.targets[1]] = v.kind == Value::Kind::json ? v.j : json(to_str(v));
        break;
      }
    }
  }

  void for_loop(const Node& n) {
    const Value seq = eval(*n.expr);
    std::vector<json> items;
    if (!seq.defined()) {
      // jinja2's Undefined iterates as empty
    } else if (seq.kind == Value::Kind::ns || seq.j.is_null() || seq.j.is_number() ||
               seq.j.is_boolean()) {
      fail(str("line ", n.line, ": cannot loop over ", shorten(to_str(seq))));
    } else if (seq.j.is_string()) {
      for (auto& c : code_points(seq.j.get<std::string>())) items.emplace_back(c);
    } else if (seq.j.is_object()) {
      for (auto it = seq.j.begin(); it != seq.j.end(); ++it) items.emplace_back(it.key());
    } else {
      items.assign(seq.j.begin(), seq.j.end());
    }
    scopes_.emplace_back();
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      auto& scope = scopes_.back();
      scope["loop"] = Value::of({{"index", i + 1},
                                 {"index0", i},
                                 {"revindex", len - i},
                                 {"revindex0", len - i - 1},
                                 {"first", i == 0},
                                 {"last", i == len - 1},
                                 {"length", len}});
      if (n.targets.size() == 1) {
        scope[n.targets[0]] = Value::of(items[i]);
      } else {
        if (!items[i].is_array() || items[i].size() != n.targets.size())
          fail(str("line ", n.line, ": cannot unpack ", shorten(repr(items[i])), " into ",
                   n.targets.size(), " names"));
        for (size_t k = 0; k < n.targets.size(); ++k) scope[n.targets[k]] = Value::of(items[i][k]);
      }
      render(n.body);
    }
    scopes_.pop_back();
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return {};
  }

  Value member(const Value& obj, const Value& key, const std::string& shown) {
    if (!obj.defined()) fail(str("line ", line_, ": ", shown, " of an undefined value"));
    if (obj.kind == Value::Kind::ns) {
      if (key.kind == Value::Kind::json && key.j.is_string() && obj.ns->contains(key.j))
        return Value::of((*obj.ns)[key.j.get<std::string>()]);
      return {};
    }
    const json& j = obj.j;
    if (j.is_object() && key.kind == Value::Kind::json && key.j.is_string()) {
      auto it = j.find(key.j.get<std::string>());
      return it == j.end() ? Value{} : Value::of(*it);
    }
    if ((j.is_array() || j.is_string()) && key.kind == Value::Kind::json &&
        key.j.is_number_integer()) {
      if (j.is_array()) {
        const int64_t i = py_index(key.j.get<int64_t>(), static_cast<int64_t>(j.size()));
        return i < 0 ? Value{} : Value::of(j[static_cast<size_t>(i)]);
      }
      auto cps = code_points(j.get<std::string>());
      const int64_t i = py_index(key.j.get<int64_t>(), static_cast<int64_t>(cps.size()));
      return i < 0 ? Value{} : Value::of(cps[static_cast<size_t>(i)]);
    }
    if (j.is_null()) fail(str("line ", line_, ": ", shown, " of None"));
    return {};
  }

  Value slice(const Value& obj, const Expr* a, const Expr* b) {
    if (obj.kind != Value::Kind::json || !(obj.j.is_array() || obj.j.is_string()))
      fail(str("line ", line_, ": cannot slice ", shorten(to_str(obj))));
    std::vector<json> items;
    if (obj.j.is_array())
      items.assign(obj.j.begin(), obj.j.end());
    else
      for (auto& c : code_points(obj.j.get<std::string>())) items.emplace_back(c);
    const auto n = static_cast<int64_t>(items.size());
    auto bound = [&](const Expr* e, int64_t dflt) {
      if (!e) return dflt;
      const Value v = eval(*e);
      if (v.kind == Value::Kind::json && v.j.is_null()) return dflt;
      int64_t i = as_int(v, "a slice");
      if (i < 0) i += n;
      return std::clamp<int64_t>(i, 0, n);
    };
    const int64_t lo = bound(a, 0), hi = bound(b, n);
    if (obj.j.is_array()) {
      json out = json::array();
      for (int64_t i = lo; i < hi; ++i) out.push_back(items[static_cast<size_t>(i)]);
      return Value::of(std::move(out));
    }
    std::string out;
    for (int64_t i = lo; i < hi; ++i) out += items[static_cast<size_t>(i)].get<std::string>();
    return Value::of(out);
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case ExprKind::literal:
        return Value::of(e.value);
      case ExprKind::name:
        return lookup(e.name);
      case ExprKind::attr:
        return member(eval(*e.args[0]), Value::of(e.name), "attribute '" + e.name + "'");
      case ExprKind::index:
        return member(eval(*e.args[0]), eval(*e.args[1]), "an item");
      case ExprKind::slice:
        return slice(eval(*e.args[0]), e.args[1].get(), e.args[2].get());
      case ExprKind::list: {
        json out = json::array();
        for (const auto& a : e.args) {
          Value v = eval(*a);
          out.push_back(v.kind == Value::Kind::json ? v.j : json(to_str(v)));
        }
        return Value::of(std::move(out));
      }
      case ExprKind::ternary:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value{};
      case ExprKind::unary: {
        Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::of(!truthy(v));
        if (v.kind == Value::Kind::json && v.j.is_number_float())
          return Value::of(-v.j.get<double>());
        return Value::of(-as_int(v, "unary '-'"));
      }
      case ExprKind::binary:
        return binary(e);
      case ExprKind::test:
        return Value::of(apply_test(e.name, eval(*e.args[0])) != e.negate);
      case ExprKind::filter:
        return filter(e);
      case ExprKind::call:
        return e.is_method ? method(e) : function(e);
    }
    return {};
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    Value a = eval(*e.args[0]);
    if (op == "and") return truthy(a) ? eval(*e.args[1]) : a;
    if (op == "or") return truthy(a) ? a : eval(*e.args[1]);
    Value b = eval(*e.args[1]);
    if (op == "~") return Value::of(to_str(a) + to_str(b));
    if (op == "==") return Value::of(equal(a, b));
    if (op == "!=") return Value::of(!equal(a, b));
    if (op == "in" || op == "not in") return Value::of(contains(b, a) == (op == "in"));
    const bool json_pair = a.kind == Value::Kind::json && b.kind == Value::Kind::json;
    if (json_pair && a.j.is_string() && b.j.is_string()) {
      const std::string &x = a.j.get_ref<const std::string&>(),
                        &y = b.j.get_ref<const std::string&>();
      if (op == "+") return Value::of(x + y);
      if (op == "<") return Value::of(x < y);
      if (op == "<=") return Value::of(x <= y);
      if (op == ">") return Value::of(x > y);
      if (op == ">=") return Value::of(x >= y);
    }
    if (json_pair && a.j.is_array() && b.j.is_array() && op == "+") {
      json out = a.j;
      for (const auto& x : b.j) out.push_back(x);
      return Value::of(std::move(out));
    }
    if (json_pair && a.j.is_string() && b.j.is_number_integer() && op == "*") {
      std::string out;
      for (int64_t i = 0; i < std::min<int64_t>(b.j.get<int64_t>(), 1 << 20); ++i)
        out += a.j.get<std::string>();
      return Value::of(out);
    }
    if (!json_pair || !(a.j.is_number() && b.j.is_number()))
      fail(str("line ", line_, ": unsupported operands for '", op,
               "': ", shorten(repr(a.kind == Value::Kind::json ? a.j : json(to_str(a)))), " and ",
               shorten(repr(b.kind == Value::Kind::json ? b.j : json(to_str(b))))));
    const bool ints = !a.j.is_number_float() && !b.j.is_number_float();
    if (ints && op != "/") {
      const int64_t x = a.j.get<int64_t>(), y = b.j.get<int64_t>();
      if ((op == "//" || op == "%") && y == 0) fail(str("line ", line_, ": division by zero"));
      auto floordiv = [](int64_t p, int64_t q) {
        return p / q - ((p % q != 0) && ((p < 0) != (q < 0)));
      };
      if (op == "+") return Value::of(x + y);
      if (op == "-") return Value::of(x - y);
      if (op == "*") return Value::of(x * y);
      if (op == "//") return Value::of(floordiv(x, y));
      if (op == "%") return Value::of(x - floordiv(x, y) * y);
      if (op == "<") return Value::of(x < y);
      if (op == "<=") return Value::of(x <= y);
      if (op == ">") return Value::of(x > y);
      if (op == ">=") return Value::of(x >= y);
    }
    const double x = a.j.get<double>(), y = b.j.get<double>();
    if (op == "+") return Value::of(x + y);
    if (op == "-") return Value::of(x - y);
    if (op == "*") return Value::of(x * y);
    if (op == "/" || op == "//" || op == "%") {
      if (y == 0) fail(str("line ", line_, ": division by zero"));
      if (op == "/") return Value::of(x / y);
      if (op == "//") return Value::of(std::floor(x / y));
      return Value::of(x - std::floor(x / y) * y);
    }
    if (op == "<") return Value::of(x < y);
    if (op == "<=") return Value::of(x <= y);
    if (op == ">") return Value::of(x > y);
    return Value::of(x >= y);
  }

  bool contains(const Value& hay, const Value& needle) {
    if (hay.kind == Value::Kind::ns)
      return needle.kind == Value::Kind::json && needle.j.is_string() && hay.ns->contains(needle.j);
    if (!hay.defined()) fail(str("line ", line_, ": 'in' an undefined value"));
    const json& h = hay.j;
    if (h.is_string())
      return h.get<std::string>().find(as_string(needle, "'in' a string")) != std::string::npos;
    if (h.is_object())
      return needle.kind == Value::Kind::json && needle.j.is_string() && h.contains(needle.j);
    if (h.is_array())
      return std::any_of(h.begin(), h.end(),
                         [&](const json& x) { return equal(Value::of(x), needle); });
    fail(str("line ", line_, ": 'in' ", shorten(repr(h))));
  }

  std::vector<Value> args(const Expr& e, size_t first) {
    std::vector<Value> out;
    for (size_t i = first; i < e.args.size(); ++i) out.push_back(eval(*e.args[i]));
    return out;
  }

  Kwargs kwargs(const Expr& e) {
    Kwargs out;
    for (const auto& [k, v] : e.kwargs) out[k] = eval(*v);
    return out;
  }
  Value filter(const Expr& e) {
    return apply_filter(e.name, eval(*e.args[0]), args(e, 1), kwargs(e), line_);
  }
  Value method(const Expr& e) { return call_method(e.name, eval(*e.args[0]), args(e, 1), line_); }

  Value function(const Expr& e) {
    std::vector<Value> a = args(e, 0);
    if (e.name == "raise_exception")
      fail(a.empty() ? std::string("raise_exception()") : to_str(a[0]));
    if (e.name == "namespace") {
      Value ns;
      ns.kind = Value::Kind::ns;
      ns.ns = std::make_shared<json>(json::object());
      for (const auto& [k, x] : e.kwargs) {
        Value v = eval(*x);
        (*ns.ns)[k] = v.kind == Value::Kind::json ? v.j : json(to_str(v));
      }
      return ns;
    }
    // range
    if (a.empty() || a.size() > 2) fail(str("line ", line_, ": range() takes 1 or 2 integers"));
    const int64_t lo = a.size() == 2 ? as_int(a[0], "range()") : 0;
    const int64_t hi = as_int(a.back(), "range()");
    if (hi - lo > kMaxSteps) fail(str("line ", line_, ": range() of more than ", kMaxSteps));
    json out = json::array();
    for (int64_t i = lo; i < hi; ++i) out.push_back(i);
    return Value::of(std::move(out));
  }

  std::vector<std::map<std::string, Value>> scopes_;
  std::string out_;
  int64_t steps_ = 0;
  int line_ = 0;
};

std::string token_text(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

}  // namespace

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::parse(const std::string& source, const std::string& origin,
                                 std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  t.program_ = parse_chat_template(source, origin);
  t.origin_ = origin;
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  return t;
}

bool ChatTemplate::folder_has_template(const std::string& dir) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(fs::path(dir) / "chat_template.jinja")) return true;
  const fs::path cfg = fs::path(dir) / "tokenizer_config.json";
  if (!fs::is_regular_file(cfg)) return false;
  const nlohmann::json j = read_json_file(cfg.string(), "tokenizer_config.json", "chat_template");
  return j.is_object() && j.contains("chat_template") && !j["chat_template"].is_null();
}

ChatTemplate ChatTemplate::from_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  nlohmann::json cfg = nlohmann::json::object();
  if (fs::exists(cfg_path))
    cfg = read_json_file(cfg_path.string(), "tokenizer_config.json", "chat_template");
  if (!cfg.is_object())
    throw ConfigError(str("[chat_template] ", cfg_path.string(), " is not a JSON object"));
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";
  const std::string bos = token_text(cfg, "bos_token"), eos = token_text(cfg, "eos_token");
  if (fs::exists(jinja)) {
    const std::string src =
        read_regular_file(jinja.string(), "chat template", 16 << 20, "chat_template");
    check_utf8(src, jinja.string(), "chat_template");
    return parse(src, jinja.string(), bos, eos);
  }
  const nlohmann::json* tpl = cfg.contains("chat_template") ? &cfg["chat_template"] : nullptr;
  if (tpl && tpl->is_array()) {
    const nlohmann::json* named = nullptr;
    for (const nlohmann::json& t : *tpl)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template"))
        named = &t["template"];
    if (!named)
      throw ConfigError(str("[chat_template] ", cfg_path.string(),
                            ": \"chat_template\" is a list without a \"default\" template"));
    tpl = named;
  }
  if (!tpl || !tpl->is_string())
    throw ConfigError(str("[chat_template] no chat template in ", dir,
                          " (neither chat_template.jinja nor a string \"chat_template\" in "
                          "tokenizer_config.json)"));
  return parse(tpl->get<std::string>(), cfg_path.string() + " \"chat_template\"", bos, eos);
}

std::string ChatTemplate::render(const nlohmann::json& messages,
                                 const ChatRenderOptions& opts) const {
  return render(json::parse(messages.dump()), opts);
}

std::string ChatTemplate::render(const json& messages, const ChatRenderOptions& opts) const {
  NXD_CHECK(messages.is_array(), "[chat_template] messages must be a list, got ",
            shorten(messages.dump()));
  json globals = opts.extra.is_object() ? opts.extra : json::object();
  globals["messages"] = messages;
  globals["bos_token"] = bos_token_;
  globals["eos_token"] = eos_token_;
  globals["add_generation_prompt"] = opts.generation_prompt == GenerationPrompt::add;
  Renderer r(globals);
  r.render(program_->body);
  return r.take();
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 const ChatRenderOptions& opts) const {
  json list = json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return render(list, opts);
}

}  // namespace nxd::io
