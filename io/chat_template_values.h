#pragma once
// The values a chat template computes with and its built-ins (filters, tests, methods), with
// Python's semantics: str() and repr() of values, truthiness, transformers' tojson. Internal to
// chat_template.cpp (the renderer) and chat_template_values.cpp.
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace nxd::io::chat {

using json = nlohmann::ordered_json;

inline constexpr int64_t kMaxSteps = 10'000'000;  // loop iterations and outputs of one render

// InvalidArgument "[chat_template] what".
[[noreturn]] void fail(const std::string& what);

struct Value {
  enum class Kind { undefined, json, ns };
  Kind kind = Kind::undefined;
  json j;
  std::shared_ptr<json> ns;  // namespace(): shared, so `set ns.x` is seen outside a loop

  static Value of(json v) { return Value{Kind::json, std::move(v), nullptr}; }
  bool defined() const { return kind != Kind::undefined; }
};
using Kwargs = std::map<std::string, Value>;

std::vector<std::string> code_points(const std::string& s);  // UTF-8 characters
std::string repr(const json& v);                             // Python's repr()
std::string str_of(const json& v);                           // Python's str()
std::string to_str(const Value& v);                          // what {{ v }} prints
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
int64_t as_int(const Value& v, const char* what);
const std::string& as_string(const Value& v, const char* what);
int64_t py_index(int64_t i, int64_t n);  // a negative index counts from the end; -1 outside

// `v is name` (name checked by the parser).
bool apply_test(const std::string& name, const Value& v);
// `v | name(a..., kw...)`.
Value apply_filter(const std::string& name, const Value& v, const std::vector<Value>& a,
                   const Kwargs& kw, int line);
// `self.name(a...)`.
Value call_method(const std::string& name, const Value& self, const std::vector<Value>& a,
                  int line);

}  // namespace nxd::io::chat
