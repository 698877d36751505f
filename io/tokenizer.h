#pragma once
// A Hugging Face `tokenizer.json` with a BPE model, giving the `tokenizers` library's ids for a
// text and the text for ids. Two kinds (docs/design/families.md):
//   byte-level BPE (GPT-2, GPT-NeoX / Pythia, Llama 3, Qwen2/Qwen2.5/Qwen3): the pre-tokenizer
//   holds
//     a ByteLevel step; words are UTF-8 bytes as GPT-2's byte characters;
//   SentencePiece-style BPE (Llama 2, Mistral, Mixtral): no ByteLevel step; words are Unicode
//     characters with spaces as U+2581 ("\u2581", from a Prepend + Replace normalizer or a
//     Metaspace pre-tokenizer), and with byte_fallback a character outside the vocabulary becomes
//     its UTF-8 bytes' <0xNN> tokens (or unk_token, fused with a neighbouring unk under fuse_unk).
//
// encode(text), as tokenizers' `encode(text, add_special_tokens=False)`:
//   1. added tokens (the file's "added_tokens", special and not) with normalized=false are split
//      out of the raw text first (the longest at a position wins; lstrip/rstrip eat the whitespace
//      beside them) and give their own ids;
//   2. each other section goes through the normalizer (none, NFC, Prepend, Replace of a string, or
//      a Sequence of them), then added tokens with normalized=true are split out of it;
//   3. the pre-tokenizer cuts it into words: ByteLevel (GPT-2's regex
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, with
//      add_prefix_space if set), a Sequence of Split (any regex, behavior Isolated, as Llama 3's
//      and Qwen2's) and ByteLevel without its regex, Metaspace (spaces to its replacement,
//      prepended on every section (always) or the text's first (first), split at each replacement
//      if split), or none; the regexes run on ICU's engine (Unicode properties);
//   4. BPE merges, in each word, the adjacent pair of lowest merge rank (leftmost first) until none
//      applies (ignore_merges: a word that is itself in the vocabulary is taken whole).
// The post-processor (a BOS token a TemplateProcessing would add) is not applied: training text
// is a stream. decode(ids) runs the file's decoder (ByteLevel; or Replace, ByteFallback, Fuse,
// Strip, Metaspace for the SentencePiece kind) with added tokens as their content, as the
// library's decode(ids, skip_special_tokens=False). Anything else (other models, normalizers,
// pre-tokenizers, decoders) is a ConfigError naming it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nxd::io {

class Tokenizer {
 public:
  // Reads a tokenizer.json; IoError if unreadable, ConfigError naming the file and the key for
  // anything unsupported.
  static Tokenizer from_file(const std::string& path);
  // UTF-8 bytes as ids (nxd-train's data without data.tokenizer): encode gives each byte of the
  // text, decode the bytes of ids below 256 (others ConfigError); vocab_size() 256, path() "bytes".
  static Tokenizer bytes();
  bool is_bytes() const { return p_ == nullptr; }
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int64_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& ids) const;  // unknown ids: ConfigError
  // A model's output: decode of the ids below vocab_size() (a model's vocabulary padded past the
  // tokenizer's gives ids it has no text for); `left_out` is how many ids were left out.
  std::string decode_model_output(const std::vector<int64_t>& ids, int64_t& left_out) const;
  // One more than the largest id (vocabulary and added tokens).
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& path() const { return path_; }
  std::string description() const;  // "byte-level BPE from F, 50277 ids, ... (GPT-2 regex)"

  // The parts of the file this tokenizer runs (tokenizer_parts.h), public for the loader.
  struct Parts;

 private:
  Tokenizer();
  // One section of text without raw added tokens: normalize, split normalized added tokens,
  // pre-tokenize, BPE. `first`: the section starts the text (Metaspace's prepend_scheme first).
  void encode_section(const std::string& text, bool first, std::vector<int64_t>& out) const;
  void encode_chunk(const std::string& text, bool first, std::vector<int64_t>& out) const;
  void bpe(const std::string& word, std::vector<int64_t>& out) const;

  std::string path_;
  std::unique_ptr<Parts> p_;
  int64_t vocab_size_ = 0;
};

}  // namespace nxd::io
