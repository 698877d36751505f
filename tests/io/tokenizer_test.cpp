// nxd's BPE tokenizer against the ids of Hugging Face's tokenizers (the reference ids in
// fixtures/tokenizer/reference_ids.json were computed once by @huggingface/tokenizers with
// make_reference.mjs from the tokenizer.json files there, written by make_tokenizers.py: byte-level
// with GPT-2's, GPT-NeoX's, Llama 3's and Qwen2's pre-tokenizers (Qwen2: NFC), SentencePiece-style
// with byte_fallback as Llama 2 / Mixtral (Prepend + Replace normalizer) and Mistral (Metaspace,
// prepend_scheme first, lstrip/rstrip added tokens) write theirs), and decode as the library does.
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
  for (const char* name : {"gpt2", "neox", "llama3", "qwen2", "llama2", "mistral"}) {
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

// Bytes (nxd-train without data.tokenizer): a text's UTF-8 bytes are its ids and back; ids past
// 255 are left out of a model's output and refused by decode.
TEST(Tokenizer, BytesAreTheirOwnIds) {
  const nxd::io::Tokenizer t = nxd::io::Tokenizer::bytes();
  EXPECT_TRUE(t.is_bytes());
  EXPECT_EQ(t.vocab_size(), 256);
  const std::string text = "caf\xc3\xa9 \x01\xff!";
  const std::vector<int64_t> ids = t.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[3], 0xc3);
  EXPECT_EQ(ids[7], 0xff);
  EXPECT_EQ(t.decode(ids), text);
  std::vector<int64_t> model = ids;
  model.push_back(256);
  int64_t left_out = -1;
  EXPECT_EQ(t.decode_model_output(model, left_out), text);
  EXPECT_EQ(left_out, 1);
  EXPECT_THROW(t.decode(model), nxd::ConfigError);
  EXPECT_FALSE(nxd::io::Tokenizer::from_file(kDir + "/gpt2.tokenizer.json").is_bytes());
}

TEST(Tokenizer, TheThreePreTokenizersDiffer) {
  const std::string text = "I'LL pay 12345 now";
  const auto a = nxd::io::Tokenizer::from_file(kDir + "/gpt2.tokenizer.json").encode(text);
  const auto b = nxd::io::Tokenizer::from_file(kDir + "/neox.tokenizer.json").encode(text);
  const auto c = nxd::io::Tokenizer::from_file(kDir + "/llama3.tokenizer.json").encode(text);
  EXPECT_NE(a, b);  // add_prefix_space
  EXPECT_NE(a, c);  // digits in threes, case-insensitive contractions
}

// What the SentencePiece kind's parts do, on its own fixture: byte_fallback spells a character
// outside the vocabulary in <0xNN> tokens and decodes it back, the Prepend normalizer starts every
// section between added tokens with U+2581 (Llama 2) while Metaspace's prepend_scheme first starts
// only the text's first (Mistral), and unk_token stands for a character without byte tokens.
TEST(Tokenizer, SentencePieceByteFallbackAndPrependSchemes) {
  const auto l2 = nxd::io::Tokenizer::from_file(kDir + "/llama2.tokenizer.json");
  const auto mi = nxd::io::Tokenizer::from_file(kDir + "/mistral.tokenizer.json");
  const std::vector<int64_t> snow = l2.encode("\u2603");  // not in the vocabulary: 3 bytes
  ASSERT_EQ(snow.size(), 4u);                             // U+2581, then E2 98 83
  EXPECT_EQ(snow[1], 3 + 0xE2);                           // <0xE2> (bytes start at id 3)
  EXPECT_EQ(l2.decode(snow), "\u2603");
  // a run of byte tokens that is not UTF-8: one U+FFFD per byte, as tokenizers' ByteFallback
  EXPECT_EQ(l2.decode({3 + 0xE2, 3 + 0x41}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  const auto a = l2.encode("x</s>y"), b = mi.encode("x</s>y");
  EXPECT_NE(a, b);  // Llama 2's Prepend gives "y" its U+2581, Mistral's first scheme does not
  EXPECT_EQ(l2.decode(a), "x</s> y");
  EXPECT_EQ(mi.decode(b), "x</s>y");
  EXPECT_NE(l2.description().find("SentencePiece-style BPE"), std::string::npos);
  // without byte tokens the character is unk_token (0), consecutive ones fused
  const auto d = nxd::testing::test_temp_dir("nxd_tokenizer_sp_");
  json j = json::parse(nxd::testing::slurp(kDir + "/llama2.tokenizer.json"));
  j["model"]["byte_fallback"] = false;
  std::ofstream(d / "t.json") << j.dump();
  const auto u = nxd::io::Tokenizer::from_file((d / "t.json").string());
  const auto ids = u.encode("\u2603\u2603");
  EXPECT_EQ(ids, (std::vector<int64_t>{snow[0], 0}));
  // a Metaspace decoder (tokenizers' rule: the replacement is a space, and dropped from the first
  // token when a prefix was prepended), as newer Mistral files write it
  json m = json::parse(nxd::testing::slurp(kDir + "/mistral.tokenizer.json"));
  m["decoder"] = {{"type", "Metaspace"},
                  {"replacement", "\u2581"},
                  {"prepend_scheme", "first"},
                  {"split", false}};
  std::ofstream(d / "m.json") << m.dump();
  const auto ms = nxd::io::Tokenizer::from_file((d / "m.json").string());
  EXPECT_EQ(ms.encode("Hello world, the end"), mi.encode("Hello world, the end"));
  EXPECT_EQ(ms.decode(ms.encode("Hello world, the end")), "Hello world, the end");
}

TEST(Tokenizer, UnsupportedFilesAreRefusedByName) {
  const auto d = nxd::testing::test_temp_dir("nxd_tokenizer_");
  json base = json::parse(nxd::testing::slurp(kDir + "/gpt2.tokenizer.json"));
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"normalizer", {{"type", "NFKC"}}}}, "normalizer"},
      {{{"model", {{"type", "WordPiece"}}}}, "model type 'WordPiece'"},
      {{{"model", {{"byte_fallback", true}}}}, "byte_fallback"},
      {{{"pre_tokenizer", {{"type", "Whitespace"}}}}, "pre-tokenizer 'Whitespace'"},
      {{{"decoder", {{"type", "WordPiece"}}}}, "decoder 'WordPiece'"},
      {{{"model", {{"continuing_subword_prefix", "##"}}}}, "continuing_subword_prefix"},
      {{{"model", {{"merges", {"\u0120 nonexistent"}}}}},
       "names a piece that is not in the vocabulary"},
      {{{"normalizer", {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}}}},
       "normalizer Replace with pattern"},
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
