#include "nxd/train_app/alignment_data.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "nxd/io/bounded_read.h"
#include "nxd/io/tokenizer.h"
#include "nxd/runtime/error.h"
#include "nxd/train_app/lm_module.h"

namespace fs = std::filesystem;

namespace nxd::train_app {

namespace {

constexpr int64_t kMaxJsonlBytes = int64_t{4} << 30;

std::vector<std::string> jsonl_files(const std::string& path, const std::string& key) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw IoError(str("[data] ", key, " '", io::shorten(path, io::ReadLimits::max_shown_path),
                      "' does not exist"));
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(path, ec))
    if (e.is_regular_file() && e.path().extension() == ".jsonl") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw ConfigError(str("[data] ", key, " folder '", path, "' holds no *.jsonl file"));
  return files;
}

// record[name] as a string, or a ConfigError naming the record's file and line and the key.
const std::string& field(const JsonlRecord& r, const char* name) {
  const auto it = r.value.find(name);
  if (it == r.value.end()) {
    if (r.value.contains("messages"))
      throw ConfigError(str("[data] ", r.where, ": key 'messages' (a chat row) where '", name,
                            "' is expected (DPO rows are 'prompt', 'chosen', 'rejected' strings)"));
    throw ConfigError(str("[data] ", r.where, ": missing key '", name, "' (the row has ",
                          io::shorten(r.value.dump()), ")"));
  }
  if (!it->is_string())
    throw ConfigError(str("[data] ", r.where, ": key '", name, "' must be a string, got ",
                          io::shorten(it->dump())));
  return it->get_ref<const std::string&>();
}

}  // namespace

std::vector<JsonlRecord> read_jsonl(const std::string& path, const std::string& key,
                                    int64_t max_records) {
  std::vector<JsonlRecord> out;
  for (const std::string& file : jsonl_files(path, key)) {
    const std::string text = io::read_regular_file(file, key, kMaxJsonlBytes, "data");
    size_t begin = 0;
    for (int64_t line = 1; begin < text.size(); ++line) {
      if (max_records >= 0 && static_cast<int64_t>(out.size()) >= max_records) return out;
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      const std::string s = text.substr(begin, end - begin);
      begin = end + 1;
      if (s.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = str(file, ":", line);
      io::check_flow_depth(s, /*yaml=*/false, where, "data");
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(s);
      } catch (const nlohmann::json::exception& e) {
        throw ConfigError(str("[data] ", where, ": not JSON: ", e.what()));
      }
      if (!j.is_object())
        throw ConfigError(
            str("[data] ", where, ": a row must be a JSON object, got ", io::shorten(j.dump())));
      out.push_back({std::move(j), where});
    }
  }
  if (out.empty()) throw ConfigError(str("[data] ", key, " '", path, "' holds no rows"));
  return out;
}

bool has_chat_rows(const std::vector<JsonlRecord>& records) {
  for (const auto& r : records)
    if (r.value.contains("messages")) return true;
  return false;
}

namespace {
// A chat row's prompt and completion text (see sft_examples).
std::pair<std::string, std::string> chat_texts(const JsonlRecord& r, const io::ChatTemplate& chat) {
  const nlohmann::json& m = r.value.at("messages");
  auto bad = [&](const std::string& what) {
    return ConfigError(str("[data] ", r.where, ": key 'messages' ", what));
  };
  if (!m.is_array() || m.size() < 2) throw bad("must be a list of at least two messages");
  for (const auto& x : m)
    if (!x.is_object() || !x.contains("role") || !x["role"].is_string() || !x.contains("content") ||
        !x["content"].is_string())
      throw bad(str("holds ", io::shorten(x.dump()),
                    ": every message is {\"role\": string, \"content\": string}"));
  if (m.back()["role"] != "assistant")
    throw bad(str("must end with the assistant's turn (the completion), ends with role ",
                  m.back()["role"].dump()));
  const nlohmann::json head(m.begin(), m.end() - 1);
  std::string prompt, full;
  try {
    prompt = chat.render(head, {.generation_prompt = io::GenerationPrompt::add});
    full = chat.render(m, {.generation_prompt = io::GenerationPrompt::omit});
  } catch (const InvalidArgument& e) {
    throw bad(str("cannot be rendered by the chat template of ", chat.origin(), ": ", e.what()));
  }
  if (full.compare(0, prompt.size(), prompt) != 0)
    throw bad(str("renders (", chat.origin(),
                  ") to a conversation that does not start with its prompt's rendering: the "
                  "completion cannot be separated"));
  return {prompt, full.substr(prompt.size())};
}
}  // namespace

