#pragma once
// A synthetic byte-level BPE tokenizer.json (GPT-2 style) of exactly `vocab` tokens, for the
// benchmarks' random-weight models: llama.cpp loads a GGUF file only with a vocabulary
// (tokenizer.ggml.*), and the servers stream text, so every id must decode to text. Ids 0-255 are
// the 256 bytes (GPT-2's byte-to-character map), then pairs and then triples of the 94 printable
// ASCII characters other than space, each the merge of its first part and its last character: every
// id past 255 decodes to 2 or 3 printable ASCII characters. The benchmarks send token ids, so what
// the tokenizer makes of text does not matter; only that both servers detokenize the same
// vocabulary.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace nxd::bench {

// GPT-2's printable character for byte b (bytes_to_unicode), UTF-8.
inline std::string byte_level_char(int b) {
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  int cp = b;
  if (!printable) {
    int n = 0;  // rank of b among the non-printable bytes
    for (int i = 0; i < b; ++i)
      if (!((i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// vocab >= 256 and at most 256 + 94^2 + 94^3 tokens.
inline nlohmann::json synthetic_tokenizer_json(int64_t vocab) {
  using nlohmann::json;
  json v = json::object();
  json merges = json::array();
  for (int b = 0; b < 256; ++b) v[byte_level_char(b)] = b;
  int64_t id = 256;
  const auto ch = [](int i) { return std::string(1, static_cast<char>(33 + i)); };
  for (int a = 0; a < 94 && id < vocab; ++a)
    for (int b = 0; b < 94 && id < vocab; ++b, ++id) {
      v[ch(a) + ch(b)] = id;
      merges.push_back(ch(a) + " " + ch(b));
    }
  for (int a = 0; a < 94 * 94 && id < vocab; ++a)
    for (int c = 0; c < 94 && id < vocab; ++c, ++id) {
      const std::string pair = ch(a / 94) + ch(a % 94);
      v[pair + ch(c)] = id;
      merges.push_back(pair + " " + ch(c));
    }
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", v},
            {"merges", merges}}}};
}

}  // namespace nxd::bench
