#pragma once
// nxd-train's token sources (data.path): all tokens of a byte-level text file or folder (vocab
// 256), or of a pre-tokenized binary file (uint16/uint32, little-endian), and the Dataset that
// cuts such a corpus into consecutive windows of seq_length + 1 tokens (stride seq_length).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nxd/trainer/data.h"

namespace nxd::train_app {

struct SkippedFile {
  std::string path;
  std::string reason;  // "binary (NUL byte at offset 12)", "invalid UTF-8 at offset 3", ...
};

struct Corpus {
  std::vector<uint32_t> tokens;
  int64_t vocab_size = 256;
  std::vector<std::string> files;    // read, in order
  std::vector<SkippedFile> skipped;  // not read, with the reason
};

// Whether `bytes` is text: no NUL byte and valid UTF-8. On false, `reason` says why and where.
bool is_text(const std::string& bytes, std::string* reason);

// Byte-level tokens of a text file, or of every text file under a folder (recursively, sorted by
// path; symlinks to files already read are skipped). Throws IoError if the path does not exist
// or a file cannot be read, ConfigError if no text was found.
Corpus load_text_corpus(const std::string& path);
// A binary file of little-endian uint16 or uint32 token ids (element_bytes 2 or 4). Throws
// IoError if unreadable, ConfigError if its size is not a multiple of the element or an id is
// >= vocab_size (naming the id, its position and the vocabulary size).
Corpus load_token_file(const std::string& path, int element_bytes, int64_t vocab_size);

class CorpusDataset : public trainer::Dataset {
 public:
  // Samples i = tokens [i*S, i*S + S]; throws ConfigError if there are fewer than S + 1 tokens.
  CorpusDataset(std::shared_ptr<const Corpus> corpus, int64_t seq_length,
                const std::string& what = "corpus");
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return s_; }
  void get(int64_t i, int64_t* out) const override;

 private:
  std::shared_ptr<const Corpus> corpus_;
  int64_t s_, n_;
};

}  // namespace nxd::train_app