std::vector<SftExample> sft_examples(const std::vector<JsonlRecord>& records,
                                     const TextEncoder& encode, const io::ChatTemplate* chat) {
  std::vector<SftExample> out;
  out.reserve(records.size());
  for (const auto& r : records) {
    if (r.value.contains("messages") && !r.value.contains("prompt")) {
      if (!chat)
        throw ConfigError(str("[data] ", r.where, ": key 'messages' (a chat row) needs a chat ",
                              "template: set data.tokenizer to the tokenizer.json of a folder "
                              "with chat_template.jinja or tokenizer_config.json's chat_template"));
      const auto [prompt, completion] = chat_texts(r, *chat);
      out.push_back({encode(prompt), encode(completion)});
      continue;
    }
    out.push_back({encode(field(r, "prompt")), encode(field(r, "completion"))});
  }
  return out;
}

std::vector<PreferenceExample> preference_examples(const std::vector<JsonlRecord>& records,
                                                   const TextEncoder& encode) {
  std::vector<PreferenceExample> out;
  out.reserve(records.size());
  for (const auto& r : records)
    out.push_back({encode(field(r, "prompt")), encode(field(r, "chosen")),
                   encode(field(r, "rejected")), r.where});
  return out;
}

// ---- SFT ----

SftDataset::SftDataset(const std::vector<SftExample>& examples, int64_t seq_length,
                       SftLayout layout)
    : s_(seq_length), layout_(layout) {
  NXD_CHECK(seq_length > 0, "[SftDataset] seq_length must be positive, got ", seq_length);
  stats_.seq_length = seq_length;
  stats_.examples = static_cast<int64_t>(examples.size());
  for (const auto& e : examples) {
    Doc d;
    d.prompt = static_cast<int64_t>(e.prompt.size());
    d.tokens = e.prompt;
    d.tokens.insert(d.tokens.end(), e.completion.begin(), e.completion.end());
    if (static_cast<int64_t>(d.tokens.size()) > s_) {
      d.tokens.resize(static_cast<size_t>(s_));
      ++stats_.truncated;
    }
    const int64_t n = static_cast<int64_t>(d.tokens.size());
    // a target j + 1 is trained when it is a completion token: j + 1 in [max(prompt, 1), n)
    const int64_t trained = n - std::max<int64_t>(d.prompt, 1);
    if (trained <= 0) {
      ++stats_.dropped;
      continue;
    }
    stats_.real_tokens += n;
    stats_.trained_tokens += trained;
    stats_.masked_tokens += n - trained;
    docs_.push_back(std::move(d));
  }
  int64_t fill = s_;
  for (size_t k = 0; k < docs_.size(); ++k) {
    const int64_t n = static_cast<int64_t>(docs_[k].tokens.size());
    if (layout_ == SftLayout::padding || fill + n > s_) {
      row_docs_.emplace_back();
      fill = 0;
    }
    row_docs_.back().push_back(static_cast<int64_t>(k));
    fill += n;
  }
  stats_.rows = static_cast<int64_t>(row_docs_.size());
  if (row_docs_.empty())
    throw ConfigError(str("[data] none of the ", examples.size(),
                          " SFT examples has a completion token within data.seq_length=", s_));
}

void SftDataset::get_rows(int64_t i, int64_t* ids, int64_t* targets, int64_t* positions) const {
  int64_t at = 0;
  for (int64_t k : row_docs_.at(static_cast<size_t>(i))) {
    const Doc& d = docs_[static_cast<size_t>(k)];
    const int64_t n = static_cast<int64_t>(d.tokens.size());
    for (int64_t j = 0; j < n; ++j) {
      ids[at + j] = d.tokens[static_cast<size_t>(j)];
      targets[at + j] =
          j + 1 < n && j + 1 >= d.prompt ? d.tokens[static_cast<size_t>(j + 1)] : kIgnoreIndex;
      positions[at + j] = j;
    }
    at += n;
  }
  // padding: id 0, nothing trained; one more document (packing) or the last one's continuation
  for (int64_t j = at; j < s_; ++j) {
    ids[j] = 0;
    targets[j] = kIgnoreIndex;
    positions[j] = layout_ == SftLayout::packing ? j - at : j;
  }
}

