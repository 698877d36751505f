#pragma once
// SFT and DPO data as NxD Training reads it (data.train_dir / data.val_dir: a jsonl file, or a
// folder of *.jsonl files read in sorted order), tokenized, masked and laid out in rows.
//
// SFT rows are objects with "prompt" and "completion" strings, or chat rows with "messages" (a
// list of {"role", "content"} ending with the assistant's turn), rendered by the chat template of
// data.tokenizer's folder (io/chat_template.h): the prompt is the rendering of every message but
// the last with the generation prompt, the completion what the rendering of all of them adds to
// it (so only the last assistant turn is trained). The example's tokens are
// encode(prompt) followed by encode(completion); only completion tokens are trained: a target
// that is a prompt token (or padding, or past a document's end) is the ignore index -100. An
// example longer than seq_length keeps its first seq_length tokens; one whose prompt fills
// seq_length (nothing left to train) is dropped; both are counted.
//   padding (packing false): one example per row, padded with id 0 (targets -100)
//   packing (true): whole examples placed in order into rows of seq_length tokens (a new row when
//     the next does not fit), each a document: positions restart at 0, and the model attends
//     within documents (layers/packed_documents.h), so a packed row trains exactly what its
//     examples alone would.
// DPO and ORPO rows are objects with "prompt", "chosen" and "rejected" strings; a sample is two
// rows, prompt + chosen and prompt + rejected (the responses' tokens trained). When the prompt and
// the longer response exceed seq_length, the prompt is cut to max_prompt_length tokens
// (truncation_mode keep_start keeps its first tokens, keep_end its last) and then each response to
// what is left of seq_length (as TRL's DPO and ORPO trainers do). A row left with no trained
// token (an empty response, or a one-token response after an empty prompt) is refused naming its
// file and line.
// Every mistake is a ConfigError naming the file, the line and the key.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nxd/io/chat_template.h"
#include "nxd/trainer/data.h"

namespace nxd::train_app {

inline constexpr int64_t kIgnoreIndex = -100;

// text -> token ids (a tokenizer's, or UTF-8 bytes)
using TextEncoder = std::function<std::vector<int64_t>(const std::string&)>;

// One object per non-empty line of a jsonl file, or of every *.jsonl file under a folder, with
// where it came from ("train.jsonl:3"). At most max_records (< 0: all) from the start (NxD
// Training's dev_choose_samples). IoError for unreadable paths, ConfigError naming file and line
// for a line that is not a JSON object, ConfigError when no record is found.
struct JsonlRecord {
  nlohmann::json value;
  std::string where;
};
std::vector<JsonlRecord> read_jsonl(const std::string& path, const std::string& key,
                                    int64_t max_records = -1);

struct SftExample {
  std::vector<int64_t> prompt, completion;
};
struct PreferenceExample {
  std::vector<int64_t> prompt, chosen, rejected;
  std::string where;  // "train.jsonl:3" (messages name the row)
};
// The records' "prompt"/"completion" strings, or "messages" through `chat` (null: such a row is
// refused naming its file and line), encoded. ConfigError naming the file, line and key of a
// missing or non-string value, a messages list that does not end with the assistant, or a
// template whose full rendering does not start with the prompt's.
std::vector<SftExample> sft_examples(const std::vector<JsonlRecord>& records,
                                     const TextEncoder& encode,
                                     const io::ChatTemplate* chat = nullptr);
// Whether any record is a chat row (has "messages").
bool has_chat_rows(const std::vector<JsonlRecord>& records);
std::vector<PreferenceExample> preference_examples(const std::vector<JsonlRecord>& records,
                                                   const TextEncoder& encode);

// What a layout did with its examples (the run prints it; tests check it).
struct SftStats {
  int64_t examples = 0, rows = 0, truncated = 0, dropped = 0;
  int64_t real_tokens = 0;     // tokens of examples in the rows (the rest of the slots: padding)
  int64_t trained_tokens = 0;  // targets that are completion tokens
  int64_t masked_tokens = 0;   // real tokens whose target is ignored (prompt, document ends)
  int64_t slots() const { return rows * seq_length; }
  int64_t seq_length = 0;
};

enum class SftLayout { padding, packing };

class SftDataset : public trainer::Dataset {
 public:
  SftDataset(const std::vector<SftExample>& examples, int64_t seq_length, SftLayout layout);
  int64_t size() const override { return static_cast<int64_t>(row_docs_.size()); }
  int64_t seq_length() const override { return s_; }
  void get(int64_t i, int64_t* out) const override;  // the row's ids and a final 0
  bool packed() const override { return layout_ == SftLayout::packing; }
  void get_rows(int64_t i, int64_t* ids, int64_t* targets, int64_t* positions) const override;
  const SftStats& stats() const { return stats_; }

 private:
  struct Doc {
    std::vector<int64_t> tokens;
    int64_t prompt = 0;  // tokens[0, prompt) are the prompt's
  };
  int64_t s_;
  SftLayout layout_;
  std::vector<Doc> docs_;
  std::vector<std::vector<int64_t>> row_docs_;  // the documents of each row, in order
  SftStats stats_;
};

struct PreferenceOptions {
  int64_t seq_length = 0;
  int64_t max_prompt_length = 0;
  enum class Truncation { keep_start, keep_end } truncation = Truncation::keep_start;
};

class PreferenceDataset : public trainer::Dataset {
 public:
  PreferenceDataset(const std::vector<PreferenceExample>& examples, const PreferenceOptions& o);
  int64_t size() const override { return static_cast<int64_t>(pairs_.size()); }
  int64_t seq_length() const override { return o_.seq_length; }
  void get(int64_t i, int64_t* out) const override;  // the chosen row's ids and a final 0
  int64_t rows_per_sample() const override { return 2; }
  void get_rows(int64_t i, int64_t* ids, int64_t* targets, int64_t* positions) const override;
  int64_t truncated() const { return truncated_; }

 private:
  struct Row {
    std::vector<int64_t> tokens;
    int64_t prompt = 0;
  };
  PreferenceOptions o_;
  std::vector<std::pair<Row, Row>> pairs_;  // chosen, rejected
  int64_t truncated_ = 0;
};

}  // namespace nxd::train_app
