// Drives the configuration fuzz target (fuzz_config.cpp) without libFuzzer: deterministic byte
// mutations of valid YAML and JSON configurations, and of hostile seeds (deep nesting, alias
// chains, duplicate keys), each read as YAML and as JSON, must resolve or throw a UserError.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

extern "C" int nxd_fuzz_config(const uint8_t* data, size_t size);

namespace {

void mutate(std::string& s, std::mt19937_64& g) {
  static const char kTokens[][8] = {"[",    "]", "{",  "}",  ":", ",",  "&a", "*a",
                                    "\n  ", "'", "\"", "- ", "#", "!!", "|",  "9e999"};
  const int edits = 1 + static_cast<int>(g() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = g() % s.size();
    switch (g() % 5) {
      case 0:
        s[at] = static_cast<char>(s[at] ^ (1 << (g() % 8)));
        break;
      case 1:
        s[at] = static_cast<char>(g());
        break;
      case 2:
        s.resize(at);
        break;
      case 3:
        s.insert(at, kTokens[g() % (sizeof kTokens / sizeof kTokens[0])]);
        break;
      default:
        s.erase(at, 1 + g() % 16);
    }
  }
}

TEST(FuzzConfig, MutationsResolveOrThrowUserError) {
  const std::vector<std::string> seeds = {
      "seed: 7\ntrainer: {max_steps: 8, log_every_n_steps: 1}\n"
      "data: {kind: random, seq_length: 32, micro_batch_size: 2, global_batch_size: 8}\n"
      "model: {num_layers: 1, hidden_size: 32, num_attention_heads: 2, "
      "optim: {lr: 1.0e-2, betas: [0.9, 0.95], sched: {max_steps: 8}}}\n",
      R"({"seed": 7, "trainer": {"max_steps": 8}, "model": {"hidden_size": 32,
          "num_attention_heads": 2, "optim": {"betas": [0.9, 0.95]}}, "data": {"kind": "random"}})",
      "a: &a [1, 1]\nb: &b [*a, *a, *a]\nc: &c [*b, *b, *b]\nmodel: {hidden_size: *c}\n",
      "model.hidden_size: 32\nmodel: {num_layers: 2}\nseed: 1\n" + std::string(60, '[') +
          std::string(60, ']'),
  };
  std::mt19937_64 g(11);
  int resolved = 0, inputs = 0;
  for (const auto& seed : seeds) {
    resolved += nxd_fuzz_config(reinterpret_cast<const uint8_t*>(seed.data()), seed.size());
    for (int i = 0; i < 2000; ++i, ++inputs) {
      std::string s = seed;
      mutate(s, g);
      // a crash or an exception other than UserError ends the test here
      resolved += nxd_fuzz_config(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    }
  }
  EXPECT_EQ(inputs, 8000);
  EXPECT_GT(resolved, 0);
  std::printf("    %d of %d (x2: YAML and JSON) mutated configurations resolved\n", resolved,
              inputs);
}

}  // namespace
