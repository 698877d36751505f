#include "nxd/io/tokenizer.h"

#include <unicode/regex.h>
#include <unicode/utext.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "nxd/io/bounded_read.h"
#include "nxd/runtime/error.h"

namespace nxd::io {
using json = nlohmann::json;

namespace {

// tokenizers' ByteLevel regex (GPT-2's).
const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to 256 + n.
struct ByteChars {
  std::string of_byte[256];
  std::unordered_map<std::string, unsigned char> byte_of;
  ByteChars() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      of_byte[b] = utf8(keep ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
      byte_of[of_byte[b]] = static_cast<unsigned char>(b);
    }
  }
};
const ByteChars& byte_chars() {
  static const ByteChars c;
  return c;
}

size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}

constexpr int64_t kMaxTokenizerBytes = int64_t{256} << 20;  // Llama 3's is 9 MB
constexpr int64_t kMaxId = int64_t{1} << 24;  // ids index tables: 16.7M (the largest vocabularies
                                              // are ~256k)
// The ICU regex engine's time limit per match, in its units (10,000 steps each, on the order of a
// millisecond): a pre-tokenizer regex that backtracks exponentially ((a|aa)+$ on a run of a's)
// stops there with a ConfigError instead of running for minutes.
constexpr int32_t kRegexTimeLimit = 2000;

// A vocabulary or added-token id: an integer in [0, kMaxId) (ConfigError naming the piece).
int64_t checked_id(const std::string& path, const std::string& piece, const json& id) {
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxId ||
      (id.is_number_unsigned() && id.get<uint64_t>() >= static_cast<uint64_t>(kMaxId)))
    throw ConfigError(str("[tokenizer] ", path, ": piece '", shorten(piece), "' has id ",
                          shorten(id.dump()), " (ids are integers in [0, ", kMaxId, "))"));
  return id.get<int64_t>();
}

[[noreturn]] void unsupported(const std::string& path, const std::string& what) {
  throw ConfigError(str("[tokenizer] ", path, ": ", what, " is not supported (byte-level BPE is)"));
}

}  // namespace

struct Tokenizer::Regexes {
  std::string path;  // for messages
  std::vector<std::unique_ptr<icu::RegexPattern>> splits;
  std::vector<std::string> patterns;
  // Every piece of `in` cut by split i (matches and the text between them, in order: tokenizers'
  // Split with behavior Isolated).
  void split(size_t i, const std::string& in, std::vector<std::string>& out) const {
    UErrorCode st = U_ZERO_ERROR;
    UText* ut = utext_openUTF8(nullptr, in.data(), static_cast<int64_t>(in.size()), &st);
    std::unique_ptr<icu::RegexMatcher> m(splits[i]->matcher(st));
    m->reset(ut);
    m->setTimeLimit(kRegexTimeLimit, st);
    int64_t pos = 0;
    while (m->find(st) && U_SUCCESS(st)) {
      const int64_t b = m->start64(st), e = m->end64(st);
      if (e == b) continue;
      if (b > pos) out.push_back(in.substr(static_cast<size_t>(pos), static_cast<size_t>(b - pos)));
      out.push_back(in.substr(static_cast<size_t>(b), static_cast<size_t>(e - b)));
      pos = e;
    }
    if (pos < static_cast<int64_t>(in.size())) out.push_back(in.substr(static_cast<size_t>(pos)));
    utext_close(ut);
    if (st == U_REGEX_TIME_OUT || st == U_REGEX_STACK_OVERFLOW)
      throw ConfigError(str("[tokenizer] ", path, ": pre-tokenizer regex ", i, " ('",
                            shorten(patterns[i]), "') exceeded its ",
                            st == U_REGEX_TIME_OUT ? "time" : "stack", " limit on a piece of ",
                            in.size(), " bytes (it backtracks exponentially); refused"));
    if (U_FAILURE(st)) throw InternalError(str("[tokenizer] regex failed: ", u_errorName(st)));
  }
};

