// The engine's requests: every stop rule reported, logprobs, bad fields named, the serving loop
// on its own thread, and the EOS ids of a model folder.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <memory>
#include <thread>

#include "engine_util.h"
#include "nxd/inference/engine.h"
#include "nxd/io/tokenizer.h"
#include "support/files.h"

using namespace nxd;
using namespace nxd::inference;
using namespace nxd::inference::testing;

TEST(Engine, EachStopRuleIsReported) {
  auto m = tiny_llama(8);
  const auto prompt = ids(6, 9);
  const std::vector<int64_t> ref = alone(m, request(prompt, 30, greedy()));
  // the first generated id that did not occur before it, at index >= 2
  size_t at = 2;
  while (std::find(ref.begin(), ref.begin() + at, ref[at]) != ref.begin() + at) ++at;
  ASSERT_LT(at, ref.size());
  auto run = [&](EngineOptions o, Request r, std::shared_ptr<io::Tokenizer> tok = nullptr) {
    Engine e(m, tok, o);
    Results res;
    const int64_t id = e.submit(r, into(res));
    e.run_until_idle();
    return res[id];
  };
  {
    EngineOptions o;
    o.eos_token_ids = {ref[at]};
    Got g = run(o, request(prompt, 30, greedy()));
    EXPECT_EQ(g.last.finish, FinishReason::eos);
    EXPECT_EQ(g.ids, std::vector<int64_t>(ref.begin(), ref.begin() + at + 1));
    Request r = request(prompt, 30, greedy());
    r.stop.ignore_eos = true;
    EXPECT_EQ(run(o, r).last.finish, FinishReason::length);
  }
  {
    Request r = request(prompt, 30, greedy());
    r.stop.stop_token_ids = {ref[at]};
    Got g = run({}, r);
    EXPECT_EQ(g.last.finish, FinishReason::stop_token);
    EXPECT_EQ(g.ids.size(), at + 1);
  }
  {
    Got g = run({}, request(prompt, 5, greedy()));
    EXPECT_EQ(g.last.finish, FinishReason::length);
    EXPECT_EQ(g.ids.size(), 5u);
    EXPECT_EQ(std::string(openai_finish_reason(g.last.finish)), "length");
  }
  for (int64_t max_tokens : {int64_t{30}, std::numeric_limits<int64_t>::max()}) {
    EngineOptions o;
    o.max_model_len = 10;
    Got g = run(o, request(prompt, max_tokens, greedy()));
    EXPECT_EQ(g.last.finish, FinishReason::context_limit);
    EXPECT_EQ(g.ids.size(), 4u);  // 6 + 4 = max_model_len
  }
  {  // stop strings through a byte-level tokenizer (ids < 64 are single bytes)
    auto tok = std::make_shared<io::Tokenizer>(
        io::Tokenizer::from_file(std::string(NXD_TOKENIZER_FIXTURES) + "/gpt2.tokenizer.json"));
    const std::string full = tok->decode(ref);
    ASSERT_GE(full.size(), 12u);
    Got whole = run({}, request(prompt, 30, greedy()), tok);
    EXPECT_EQ(whole.text, full);
    const std::string stop = full.substr(8, 3);
    Request r = request(prompt, 30, greedy());
    r.stop.stop = {"\x01\x02\x03\x04 never", stop};
    Got g = run({}, r, tok);
    EXPECT_EQ(g.last.finish, FinishReason::stop_string);
    EXPECT_EQ(g.text, full.substr(0, full.find(stop)));
    EXPECT_EQ(std::string(to_string(g.last.finish)), "stop_string");
  }
}

TEST(Engine, LogprobsAreTheModelsAndSumBelowOne) {
  auto m = tiny_llama(2);
  SamplingParams sp = greedy();
  sp.logprobs = 3;
  Engine e(m, nullptr, {});
  Results res;
  const int64_t id = e.submit(request(ids(5, 4), 6, sp), into(res));
  e.run_until_idle();
  const Got& g = res[id];
  ASSERT_EQ(g.chosen.size(), 6u);
  ASSERT_EQ(g.top.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(g.chosen[i].id, g.ids[i]);
    ASSERT_EQ(g.top[i].size(), 3u);
    EXPECT_EQ(g.top[i][0].id, g.ids[i]);  // greedy picks the most likely
    EXPECT_GE(g.top[i][0].logprob, g.top[i][1].logprob);
    double mass = 0;
    for (const auto& t : g.top[i]) mass += std::exp(t.logprob);
    EXPECT_LE(mass, 1.0 + 1e-12);
    EXPECT_LE(g.chosen[i].logprob, 0.0);
  }
}

