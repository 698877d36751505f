// nxd's byte-level BPE tokenizer against the ids of Hugging Face's tokenizers (the reference ids in
// fixtures/tokenizer/reference_ids.json were computed once by @huggingface/tokenizers with
// make_reference.mjs from the three tokenizer.json files there: GPT-2's, GPT-NeoX's and Llama 3's
// pre-tokenizers), and decode as the library does.
#include "nxd/io/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "nxd/runtime/error.h"
#include "support/files.h"

namespace {
using json = nlohmann::json;
const std::string kDir = NXD_TOKENIZER_FIXTURES;

TEST(Tokenizer, IdsAndDecodingEqualTheTokenizersLibrarys) {
  const json ref = json::parse(nxd::testing::slurp(kDir + "/reference_ids.json"));
  for (const char* name : {"gpt2", "neox", "llama3"}) {
    SCOPED_TRACE(name);
    const nxd::io::Tokenizer t =
        nxd::io::Tokenizer::from_file(kDir + "/" + name + ".tokenizer.json");
    ASSERT_TRUE(ref.contains(name));
    int64_t n = 0;
    for (const auto& c : ref[name]) {
      const std::string text = c.at("text");
      const auto want = c.at("ids").get<std::vector<int64_t>>();
      EXPECT_EQ(t.encode(text), want) << "text: " << text;
      // the library's decode (with add_prefix_space it keeps the space it added)
      EXPECT_EQ(t.decode(want), c.at("decoded").get<std::string>());
      n += static_cast<int64_t>(want.size());
    }
    EXPECT_GT(n, 300) << "the corpus gives enough ids to mean something";
  }
}

// A model's output over a vocabulary padded past the tokenizer's: the ids past it are left out
// of the text and counted (nxd-train's sample, nxd-generate's text).
TEST(Tokenizer, ModelOutputLeavesOutIdsPastTheVocabulary) {
  const nxd::io::Tokenizer t = nxd::io::Tokenizer::from_file(kDir + "/gpt2.tokenizer.json");
  const std::vector<int64_t> known = t.encode("Hello world");
  std::vector<int64_t> ids = known;
  ids.insert(ids.begin() + 1, t.vocab_size());
  ids.push_back(t.vocab_size() + 2);
  int64_t left_out = -1;
  EXPECT_EQ(t.decode_model_output(ids, left_out), "Hello world");
  EXPECT_EQ(left_out, 2);
  EXPECT_EQ(t.decode_model_output(known, left_out), "Hello world");
  EXPECT_EQ(left_out, 0);
  EXPECT_THROW(t.decode(ids), nxd::ConfigError);
}

TEST(Tokenizer, TheThreePreTokenizersDiffer) {
  const std::string text = "I'LL pay 12345 now";
  const auto a = nxd::io::Tokenizer::from_file(kDir + "/gpt2.tokenizer.json").encode(text);
  const auto b = nxd::io::Tokenizer::from_file(kDir + "/neox.tokenizer.json").encode(text);
  const auto c = nxd::io::Tokenizer::from_file(kDir + "/llama3.tokenizer.json").encode(text);
  EXPECT_NE(a, b);  // add_prefix_space
  EXPECT_NE(a, c);  // digits in threes, case-insensitive contractions
}

TEST(Tokenizer, UnsupportedFilesAreRefusedByName) {
  const auto d = nxd::testing::test_temp_dir("nxd_tokenizer_");
  json base = json::parse(nxd::testing::slurp(kDir + "/gpt2.tokenizer.json"));
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"normalizer", {{"type", "NFKC"}}}}, "normalizer"},
      {{{"model", {{"type", "WordPiece"}}}}, "model type 'WordPiece'"},
      {{{"model", {{"byte_fallback", true}}}}, "byte_fallback"},
      {{{"pre_tokenizer", {{"type", "Whitespace"}}}}, "pre-tokenizer 'Whitespace'"},
  };
  for (const auto& [patch, want] : cases) {
    json j = base;
    j.merge_patch(patch);
    std::ofstream(d / "t.json") << j.dump();
    try {
      nxd::io::Tokenizer::from_file((d / "t.json").string());
      ADD_FAILURE() << "accepted " << patch.dump();
    } catch (const nxd::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  const nxd::io::Tokenizer t = nxd::io::Tokenizer::from_file(kDir + "/gpt2.tokenizer.json");
  try {
    t.decode({t.vocab_size()});
    ADD_FAILURE();
  } catch (const nxd::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is not in the vocabulary"), std::string::npos);
  }
}

}  // namespace