namespace {

std::unique_ptr<icu::RegexPattern> compile(const std::string& path, const std::string& pattern) {
  UErrorCode st = U_ZERO_ERROR;
  UParseError pe;
  std::unique_ptr<icu::RegexPattern> p(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, pe, st));
  if (U_FAILURE(st))
    throw ConfigError(str("[tokenizer] ", path, ": pre-tokenizer regex '", shorten(pattern),
                          "' does not compile: ", u_errorName(st), " at offset ", pe.offset));
  return p;
}

}  // namespace

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_file(const std::string& path_in) {
  // regular file, size, nesting checked before parsing (io/bounded_read.h)
  const json j = read_json_file(path_in, "tokenizer", "tokenizer", kMaxTokenizerBytes);
  const std::string path = shorten(path_in, ReadLimits::max_shown_path);
  Tokenizer t;
  t.path_ = path_in;
  t.regexes_ = std::make_unique<Regexes>();
  t.regexes_->path = path;
  try {
    const json& model = j.at("model");
    if (model.value("type", std::string("BPE")) != "BPE")
      unsupported(path, str("model type '", model.value("type", std::string()), "'"));
    if (model.value("byte_fallback", false)) unsupported(path, "model.byte_fallback: true");
    if (j.contains("normalizer") && !j["normalizer"].is_null())
      unsupported(path, str("normalizer ", shorten(j["normalizer"].dump())));
    t.ignore_merges_ = model.value("ignore_merges", false);
    for (const auto& [piece, id] : model.at("vocab").items())
      t.vocab_[piece] = checked_id(path, piece, id);
    int64_t rank = 0;
    for (const auto& m : model.at("merges")) {
      const std::string key = m.is_string()
                                  ? m.get<std::string>()
                                  : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>();
      t.merge_rank_.emplace(key, rank++);
    }
    for (const auto& a : j.value("added_tokens", json::array()))
      t.added_.emplace_back(a.at("content").get<std::string>(),
                            checked_id(path, a.at("content").get<std::string>(), a.at("id")));
    std::sort(t.added_.begin(), t.added_.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    // the pre-tokenizer: ByteLevel, or a Sequence of Splits and a ByteLevel
    const json& pre = j.at("pre_tokenizer");
    std::vector<json> steps = pre.at("type") == "Sequence"
                                  ? pre.at("pretokenizers").get<std::vector<json>>()
                                  : std::vector<json>{pre};
    bool byte_level = false;
    for (const json& s : steps) {
      const std::string type = s.at("type");
      if (type == "Split") {
        if (s.value("behavior", std::string()) != "Isolated" || s.value("invert", false))
          unsupported(path,
                      str("Split pre-tokenizer ", shorten(s.dump()), " (behavior Isolated is)"));
        const json& p = s.at("pattern");
        if (!p.contains("Regex")) unsupported(path, str("Split pattern ", shorten(p.dump())));
        t.regexes_->splits.push_back(compile(path, p["Regex"].get<std::string>()));
        t.regexes_->patterns.push_back(p["Regex"].get<std::string>());
        t.pre_name_ += (t.pre_name_.empty() ? "" : " + ") + std::string("regex split");
      } else if (type == "ByteLevel") {
        byte_level = true;
        t.add_prefix_space_ = s.value("add_prefix_space", false);
        if (s.value("use_regex", true)) {
          t.regexes_->splits.push_back(compile(path, kGpt2Regex));
          t.regexes_->patterns.push_back(kGpt2Regex);
          t.pre_name_ += (t.pre_name_.empty() ? "" : " + ") + std::string("GPT-2 regex");
        }
      } else {
        unsupported(path, str("pre-tokenizer '", shorten(type), "'"));
      }
    }
    if (!byte_level) unsupported(path, "a pre-tokenizer without ByteLevel");
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str("[tokenizer] ", path, ": ", shorten(e.what(), 200)));
  }
  for (const auto& [p, id] : t.vocab_) t.vocab_size_ = std::max(t.vocab_size_, id + 1);
  for (const auto& [c, id] : t.added_) t.vocab_size_ = std::max(t.vocab_size_, id + 1);
  t.pieces_.assign(static_cast<size_t>(t.vocab_size_), "");
  t.is_added_.assign(static_cast<size_t>(t.vocab_size_), false);
  for (const auto& [p, id] : t.vocab_) t.pieces_[static_cast<size_t>(id)] = p;
  for (const auto& [c, id] : t.added_) {
    t.pieces_[static_cast<size_t>(id)] = c;
    t.is_added_[static_cast<size_t>(id)] = true;
  }
  return t;
}

