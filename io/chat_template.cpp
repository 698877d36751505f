// Rendering a chat template (io/chat_template.h) with Python's semantics for the values it
// touches: str() of values, truthiness, `and`/`or` returning an operand, negative indices and
// slices, transformers' tojson (json.dumps with ensure_ascii=False).
#include "nxd/io/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <map>

#include "nxd/io/bounded_read.h"
#include "nxd/io/chat_template_ast.h"
#include "nxd/runtime/error.h"

namespace nxd::io {
namespace {
using chat::Body;
using chat::Expr;
using chat::ExprKind;
using chat::Node;
using chat::NodeKind;
using json = nlohmann::ordered_json;

constexpr int64_t kMaxSteps = 10'000'000;         // loop iterations and outputs of one render
constexpr size_t kMaxOutput = size_t{256} << 20;  // bytes of one render

[[noreturn]] void fail(const std::string& what) {
  throw InvalidArgument(str("[chat_template] ", what));
}

struct Value {
  enum class Kind { undefined, json, ns };
  Kind kind = Kind::undefined;
  json j;
  std::shared_ptr<json> ns;  // namespace(): shared, so `set ns.x` is seen outside a loop

  static Value of(json v) { return Value{Kind::json, std::move(v), nullptr}; }
  bool defined() const { return kind != Kind::undefined; }
};

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {  // Python's repr of a str (single quotes)
  std::string out = "'";
  for (char c : s) {
    if (c == '\'' || c == '\\') out += '\\';
    if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out + "'";
}

std::string repr(const json& v);
std::string str_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return repr(v);
}
std::string repr(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "None";
    case json::value_t::boolean:
      return v.get<bool>() ? "True" : "False";
    case json::value_t::number_integer:
      return std::to_string(v.get<int64_t>());
    case json::value_t::number_unsigned:
      return std::to_string(v.get<uint64_t>());
    case json::value_t::number_float:
      return python_float(v.get<double>());
    case json::value_t::string:
      return quote(v.get<std::string>());
    case json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + repr(v[i]);
      return out + "]";
    }
    case json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it, first = false)
        out += (first ? "" : ", ") + quote(it.key()) + ": " + repr(it.value());
      return out + "}";
    }
    default:
      return "";
  }
}

std::string to_str(const Value& v) {
  if (v.kind == Value::Kind::undefined) return "";
  if (v.kind == Value::Kind::ns) return "<Namespace " + repr(*v.ns) + ">";
  return str_of(v.j);
}

// json.dumps(v, ensure_ascii=False, indent=indent): Python's separators and escapes
void dump_python(const json& v, int indent, int level, std::string& out) {
  auto newline = [&](int l) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * l), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  if (v.is_array() || v.is_object()) {
    if (v.empty()) {
      out += v.is_array() ? "[]" : "{}";
      return;
    }
    out += v.is_array() ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it, first = false) {
      if (!first) out += item_sep;
      newline(level + 1);
      if (v.is_object()) out += json(it.key()).dump(-1, ' ', false) + ": ";
      dump_python(it.value(), indent, level + 1, out);
    }
    newline(level);
    out += v.is_array() ? ']' : '}';
  } else if (v.is_number_float()) {
    out += python_float(v.get<double>());
  } else if (v.is_boolean()) {
    out += v.get<bool>() ? "true" : "false";
  } else {
    out += v.dump(-1, ' ', false);
  }
}

bool truthy(const Value& v) {
  if (v.kind == Value::Kind::undefined) return false;
  if (v.kind == Value::Kind::ns) return true;
  const json& j = v.j;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer() || j.is_number_unsigned()) return j.get<int64_t>() != 0;
  if (j.is_number_float()) return j.get<double>() != 0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();  // json's empty() is false
  return !j.empty();                                                   // lists, mappings
}

bool equal(const Value& a, const Value& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.kind == Value::Kind::ns || b.kind == Value::Kind::ns) return a.ns == b.ns;
  return a.j == b.j;
}

int64_t as_int(const Value& v, const char* what) {
  if (v.kind != Value::Kind::json || !(v.j.is_number_integer() || v.j.is_number_unsigned()))
    fail(str(what, " needs an integer, got ", shorten(to_str(v))));
  return v.j.get<int64_t>();
}