TEST(Engine, BadRequestFieldsAreInvalidArgumentNamingTheField) {
  auto m = tiny_llama();
  EngineOptions o;
  o.max_model_len = 40;
  o.max_waiting = 2;
  Engine e(m, nullptr, o);
  auto with = [](auto edit) {
    Request r = request({1, 2, 3}, 4, greedy());
    edit(r);
    return r;
  };
  const std::vector<std::pair<std::string, Request>> cases = {
      {"prompt is empty", with([](Request& r) { r.prompt.clear(); })},
      {"prompt[1]=64", with([](Request& r) { r.prompt[1] = 64; })},
      {"sampling.temperature=-1", with([](Request& r) { r.sampling.temperature = -1; })},
      {"sampling.top_k=-2", with([](Request& r) { r.sampling.top_k = -2; })},
      {"sampling.top_p=0", with([](Request& r) { r.sampling.top_p = 0; })},
      {"sampling.min_p=1.5", with([](Request& r) { r.sampling.min_p = 1.5; })},
      {"sampling.repetition_penalty=0",
       with([](Request& r) { r.sampling.repetition_penalty = 0; })},
      {"sampling.presence_penalty=3", with([](Request& r) { r.sampling.presence_penalty = 3; })},
      {"sampling.frequency_penalty=-2.5",
       with([](Request& r) { r.sampling.frequency_penalty = -2.5; })},
      {"sampling.logprobs=21", with([](Request& r) { r.sampling.logprobs = 21; })},
      {"stop.max_tokens=0", with([](Request& r) { r.stop.max_tokens = 0; })},
      {"stop_token_ids has 70", with([](Request& r) { r.stop.stop_token_ids = {70}; })},
      {"stop strings need a tokenizer", with([](Request& r) { r.stop.stop = {"x"}; })},
      {"stop has an empty string", with([](Request& r) { r.stop.stop = {""}; })},
      {"prompt has 40 tokens; max_model_len=40",
       with([](Request& r) { r.prompt = std::vector<int64_t>(40, 1); })},
  };
  for (const auto& [want, r] : cases) {
    const std::string msg = expect_invalid(e, r);
    EXPECT_NE(msg.find(want), std::string::npos) << "want \"" << want << "\" in: " << msg;
  }
  e.submit(request({1}, 2, greedy()), nullptr);
  e.submit(request({1}, 2, greedy()), nullptr);
  EXPECT_THROW(e.submit(request({1}, 2, greedy()), nullptr), QueueFull);
  e.run_until_idle();
  EXPECT_NO_THROW(e.submit(request({1}, 2, greedy()), nullptr));
  // options
  EngineOptions bad;
  bad.block_size = 0;
  EXPECT_THROW(Engine(m, nullptr, bad), InvalidArgument);
  bad = {};
  bad.max_model_len = 65;
  EXPECT_THROW(Engine(m, nullptr, bad), InvalidArgument);
}

TEST(Engine, ServingLoopOnItsOwnThread) {
  auto m = tiny_llama(4);
  Engine e(m, nullptr, {});
  const Request r = request(ids(7, 2), 9, greedy());
  const std::vector<int64_t> ref = alone(m, r);
  std::jthread loop([&](std::stop_token st) { e.run(st); });
  for (int round = 0; round < 2; ++round) {
    std::promise<std::vector<int64_t>> done;
    auto ids_so_far = std::make_shared<std::vector<int64_t>>();
    e.submit(r, [&done, ids_so_far](const Output& o) {
      ids_so_far->insert(ids_so_far->end(), o.ids.begin(), o.ids.end());
      if (o.finish != FinishReason::none) done.set_value(*ids_so_far);
    });
    EXPECT_EQ(done.get_future().get(), ref) << "round " << round;
  }
  loop.request_stop();
}

TEST(Engine, ReadsEosIdsFromGenerationConfigThenConfig) {
  const auto dir = nxd::testing::test_temp_dir("engine_eos");
  std::ofstream(dir / "config.json") << R"({"eos_token_id": 3})";
  EXPECT_EQ(read_eos_ids(dir), std::vector<int64_t>{3});
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [5, 7]})";
  EXPECT_EQ(read_eos_ids(dir), (std::vector<int64_t>{5, 7}));
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": "x"})";
  EXPECT_THROW(read_eos_ids(dir), ConfigError);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(read_eos_ids(dir).empty());
}
