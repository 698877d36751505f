// OpenAI's official Node client (the `openai` npm package, v4) against the server: completions
// and chat, streaming and not, an unknown model's 404, the model list, with a bearer key. Needs
// Node 20+ and the package: it is installed with npm into the build folder (NXD_NODE_DIR) on
// first use; without node, or when npm cannot install it (no network), the test is skipped with
// a message naming what is missing.
#include <gtest/gtest.h>

#include <fstream>

#include "serve_fixture.h"
#include "support/proc.h"

using namespace nxd::testing;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* kClient = R"(import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.argv[2], apiKey: 'sekret', maxRetries: 0 });
const out = {};
const req = { model: 'tiny', prompt: 'the cat sat', max_tokens: 8, temperature: 0 };
const c = await client.completions.create(req);
out.completion = c.choices[0].text;
out.completion_finish = c.choices[0].finish_reason;
out.completion_tokens = c.usage.completion_tokens;
let s = '';
for await (const chunk of await client.completions.create({ ...req, stream: true }))
  s += chunk.choices[0]?.text ?? '';
out.completion_stream = s;
const chat = { model: 'tiny', messages: [{ role: 'user', content: 'the dog ran' }], max_tokens: 8,
               temperature: 0 };
out.chat = (await client.chat.completions.create(chat)).choices[0].message.content;
let cs = '';
for await (const chunk of await client.chat.completions.create({ ...chat, stream: true }))
  cs += chunk.choices[0]?.delta?.content ?? '';
out.chat_stream = cs;
try {
  await client.completions.create({ ...req, model: 'nope' });
  out.error_status = 0;
} catch (e) {
  out.error_status = e.status;
  out.error_param = e.param ?? null;
}
out.models = (await client.models.list()).data.map((m) => m.id);
console.log(JSON.stringify(out));
)";

// `which`-like: the path of an executable on PATH, or "".
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "";
  size_t at = 0;
  while (at <= p.size()) {
    const size_t colon = std::min(p.find(':', at), p.size());
    const fs::path cand = fs::path(p.substr(at, colon - at)) / name;
    if (!cand.empty() && ::access(cand.c_str(), X_OK) == 0) return cand.string();
    at = colon + 1;
  }
  return "";
}

TEST(ServeOpenAINodeClient, CompletionsChatStreamsErrorsAndModels) {
  const std::string node = on_path("node"), npm = on_path("npm");
  if (node.empty()) GTEST_SKIP() << "node is not installed (Node 20+ runs the openai client)";
  const fs::path dir = NXD_NODE_DIR;
  fs::create_directories(dir);
  ProcResult v = run_process({node, "--version"}, dir, std::chrono::seconds(30));
  const int major = v.out.size() > 1 ? std::atoi(v.out.c_str() + 1) : 0;
  if (major < 20) GTEST_SKIP() << "node " << v.out << " is older than Node 20";
  if (!fs::exists(dir / "node_modules/openai/package.json")) {
    if (npm.empty()) GTEST_SKIP() << "npm is not installed: cannot install the openai package";
    const ProcResult i = run_process({npm, "install", "--prefix", dir.string(), "--no-audit",
                                      "--no-fund", "--loglevel=error", "openai@4"},
                                     dir, std::chrono::seconds(180));
    if (i.code != 0 || !fs::exists(dir / "node_modules/openai/package.json"))
      GTEST_SKIP() << "npm install openai@4 into " << dir
                   << " failed (no network?): " << i.err.substr(0, 400);
  }
  std::ofstream(dir / "client.mjs") << kClient;
  ServeOptions o;
  o.server.api_key = "sekret";
  Served s(o);
  const std::string base = "http://127.0.0.1:" + std::to_string(s.server->port()) + "/v1";
  const ProcResult r =
      run_process({node, (dir / "client.mjs").string(), base}, dir, std::chrono::seconds(120));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const json got = json::parse(r.out);
  // the same requests through httplib::Client
  auto c = s.client();
  const httplib::Headers key = {{"Authorization", "Bearer sekret"}};
  const Reply comp = post(c, "/v1/completions",
                          R"({"prompt": "the cat sat", "max_tokens": 8, "temperature": 0})", key);
  const Reply chat = post(
      c, "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "the dog ran"}], "max_tokens": 8, "temperature": 0})",
      key);
  ASSERT_EQ(comp.status, 200) << comp.body;
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(got["completion"], comp.json["choices"][0]["text"]);
  EXPECT_EQ(got["completion_stream"], comp.json["choices"][0]["text"]);
  EXPECT_EQ(got["completion_finish"], "length");
  EXPECT_EQ(got["completion_tokens"], 8);
  EXPECT_EQ(got["chat"], chat.json["choices"][0]["message"]["content"]);
  EXPECT_EQ(got["chat_stream"], chat.json["choices"][0]["message"]["content"]);
  EXPECT_EQ(got["error_status"], 404);
  EXPECT_EQ(got["error_param"], "model");
  EXPECT_EQ(got["models"], json::array({"tiny"}));
}

}  // namespace