std::string Tokenizer::description() const {
  return str("byte-level BPE from ", path_, ", ", vocab_size_, " ids, ", merge_rank_.size(),
             " merges (", pre_name_.empty() ? "no regex" : pre_name_, ")");
}

void Tokenizer::bpe(const std::string& word, std::vector<int64_t>& out) const {
  const ByteChars& bc = byte_chars();
  std::string chars;
  for (unsigned char c : word) chars += bc.of_byte[c];
  if (ignore_merges_) {
    const auto it = vocab_.find(chars);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<std::string> sym;
  for (unsigned char c : word) sym.push_back(bc.of_byte[c]);
  while (sym.size() > 1) {
    int64_t best = INT64_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      const auto it = merge_rank_.find(sym[i] + " " + sym[i + 1]);
      if (it != merge_rank_.end() && it->second < best) best = it->second, at = i;
    }
    if (best == INT64_MAX) break;
    const std::string a = sym[at], b = sym[at + 1];
    std::vector<std::string> next;
    for (size_t i = 0; i < sym.size(); ++i) {
      if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
        next.push_back(a + b);
        ++i;
      } else {
        next.push_back(sym[i]);
      }
    }
    sym.swap(next);
  }
  for (const auto& s : sym) {
    const auto it = vocab_.find(s);
    if (it == vocab_.end())
      throw ConfigError(
          str("[tokenizer] ", path_, ": piece '", s, "' of '", word, "' is not in the vocabulary"));
    out.push_back(it->second);
  }
}

// Text without added tokens: pre-tokenize, then BPE each word.
void Tokenizer::encode_chunk(const std::string& text, std::vector<int64_t>& out) const {
  if (text.empty()) return;
  std::vector<std::string> words{add_prefix_space_ && text[0] != ' ' ? " " + text : text};
  for (size_t i = 0; i < regexes_->splits.size(); ++i) {
    std::vector<std::string> next;
    for (const auto& w : words) regexes_->split(i, w, next);
    words.swap(next);
  }
  std::unordered_map<std::string, std::vector<int64_t>> cache;
  for (const auto& w : words) {
    auto it = cache.find(w);
    if (it == cache.end()) {
      std::vector<int64_t> ids;
      bpe(w, ids);
      it = cache.emplace(w, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> out;
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const std::pair<std::string, int64_t>* hit = nullptr;
    for (const auto& a : added_)  // longest first
      if (!a.first.empty() && text.compare(i, a.first.size(), a.first) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      i += utf8_len(static_cast<unsigned char>(text[i]));
      continue;
    }
    encode_chunk(text.substr(start, i - start), out);
    out.push_back(hit->second);
    i += hit->first.size();
    start = i;
  }
  encode_chunk(text.substr(start), out);
  return out;
}

std::string Tokenizer::decode_model_output(const std::vector<int64_t>& ids,
                                           int64_t& left_out) const {
  std::vector<int64_t> known;
  for (int64_t id : ids)
    if (id < vocab_size_) known.push_back(id);
  left_out = static_cast<int64_t>(ids.size() - known.size());
  return decode(known);
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  const ByteChars& bc = byte_chars();
  std::string out;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size_ || pieces_[static_cast<size_t>(id)].empty())
      throw ConfigError(str("[tokenizer] ", path_, ": id ", id, " is not in the vocabulary of ",
                            vocab_size_, " ids"));
    const std::string& p = pieces_[static_cast<size_t>(id)];
    if (is_added_[static_cast<size_t>(id)]) {
      out += p;
      continue;
    }
    for (size_t k = 0; k < p.size();) {
      const size_t n = utf8_len(static_cast<unsigned char>(p[k]));
      const auto it = bc.byte_of.find(p.substr(k, n));
      if (it == bc.byte_of.end())
        throw ConfigError(
            str("[tokenizer] ", path_, ": piece '", p, "' of id ", id, " is not byte-level"));
      out += static_cast<char>(it->second);
      k += n;
    }
  }
  return out;
}

}  // namespace nxd::io
