#pragma once
// A model's chat template: the Jinja text in a transformers folder (chat_template.jinja, or
// tokenizer_config.json's "chat_template") that turns a list of messages into the prompt text,
// rendered as transformers' apply_chat_template renders it (jinja2's sandbox with trim_blocks and
// lstrip_blocks; variables `messages`, `bos_token`, `eos_token`, `add_generation_prompt`, and
// the function `raise_exception`).
//
// The supported subset of Jinja (what Llama 3, ChatML/Qwen 2 and 2.5 and Mistral's [INST]
// templates use); anything else is refused by name when the template is parsed:
//   tags      {{ expr }}, {% if %}/{% elif %}/{% else %}/{% endif %},
//             {% for x in expr %} and {% for k, v in expr %} ... {% endfor %}, {% set x = expr %},
//             {% set ns.attr = expr %}, {# comments #}, whitespace control {%- -%} {{- -}}
//   loop      loop.index, loop.index0, loop.revindex, loop.revindex0, loop.first, loop.last,
//             loop.length
//   values    'strings' "strings" (\n \t \\ \' \" escapes), integers, true/false/none (any case),
//             [lists], variables, a.attr, a['key'], a[i] (negative counts from the end), a[i:j]
//   operators + - * / // % ~ == != < <= > >= in, not in, and, or, not, x if c else y, ( )
//   tests     is [not] defined, undefined, none, string, number, mapping, sequence, iterable,
//             boolean, even, odd
//   filters   trim, length, count, upper, lower, capitalize, string, tojson (indent=), default/d,
//             join, first, last, list, items
//   methods   strings: strip lstrip rstrip upper lower startswith endswith split replace;
//             mappings: items keys values get
//   functions raise_exception(msg), namespace(k=v, ...), range(n) / range(a, b)
// Undefined values render as "" and are false; reading an attribute of one is an error, as in
// jinja2. Rendering errors (raise_exception included) throw InvalidArgument with the message.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace nxd::io {

struct ChatMessage {
  std::string role;
  std::string content;
};

enum class GenerationPrompt { omit, add };  // add_generation_prompt

struct ChatRenderOptions {
  GenerationPrompt generation_prompt = GenerationPrompt::add;
  // More variables for the template (e.g. "tools", "date_string"); messages, bos_token,
  // eos_token and add_generation_prompt are set by render. Ordered: tojson keeps key order.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // Parses `source`; ConfigError naming `origin` and the unsupported feature (a tag, filter,
  // test, method or function by name) or the syntax error with its line.
  static ChatTemplate parse(const std::string& source, const std::string& origin,
                            std::string bos_token = "", std::string eos_token = "");
  // The template of a transformers folder: chat_template.jinja if present, else
  // tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which
  // "default" is taken), with tokenizer_config.json's bos_token and eos_token (strings or
  // {"content": ...}). ConfigError naming the file when there is no template.
  static ChatTemplate from_folder(const std::string& dir);
  // True when `dir` has a chat template (the files above; nothing is parsed).
  static bool folder_has_template(const std::string& dir);

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // `messages`: a JSON list of objects ({"role": ..., "content": ...} and any other keys). With
  // ordered_json, mappings keep their order (as Python's dicts: tojson, items()); nlohmann::json
  // sorts keys.
  std::string render(const nlohmann::ordered_json& messages,
                     const ChatRenderOptions& opts = {}) const;
  std::string render(const nlohmann::json& messages, const ChatRenderOptions& opts = {}) const;
  std::string render(const std::vector<ChatMessage>& messages,
                     const ChatRenderOptions& opts = {}) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  const std::string& origin() const { return origin_; }

  struct Program;  // the parsed template (chat_template_ast.h)

 private:
  ChatTemplate() = default;
  std::unique_ptr<const Program> program_;
  std::string origin_, bos_token_, eos_token_;
};

}  // namespace nxd::io
