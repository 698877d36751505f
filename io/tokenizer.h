#pragma once
// A Hugging Face `tokenizer.json` with a byte-level BPE model (GPT-2, GPT-NeoX / Pythia, Llama 3,
// and others built the same way), giving the `tokenizers` library's ids for a text and the text
// for ids.
//
// encode(text), as tokenizers' `encode(text, add_special_tokens=False)`:
//   1. added tokens (the file's "added_tokens": special and not) found in the text are split out
//      first and give their own ids (the longest one at a position wins);
//   2. the pre-tokenizer cuts the rest into words: ByteLevel (GPT-2's regex
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, with
//      add_prefix_space if set), or a Sequence of Split (any regex, behavior Isolated, as Llama
//      3's) and ByteLevel without its regex; the regexes run on ICU's engine (Unicode properties);
//   3. each word's UTF-8 bytes become GPT-2's byte-level characters (bytes_to_unicode), and BPE
//      merges the adjacent pair of lowest merge rank until none applies (ignore_merges: a word
//      that is itself in the vocabulary is taken whole, as Llama 3's file says);
//   4. each piece's id from the vocabulary (a piece not in it is an error naming it).
// The post-processor (a BOS token a TemplateProcessing would add) is not applied: training text
// is a stream. decode(ids) maps pieces back to bytes (added tokens as their content). Normalizers
// other than none are refused by name, as are models other than BPE and byte_fallback.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace nxd::io {

class Tokenizer {
 public:
  // Reads a tokenizer.json; IoError if unreadable, ConfigError naming the file and the key for
  // anything unsupported.
  static Tokenizer from_file(const std::string& path);
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
  std::string description() const;  // "byte-level BPE, 50,277 ids (gpt2 pre-tokenizer)"

 private:
  Tokenizer() = default;
  void encode_chunk(const std::string& text, std::vector<int64_t>& out) const;
  void bpe(const std::string& word, std::vector<int64_t>& out) const;

  struct Regexes;
  std::string path_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> pieces_;                      // id -> piece ("" if none)
  std::unordered_map<std::string, int64_t> merge_rank_;  // "a b" -> rank
  std::vector<std::pair<std::string, int64_t>> added_;   // content, id (longest first)
  std::vector<bool> is_added_;
  std::unique_ptr<Regexes> regexes_;  // the pre-tokenizer's splits, in order
  std::string pre_name_;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  int64_t vocab_size_ = 0;
};

}  // namespace nxd::io