void SftDataset::get(int64_t i, int64_t* out) const {
  std::vector<int64_t> t(static_cast<size_t>(s_)), p(static_cast<size_t>(s_));
  get_rows(i, out, t.data(), p.data());
  out[s_] = 0;
}

// ---- DPO ----

PreferenceDataset::PreferenceDataset(const std::vector<PreferenceExample>& examples,
                                     const PreferenceOptions& o)
    : o_(o) {
  NXD_CHECK(o.seq_length > 1 && o.max_prompt_length > 0 && o.max_prompt_length < o.seq_length,
            "[PreferenceDataset] needs 0 < max_prompt_length (", o.max_prompt_length,
            ") < seq_length (", o.seq_length, ")");
  for (const auto& e : examples) {
    std::vector<int64_t> prompt = e.prompt;
    const int64_t longer = static_cast<int64_t>(std::max(e.chosen.size(), e.rejected.size()));
    bool cut = false;
    if (static_cast<int64_t>(prompt.size()) + longer > o.seq_length &&
        static_cast<int64_t>(prompt.size()) > o.max_prompt_length) {
      cut = true;
      if (o.truncation == PreferenceOptions::Truncation::keep_end)
        prompt.erase(prompt.begin(), prompt.end() - o.max_prompt_length);
      else
        prompt.resize(static_cast<size_t>(o.max_prompt_length));
    }
    auto row = [&](const std::vector<int64_t>& response, const char* which) {
      Row r{prompt, static_cast<int64_t>(prompt.size())};
      r.tokens.insert(r.tokens.end(), response.begin(), response.end());
      if (static_cast<int64_t>(r.tokens.size()) > o.seq_length) {
        r.tokens.resize(static_cast<size_t>(o.seq_length));
        cut = true;
      }
      // trained targets: the response tokens after position max(prompt, 1)
      const int64_t trained =
          static_cast<int64_t>(r.tokens.size()) - std::max<int64_t>(r.prompt, 1);
      if (trained < 1)
        throw ConfigError(
            str("[data] ", e.where.empty() ? "a row" : e.where, ": the ", which,
                " response has no token to train within data.seq_length=", o.seq_length, " (",
                response.size(), " response tokens after ", prompt.size(), " prompt tokens)"));
      return r;
    };
    pairs_.emplace_back(row(e.chosen, "chosen"), row(e.rejected, "rejected"));
    truncated_ += cut;
  }
  if (pairs_.empty()) throw ConfigError("[data] no DPO pairs");
}

void PreferenceDataset::get_rows(int64_t i, int64_t* ids, int64_t* targets,
                                 int64_t* positions) const {
  const auto& [chosen, rejected] = pairs_.at(static_cast<size_t>(i));
  const int64_t s = o_.seq_length;
  for (const Row* r : {&chosen, &rejected}) {
    const int64_t n = static_cast<int64_t>(r->tokens.size());
    for (int64_t j = 0; j < s; ++j) {
      ids[j] = j < n ? r->tokens[static_cast<size_t>(j)] : 0;
      targets[j] = j + 1 < n && j + 1 >= std::max<int64_t>(r->prompt, 1)
                       ? r->tokens[static_cast<size_t>(j + 1)]
                       : kIgnoreIndex;
      positions[j] = j;
    }
    ids += s, targets += s, positions += s;
  }
}

void PreferenceDataset::get(int64_t i, int64_t* out) const {
  std::vector<int64_t> rows(static_cast<size_t>(6 * o_.seq_length));
  get_rows(i, rows.data(), rows.data() + 2 * o_.seq_length, rows.data() + 4 * o_.seq_length);
  std::copy(rows.begin(), rows.begin() + o_.seq_length, out);
  out[o_.seq_length] = 0;
}

// ---- nxd-train's data from data.train_dir ----

namespace {

std::string percent(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * f);
  return b;
}

std::string sft_line(const char* what, const SftStats& s, SftLayout layout) {
  return str("sft ", what, ": ", s.examples, " examples in ", s.rows, " rows of ", s.seq_length,
             " tokens (", layout == SftLayout::packing ? "packed" : "padded", ": ", s.real_tokens,
             " example tokens, ", percent(double(s.real_tokens) / double(s.slots())),
             " of the slots); trained (completion) tokens ", s.trained_tokens,
             ", masked (prompt, document ends) ", s.masked_tokens,
             s.truncated ? str(", ", s.truncated, " truncated to seq_length") : std::string(),
             s.dropped ? str(", ", s.dropped, " dropped (no completion token within seq_length)")
                       : std::string());
}

}  // namespace