const std::string& as_string(const Value& v, const char* what) {
  if (v.kind != Value::Kind::json || !v.j.is_string())
    fail(str(what, " needs a string, got ", shorten(to_str(v))));
  return v.j.get_ref<const std::string&>();
}

// Python's index of a sequence of n: negative counts from the end; -1 when outside
int64_t py_index(int64_t i, int64_t n) {
  if (i < 0) i += n;
  return i < 0 || i >= n ? -1 : i;
}

std::string strip(const std::string& s, const std::string& chars, bool left, bool right) {
  const std::string set = chars.empty() ? std::string(" \t\n\r\f\v") : chars;
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && set.find(s[b]) != std::string::npos) ++b;
  if (right)
    while (e > b && set.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

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
        return Value::of(test(e.name, eval(*e.args[0])) != e.negate);
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

  static bool test(const std::string& name, const Value& v) {
    const bool js = v.kind == Value::Kind::json;
    if (name == "defined") return v.defined();
    if (name == "undefined") return !v.defined();
    if (name == "none") return js && v.j.is_null();
    if (name == "string") return js && v.j.is_string();
    if (name == "number") return js && v.j.is_number();
    if (name == "boolean") return js && v.j.is_boolean();
    if (name == "mapping") return v.kind == Value::Kind::ns || (js && v.j.is_object());
    if (name == "sequence" || name == "iterable")
      return js && (v.j.is_string() || v.j.is_array() || v.j.is_object());
    if (name == "even" || name == "odd") {
      if (!js || !v.j.is_number_integer()) return false;
      return (v.j.get<int64_t>() % 2 == 0) == (name == "even");
    }
    return false;
  }

  std::vector<Value> args(const Expr& e, size_t first) {
    std::vector<Value> out;
    for (size_t i = first; i < e.args.size(); ++i) out.push_back(eval(*e.args[i]));
    return out;
  }
  const Expr* kwarg(const Expr& e, const char* name) {
    for (const auto& [k, v] : e.kwargs)
      if (k == name) return v.get();
    return nullptr;
  }

  Value filter(const Expr& e) {
    const std::string& f = e.name;
    Value v = eval(*e.args[0]);
    std::vector<Value> a = args(e, 1);
    if (f == "default" || f == "d") {
      const Expr* flag = kwarg(e, "boolean");
      const bool boolean = (a.size() > 1 && truthy(a[1])) || (flag && truthy(eval(*flag)));
      const Value dflt = a.empty() ? Value::of("") : a[0];
      return (boolean ? truthy(v) : v.defined()) ? v : dflt;
    }
    if (f == "trim") return Value::of(strip(to_str(v), a.empty() ? "" : to_str(a[0]), true, true));
    if (f == "upper" || f == "lower") return Value::of(ascii_case(to_str(v), f == "upper"));
    if (f == "capitalize") {
      std::string s = ascii_case(to_str(v), false);
      if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
      return Value::of(s);
    }
    if (f == "string") return Value::of(to_str(v));
    if (f == "tojson") {
      const Expr* ind = kwarg(e, "indent");
      int indent = -1;
      if (ind) {
        const Value iv = eval(*ind);
        if (iv.kind == Value::Kind::json && !iv.j.is_null())
          indent = static_cast<int>(std::clamp<int64_t>(as_int(iv, "tojson indent"), 0, 64));
      }
      std::string out;
      dump_python(v.kind == Value::Kind::ns ? *v.ns : v.j, indent, 0, out);
      return Value::of(out);
    }
    if (v.kind != Value::Kind::json) {
      if (f == "length" || f == "count")
        fail(str("line ", line_, ": length of an undefined value"));
      if (!v.defined() && (f == "list" || f == "items")) return Value::of(json::array());
      fail(str("line ", line_, ": filter '", f, "' of ",
               v.defined() ? "a namespace" : "an undefined value"));
    }
    const json& j = v.j;
    if (f == "length" || f == "count") {
      if (j.is_string())
        return Value::of(static_cast<int64_t>(code_points(j.get<std::string>()).size()));
      if (j.is_array() || j.is_object()) return Value::of(static_cast<int64_t>(j.size()));
      fail(str("line ", line_, ": length of ", shorten(repr(j))));
    }
    if (f == "list" || f == "first" || f == "last" || f == "join") {
      json items = json::array();
      if (j.is_string())
        for (auto& c : code_points(j.get<std::string>())) items.push_back(c);
      else if (j.is_object())
        for (auto it = j.begin(); it != j.end(); ++it) items.push_back(it.key());
      else if (j.is_array())
        items = j;
      else
        fail(str("line ", line_, ": filter '", f, "' of ", shorten(repr(j))));
      if (f == "list") return Value::of(std::move(items));
      if (f == "first") return items.empty() ? Value{} : Value::of(items.front());
      if (f == "last") return items.empty() ? Value{} : Value::of(items.back());
      const std::string sep = a.empty() ? "" : to_str(a[0]);
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + str_of(items[i]);
      return Value::of(out);
    }
    // items
    if (!j.is_object()) fail(str("line ", line_, ": filter 'items' of ", shorten(repr(j))));
    json out = json::array();
    for (auto it = j.begin(); it != j.end(); ++it)
      out.push_back(json::array({it.key(), it.value()}));
    return Value::of(std::move(out));
  }

  Value method(const Expr& e) {
    const std::string& m = e.name;
    Value self = eval(*e.args[0]);
    std::vector<Value> a = args(e, 1);
    if (self.kind == Value::Kind::json && self.j.is_object()) {
      const json& j = self.j;
      json out = json::array();
      if (m == "get") {
        if (a.empty()) fail(str("line ", line_, ": get() needs a key"));
        auto it = j.find(as_string(a[0], "get()"));
        return it != j.end() ? Value::of(*it) : a.size() > 1 ? a[1] : Value::of(nullptr);
      }
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (m == "items")
          out.push_back(json::array({it.key(), it.value()}));
        else if (m == "keys")
          out.push_back(it.key());
        else if (m == "values")
          out.push_back(it.value());
        else
          fail(str("line ", line_, ": a mapping has no method '", m, "'"));
      }
      return Value::of(std::move(out));
    }
    const std::string& s = as_string(self, ("method '" + m + "'").c_str());
    auto arg_str = [&](size_t i) {
      return a.size() > i && !(a[i].kind == Value::Kind::json && a[i].j.is_null())
                 ? as_string(a[i], m.c_str())
                 : std::string();
    };
    if (m == "strip") return Value::of(strip(s, arg_str(0), true, true));
    if (m == "lstrip") return Value::of(strip(s, arg_str(0), true, false));
    if (m == "rstrip") return Value::of(strip(s, arg_str(0), false, true));
    if (m == "upper" || m == "lower") return Value::of(ascii_case(s, m == "upper"));
    if (m == "startswith") return Value::of(s.rfind(arg_str(0), 0) == 0);
    if (m == "endswith") {
      const std::string x = arg_str(0);
      return Value::of(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0);
    }
    if (m == "replace") {
      const std::string from = arg_str(0), to = arg_str(1);
      if (from.empty()) fail(str("line ", line_, ": replace() of an empty string"));
      std::string out;
      size_t pos = 0;
      for (size_t f; (f = s.find(from, pos)) != std::string::npos; pos = f + from.size())
        out += s.substr(pos, f - pos) + to;
      return Value::of(out + s.substr(pos));
    }
    if (m == "split") {
      const std::string sep = arg_str(0);
      json out = json::array();
      if (sep.empty()) {  // Python: runs of whitespace, no empty parts
        std::string cur;
        for (char c : s + " ") {
          if (std::string(" \t\n\r\f\v").find(c) == std::string::npos)
            cur += c;
          else if (!cur.empty())
            out.push_back(cur), cur.clear();
        }
      } else {
        size_t pos = 0;
        for (size_t f; (f = s.find(sep, pos)) != std::string::npos; pos = f + sep.size())
          out.push_back(s.substr(pos, f - pos));
        out.push_back(s.substr(pos));
      }
      return Value::of(std::move(out));
    }
    fail(str("line ", line_, ": a string has no method '", m, "'"));
  }

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
