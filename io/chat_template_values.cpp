// Values and built-ins of a chat template (io/chat_template_values.h).
#include "nxd/io/chat_template_values.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "nxd/io/bounded_read.h"
#include "nxd/runtime/error.h"

namespace nxd::io::chat {

void fail(const std::string& what) {
  throw InvalidArgument(str("[chat_template] ", what));
}

namespace {}  // namespace

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

bool apply_test(const std::string& name, const Value& v) {
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

Value apply_filter(const std::string& f, const Value& v, const std::vector<Value>& a,
                   const Kwargs& kw, int line_) {
  if (f == "default" || f == "d") {
    const auto flag = kw.find("boolean");
    const bool boolean =
        (a.size() > 1 && truthy(a[1])) || (flag != kw.end() && truthy(flag->second));
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
    const auto ind = kw.find("indent");
    int indent = -1;
    if (ind != kw.end()) {
      const Value& iv = ind->second;
      if (iv.kind == Value::Kind::json && !iv.j.is_null())
        indent = static_cast<int>(std::clamp<int64_t>(as_int(iv, "tojson indent"), 0, 64));
    }
    std::string out;
    dump_python(v.kind == Value::Kind::ns ? *v.ns : v.j, indent, 0, out);
    return Value::of(out);
  }
  if (v.kind != Value::Kind::json) {
    if (f == "length" || f == "count") fail(str("line ", line_, ": length of an undefined value"));
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
  for (auto it = j.begin(); it != j.end(); ++it) out.push_back(json::array({it.key(), it.value()}));
  return Value::of(std::move(out));
}

Value call_method(const std::string& m, const Value& self, const std::vector<Value>& a, int line_) {
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

}  // namespace nxd::io::chat