TrainData build_alignment_data(const TrainConfig& cfg) {
  const AlignmentSection& a = cfg.alignment;
  TrainData td;
  TextEncoder encode = [](const std::string& t) {
    return std::vector<int64_t>(reinterpret_cast<const unsigned char*>(t.data()),
                                reinterpret_cast<const unsigned char*>(t.data()) + t.size());
  };
  if (!cfg.data.tokenizer.empty()) {
    auto tok = std::make_shared<const io::Tokenizer>(io::Tokenizer::from_file(cfg.data.tokenizer));
    if (tok->vocab_size() > cfg.model.vocab_size)
      throw ConfigError(str("[data] data.tokenizer ", cfg.data.tokenizer, " has ",
                            tok->vocab_size(), " ids but model.vocab_size=", cfg.model.vocab_size));
    td.tokenizer = tok;
    encode = [tok](const std::string& t) { return tok->encode(t); };
  }
  const int64_t s = cfg.data.seq_length;
  const bool dpo = a.kind == AlignmentSection::Kind::dpo || a.kind == AlignmentSection::Kind::orpo;
  const char* pref = a.kind == AlignmentSection::Kind::orpo ? "orpo" : "dpo";
  const SftLayout layout = a.packing ? SftLayout::packing : SftLayout::padding;
  auto make = [&](const std::string& dir, const char* key,
                  const char* what) -> std::shared_ptr<const trainer::Dataset> {
    const auto records = read_jsonl(dir, key, a.dev_choose_samples);
    if (dpo) {
      auto ds = std::make_shared<PreferenceDataset>(
          preference_examples(records, encode),
          PreferenceOptions{.seq_length = s,
                            .max_prompt_length = a.max_prompt_length,
                            .truncation = a.truncation_mode == "keep_end"
                                              ? PreferenceOptions::Truncation::keep_end
                                              : PreferenceOptions::Truncation::keep_start});
      td.notes.push_back(str(pref, " ", what, ": ", ds->size(),
                             " pairs (chosen and rejected rows of ", s, " tokens, prompts up to ",
                             a.max_prompt_length, " tokens)",
                             ds->truncated() ? str(", ", ds->truncated(), " truncated") : ""));
      return ds;
    }
    std::unique_ptr<io::ChatTemplate> chat;
    if (has_chat_rows(records) && !cfg.data.tokenizer.empty()) {
      const std::string dir = fs::path(cfg.data.tokenizer).parent_path().string();
      if (io::ChatTemplate::folder_has_template(dir.empty() ? "." : dir))
        chat = std::make_unique<io::ChatTemplate>(
            io::ChatTemplate::from_folder(dir.empty() ? "." : dir));
    }
    const auto examples = sft_examples(records, encode, chat.get());
    if (chat) td.notes.push_back(str("sft ", what, ": chat rows rendered by ", chat->origin()));
    auto ds = std::make_shared<SftDataset>(examples, s, layout);
    td.notes.push_back(sft_line(what, ds->stats(), layout));
    if (std::string(what) == "train") {
      const SftStats& st = ds->stats();
      td.real_token_fraction = double(st.real_tokens) / double(st.slots());
      const int64_t padded_rows = st.examples - st.dropped;
      td.padding_real_token_fraction = double(st.real_tokens) / double(padded_rows * s);
    }
    return ds;
  };
  std::shared_ptr<const trainer::Dataset> train = make(a.train_dir, "data.train_dir", "train");
  if (!a.val_dir.empty()) {
    td.train = train;
    td.val = make(a.val_dir, "data.val_dir", "val");
  } else {
    trainer::Split sp = trainer::split_dataset(train, cfg.data.val_fraction, cfg.seed);
    td.train = sp.train;
    td.val = sp.val;
  }
  td.description = str(
      dpo ? (a.kind == AlignmentSection::Kind::orpo ? "ORPO pairs" : "DPO pairs") : "SFT examples",
      " from ", a.train_dir, a.val_dir.empty() ? "" : " (val: " + a.val_dir + ")",
      td.tokenizer ? " (" + td.tokenizer->description() + ")" : " (UTF-8 bytes)", "; ",
      td.train->size(), " train / ", td.val ? td.val->size() : 0, " val ", dpo ? "pairs" : "rows");
  return td;
}

}  // namespace nxd::train_app
