#pragma once
// The parts of a tokenizer.json that io::Tokenizer runs (internal to tokenizer.cpp,
// tokenizer_decode.cpp and tokenizer_load.cpp; tokenizer.h says what each does).
#include <unicode/regex.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "nxd/io/tokenizer.h"

namespace nxd::io {

struct Tokenizer::Parts {
  enum class Kind { byte_level, sentencepiece };
  struct Added {
    std::string content;
    int64_t id = 0;
    bool lstrip = false, rstrip = false, normalized = false;
  };
  struct NormStep {
    enum class Type { nfc, prepend, replace } type;
    std::string from, to;  // prepend: to; replace: from -> to
  };
  enum class Prepend { always, first, never };
  struct DecodeStep {
    enum class Type { replace, byte_fallback, fuse, strip, metaspace } type;
    std::string from, to;         // replace; metaspace: from = the replacement
    int64_t start = 0, stop = 0;  // strip: characters `to` cut at the start / end of each token
    Prepend prepend = Prepend::never;  // metaspace
  };

  Kind kind = Kind::byte_level;
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> pieces;  // id -> piece ("" if none)
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> merges;
  std::vector<bool> in_merge;  // id -> whether it is the left or right piece of some merge
  std::vector<Added> added;    // longest first
  std::vector<bool> is_added;
  std::vector<NormStep> normalizer;
  // byte-level: the pre-tokenizer's regex splits, in order
  std::vector<std::unique_ptr<icu::RegexPattern>> splits;
  std::vector<std::string> patterns;
  std::string pre_name;
  bool add_prefix_space = false;
  bool ignore_merges = false;
  // SentencePiece kind: the Metaspace pre-tokenizer (metaspace empty: none), the model's fallbacks
  std::string metaspace;
  Prepend prepend = Prepend::always;
  bool metaspace_split = false;
  bool byte_fallback = false, fuse_unk = false;
  int64_t unk_id = -1;
  std::vector<DecodeStep> decoder;
  // Every piece of `in` cut by split i (matches and the text between them, in order: tokenizers'
  // Split with behavior Isolated). ConfigError naming `path` when the regex runs away.
  void split(const std::string& path, size_t i, const std::string& in,
             std::vector<std::string>& out) const;
};

// Loads the parts of the parsed tokenizer.json `j` (ConfigError naming `path` and the key for
// anything unsupported); returns the largest id + 1.
int64_t load_tokenizer_parts(const nlohmann::json& j, const std::string& path, Tokenizer::Parts& p);

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to 256 + n.
struct ByteChars {
  std::string of_byte[256];
  std::unordered_map<std::string, unsigned char> byte_of;
  ByteChars();
};
const ByteChars& byte_chars();

// The length of the UTF-8 sequence that starts with byte c (1 to 4).
inline size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

// Replaces every `from` in s by `to` (nothing when `from` is empty).
void replace_all(std::string& s, const std::string& from, const std::string& to);

}  // namespace nxd::io
