// The chat template (io/chat_template.h) against jinja2: fixtures/chat_template/reference.json
// holds jinja2 3.1.6's text (or error) for five templates (Llama 3, ChatML/Qwen 2, Qwen 2.5 with
// tools, Mistral's [INST], and one that uses every supported feature) on five conversations,
// rendered as transformers renders them (make_reference.py). Unsupported features are refused
// by name when the template is parsed.
#include "nxd/io/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "nxd/io/tokenizer.h"
#include "nxd/runtime/error.h"
#include "support/files.h"

namespace {
using ojson = nlohmann::ordered_json;
using nxd::io::ChatTemplate;
using nxd::io::GenerationPrompt;
const std::string kDir = NXD_CHAT_TEMPLATE_FIXTURES;

ojson load(const std::string& name) {
  return ojson::parse(nxd::testing::slurp(kDir + "/" + name));
}

TEST(ChatTemplate, RendersAsJinja2DoesForLlama3ChatMLQwenMistralAndEveryFeature) {
  const ojson templates = load("templates.json"), conversations = load("conversations.json");
  const ojson reference = load("reference.json");
  ASSERT_EQ(reference.size(), templates.size() * conversations.size() * 2);
  int64_t texts = 0, errors = 0;
  for (const ojson& want : reference) {
    const ojson* t = nullptr;
    const ojson* c = nullptr;
    for (const ojson& x : templates)
      if (x["name"] == want["template"]) t = &x;
    for (const ojson& x : conversations)
      if (x["name"] == want["conversation"]) c = &x;
    ASSERT_TRUE(t && c);
    SCOPED_TRACE(want["template"].get<std::string>() + " / " +
                 want["conversation"].get<std::string>() +
                 (want["add_generation_prompt"].get<bool>() ? " + generation prompt" : ""));
    const ChatTemplate tpl = ChatTemplate::parse((*t)["template"], want["template"],
                                                 (*t)["bos_token"], (*t)["eos_token"]);
    nxd::io::ChatRenderOptions opts{.generation_prompt = want["add_generation_prompt"].get<bool>()
                                                             ? GenerationPrompt::add
                                                             : GenerationPrompt::omit,
                                    .extra = c->value("extra", ojson::object())};
    if (want.contains("text")) {
      EXPECT_EQ(tpl.render((*c)["messages"], opts), want["text"].get<std::string>());
      ++texts;
    } else {
      try {
        tpl.render((*c)["messages"], opts);
        ADD_FAILURE() << "rendered, jinja2 raised: " << want["error"];
      } catch (const nxd::InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(want["error"].get<std::string>()), std::string::npos)
            << e.what();
      }
      ++errors;
    }
  }
  EXPECT_EQ(texts, 44);
  EXPECT_EQ(errors, 6);  // Mistral's raise_exception on roles out of order
}

void expect_refused(const std::string& src, const std::string& named) {
  try {
    ChatTemplate::parse(src, "test");
    ADD_FAILURE() << "parsed: " << src;
  } catch (const nxd::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos)
        << "message: " << e.what() << "\nwanted: " << named;
  }
}

TEST(ChatTemplate, RefusesUnsupportedFeaturesByNameWhenParsed) {
  expect_refused("{% macro f() %}x{% endmacro %}", "unsupported tag 'macro'");
  expect_refused("{% include 'x' %}", "unsupported tag 'include'");
  expect_refused("{% raw %}x{% endraw %}", "unsupported tag 'raw'");
  expect_refused("{{ messages | map(attribute='role') }}", "unsupported filter 'map'");
  expect_refused("{{ messages | selectattr('role') | list }}", "unsupported filter 'selectattr'");
  expect_refused("{% if 3 is divisibleby 3 %}{% endif %}", "unsupported test 'divisibleby'");
  expect_refused("{{ 'a'.format(1) }}", "unsupported method 'format'");
  expect_refused("{{ strftime_now('%d') }}", "unsupported function 'strftime_now'");
  expect_refused("{% for m in messages if m.role %}{% endfor %}", "unsupported loop filter");
  expect_refused("{% for m in messages %}{% else %}{% endfor %}", "'for ... else'");
  expect_refused("{{ {'a': 1} }}", "unsupported dict literal");
  expect_refused("{{ 2 ** 3 }}", "unsupported operator '**'");
  expect_refused("{{ messages[::2] }}", "unsupported slice step");
  expect_refused("{% set x %}a{% endset %}", "unsupported block 'set'");
  // syntax errors name the line
  expect_refused("a\nb\n{% if x %}", "line 3: missing '{% endif %}'");
  expect_refused("\n{{ 'open }}", "line 2: unterminated string");
  expect_refused("{% endfor %}", "'endfor' without its opening tag");
  expect_refused(
      "{{ (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((1"
      "))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))) }}",
      "nested too deeply");
}

TEST(ChatTemplate, RenderErrorsAreInvalidArgumentNamingTheProblem) {
  const auto t = ChatTemplate::parse("{{ messages[0].content.name.x }}", "t");
  EXPECT_THROW(t.render(ojson::parse(R"([{"role": "user", "content": "x"}])")),
               nxd::InvalidArgument);
  EXPECT_THROW(t.render(ojson::parse(R"({"role": "user"})")), nxd::InvalidArgument);
  const auto loop = ChatTemplate::parse("{% for i in range(20000000) %}{% endfor %}", "t");
  EXPECT_THROW(loop.render(ojson::array()), nxd::InvalidArgument);
}

TEST(ChatTemplate, FromFolderTakesTheJinjaFileThenTokenizerConfigWithItsTokens) {
  nxd::testing::ScratchDir dir("nxd_chat_template_");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.path / name) << text;
  };
  EXPECT_FALSE(ChatTemplate::folder_has_template(dir.path.string()));
  EXPECT_THROW(ChatTemplate::from_folder(dir.path.string()), nxd::ConfigError);
  write("tokenizer_config.json",
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]})");
  EXPECT_TRUE(ChatTemplate::folder_has_template(dir.path.string()));
  const std::vector<nxd::io::ChatMessage> msgs = {{"user", "hi"}};
  {
    const auto t = ChatTemplate::from_folder(dir.path.string());
    EXPECT_EQ(t.bos_token(), "<s>");
    EXPECT_EQ(t.eos_token(), "</s>");
    EXPECT_EQ(t.render(msgs), "<s>hi</s>");
  }
  write("chat_template.jinja", "{{ messages[0].role }}\n");
  EXPECT_EQ(ChatTemplate::from_folder(dir.path.string()).render(msgs), "user\n");
}

// The rendered Llama 3 prompt tokenizes its special tokens to their ids (the tokenizer splits
// added tokens out of the text), so the server's prompt starts with <|begin_of_text|>.
TEST(ChatTemplate, Llama3PromptTokenizesItsSpecialTokens) {
  const ojson templates = load("templates.json");
  const ChatTemplate t =
      ChatTemplate::parse(templates[0]["template"], "llama3", "<|begin_of_text|>", "<|eot_id|>");
  const auto tok =
      nxd::io::Tokenizer::from_file(std::string(NXD_TOKENIZER_FIXTURES) + "/llama3.tokenizer.json");
  const std::vector<int64_t> ids =
      tok.encode(t.render(std::vector<nxd::io::ChatMessage>{{"user", "Hi"}}));
  const std::vector<int64_t> bos = tok.encode("<|begin_of_text|>");
  ASSERT_EQ(bos.size(), 1u);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), bos[0]);
  EXPECT_EQ(tok.decode(ids), t.render(std::vector<nxd::io::ChatMessage>{{"user", "Hi"}}));
}

}  // namespace
