#include "nxd/io/tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/utext.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "nxd/io/bounded_read.h"
#include "nxd/io/tokenizer_parts.h"
#include "nxd/runtime/error.h"

namespace nxd::io {
using json = nlohmann::json;
using Parts = Tokenizer::Parts;

namespace {

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

constexpr int64_t kMaxTokenizerBytes = int64_t{256} << 20;  // Llama 3's is 9 MB
// The ICU regex engine's time limit per match, in its units (10,000 steps each, on the order of a
// millisecond): a pre-tokenizer regex that backtracks exponentially ((a|aa)+$ on a run of a's)
// stops there with a ConfigError instead of running for minutes.
constexpr int32_t kRegexTimeLimit = 2000;

bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string nfc(const std::string& s) {
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(st);
  if (U_FAILURE(st)) throw InternalError(str("[tokenizer] no ICU NFC: ", u_errorName(st)));
  icu::UnicodeString u = n->normalize(icu::UnicodeString::fromUTF8(s), st);
  if (U_FAILURE(st)) throw InternalError(str("[tokenizer] NFC failed: ", u_errorName(st)));
  std::string out;
  u.toUTF8String(out);
  return out;
}

// A text cut at the added tokens of `normalized` kind: (text, -1) pieces and (content, id)
// tokens, with lstrip/rstrip eating the whitespace beside a token (the longest token at a
// position wins).
std::vector<std::pair<std::string, int64_t>> split_added(const Parts& p, const std::string& text,
                                                         bool normalized) {
  std::vector<std::pair<std::string, int64_t>> out;
  size_t start = 0, i = 0;
  bool strip_next = false;
  auto flush = [&](size_t end, bool lstrip) {
    std::string piece = text.substr(start, end - start);
    if (strip_next)
      piece.erase(0, std::find_if_not(piece.begin(), piece.end(), is_space) - piece.begin());
    if (lstrip)
      piece.erase(std::find_if_not(piece.rbegin(), piece.rend(), is_space).base(), piece.end());
    if (!piece.empty()) out.emplace_back(std::move(piece), -1);
  };
  while (i < text.size()) {
    const Parts::Added* hit = nullptr;
    for (const auto& a : p.added)  // longest first
      if (a.normalized == normalized && !a.content.empty() &&
          text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (!hit) {
      i += utf8_len(static_cast<unsigned char>(text[i]));
      continue;
    }
    flush(i, hit->lstrip);
    out.emplace_back(hit->content, hit->id);
    i += hit->content.size();
    start = i;
    strip_next = hit->rstrip;
  }
  flush(text.size(), false);
  return out;
}

struct Symbol {
  int64_t id;
  int64_t prev, next;  // -1: none
  bool alive = true;
};

// tokenizers' Word::merge_all: the pair of lowest rank (leftmost among equals) merges until none
// is left; a queued pair whose symbols changed since is skipped.
void merge_all(const Parts& p, std::vector<Symbol>& s) {
  using Entry = std::tuple<int64_t, int64_t, int64_t>;  // rank, position, merged id
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> q;
  auto pair_of = [&](int64_t i) -> const std::pair<int64_t, int64_t>* {
    const int64_t j = s[static_cast<size_t>(i)].next;
    if (j < 0) return nullptr;
    const uint64_t key = (static_cast<uint64_t>(s[static_cast<size_t>(i)].id) << 32) |
                         static_cast<uint64_t>(s[static_cast<size_t>(j)].id);
    const auto it = p.merges.find(key);
    return it == p.merges.end() ? nullptr : &it->second;
  };
  auto push = [&](int64_t i) {
    if (const auto* m = pair_of(i)) q.emplace(m->first, i, m->second);
  };
  for (int64_t i = 0; i + 1 < static_cast<int64_t>(s.size()); ++i) push(i);
  while (!q.empty()) {
    const auto [rank, i, merged] = q.top();
    q.pop();
    Symbol& a = s[static_cast<size_t>(i)];
    if (!a.alive) continue;
    const auto* m = pair_of(i);
    if (!m || m->second != merged) continue;
    Symbol& b = s[static_cast<size_t>(a.next)];
    a.id = merged;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) s[static_cast<size_t>(b.next)].prev = i;
    if (a.prev >= 0) push(a.prev);
    push(i);
  }
}

// The symbols of one word on their way to BPE ids. A symbol that is no merge's left or right
// piece can never merge: it ends the run of symbols before it, which merges on its own (exactly
// as within the whole word, in bounded memory: a SentencePiece-style section is one word, a
// newline's <0x0A> typically such a symbol).
class SymbolRun {
 public:
  SymbolRun(const Parts& p, std::vector<int64_t>& out) : p_(p), out_(out) {}
  void add(int64_t id) {
    if (!p_.in_merge[static_cast<size_t>(id)]) {
      flush();
      out_.push_back(id);
      return;
    }
    const auto n = static_cast<int64_t>(sym_.size());
    sym_.push_back({id, n - 1, -1});
    if (n > 0) sym_[static_cast<size_t>(n - 1)].next = n;
  }
  // Merges the symbols held and appends their ids.
  void flush() {
    merge_all(p_, sym_);
    for (const Symbol& x : sym_)
      if (x.alive) out_.push_back(x.id);
    sym_.clear();
  }

 private:
  const Parts& p_;
  std::vector<int64_t>& out_;
  std::vector<Symbol> sym_;
};

[[noreturn]] void missing_piece(const std::string& path, const std::string& piece,
                                const std::string& word) {
  throw ConfigError(
      str("[tokenizer] ", path, ": piece '", piece, "' of '", word, "' is not in the vocabulary"));
}

// The word in GPT-2's byte characters.
std::string byte_level_chars(const std::string& word) {
  const ByteChars& bc = byte_chars();
  std::string chars;
  for (unsigned char c : word) chars += bc.of_byte[c];
  return chars;
}

// Byte-level: one symbol per byte of the word.
void add_byte_level(const Parts& p, const std::string& path, const std::string& word,
                    SymbolRun& run) {
  const ByteChars& bc = byte_chars();
  for (unsigned char c : word) {
    const auto it = p.vocab.find(bc.of_byte[c]);
    if (it == p.vocab.end()) missing_piece(path, bc.of_byte[c], word);
    run.add(it->second);
  }
}

// SentencePiece-style: one symbol per character; byte_fallback: <0xNN> for those outside the
// vocabulary, else unk (fused).
void add_characters(const Parts& p, const std::string& path, const std::string& word,
                    SymbolRun& run) {
  bool last_unk = false;
  for (size_t k = 0; k < word.size();) {
    const size_t n = std::min(utf8_len(static_cast<unsigned char>(word[k])), word.size() - k);
    const std::string ch = word.substr(k, n);
    k += n;
    if (const auto it = p.vocab.find(ch); it != p.vocab.end()) {
      run.add(it->second);
      last_unk = false;
      continue;
    }
    std::vector<int64_t> bytes;
    if (p.byte_fallback)
      for (unsigned char c : ch) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", c);
        const auto it = p.vocab.find(name);
        if (it == p.vocab.end()) break;
        bytes.push_back(it->second);
      }
    if (bytes.size() == ch.size()) {
      for (int64_t id : bytes) run.add(id);
      last_unk = false;
      continue;
    }
    if (p.unk_id < 0) missing_piece(path, ch, word);
    if (!(p.fuse_unk && last_unk)) run.add(p.unk_id);
    last_unk = true;
  }
}

}  // namespace

ByteChars::ByteChars() {
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    of_byte[b] = utf8(keep ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
    byte_of[of_byte[b]] = static_cast<unsigned char>(b);
  }
}

const ByteChars& byte_chars() {
  static const ByteChars c;
  return c;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t f; (f = s.find(from, pos)) != std::string::npos; pos = f + from.size())
    out.append(s, pos, f - pos).append(to);
  out.append(s, pos, std::string::npos);
  s.swap(out);
}

void Parts::split(const std::string& path, size_t i, const std::string& in,
                  std::vector<std::string>& out) const {
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

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_file(const std::string& path_in) {
  // regular file, size, nesting checked before parsing (io/bounded_read.h)
  const json j = read_json_file(path_in, "tokenizer", "tokenizer", kMaxTokenizerBytes);
  Tokenizer t;
  t.path_ = path_in;
  t.p_ = std::make_unique<Parts>();
  t.vocab_size_ = load_tokenizer_parts(j, shorten(path_in, ReadLimits::max_shown_path), *t.p_);
  return t;
}

Tokenizer Tokenizer::bytes() {
  Tokenizer t;
  t.path_ = "bytes";
  t.vocab_size_ = 256;
  return t;
}

std::string Tokenizer::description() const {
  if (is_bytes()) return "bytes (UTF-8 bytes are the ids, 256 ids)";
  const bool bl = p_->kind == Parts::Kind::byte_level;
  return str(bl ? "byte-level BPE" : "SentencePiece-style BPE", " from ", path_, ", ", vocab_size_,
             " ids, ", p_->merges.size(), " merges (",
             p_->pre_name.empty() ? (bl ? "no regex" : "no pre-tokenizer") : p_->pre_name,
             p_->byte_fallback ? ", byte_fallback" : "", ")");
}

void Tokenizer::bpe(const std::string& word, std::vector<int64_t>& out) const {
  const Parts& p = *p_;
  if (p.ignore_merges) {
    const auto it = p.vocab.find(p.kind == Parts::Kind::byte_level ? byte_level_chars(word) : word);
    if (it != p.vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  SymbolRun run(p, out);
  if (p.kind == Parts::Kind::byte_level)
    add_byte_level(p, path_, word, run);
  else
    add_characters(p, path_, word, run);
  run.flush();
}

// Text without added tokens: pre-tokenize, then BPE each word.
void Tokenizer::encode_chunk(const std::string& text, bool first, std::vector<int64_t>& out) const {
  const Parts& p = *p_;
  if (text.empty()) return;
  std::vector<std::string> words;
  if (p.kind == Parts::Kind::byte_level) {
    words.push_back(p.add_prefix_space && text[0] != ' ' ? " " + text : text);
    for (size_t i = 0; i < p.splits.size(); ++i) {
      std::vector<std::string> next;
      for (const auto& w : words) p.split(path_, i, w, next);
      words.swap(next);
    }
  } else if (!p.metaspace.empty()) {
    std::string s = text;
    replace_all(s, " ", p.metaspace);
    if (s.rfind(p.metaspace, 0) != 0 &&
        (p.prepend == Parts::Prepend::always || (p.prepend == Parts::Prepend::first && first)))
      s = p.metaspace + s;
    if (!p.metaspace_split) {
      words.push_back(s);
    } else {  // MergedWithNext: every replacement starts a word
      size_t b = 0;
      for (size_t f; (f = s.find(p.metaspace, b + 1)) != std::string::npos; b = f)
        words.push_back(s.substr(b, f - b));
      words.push_back(s.substr(b));
    }
  } else {
    words.push_back(text);
  }
  std::unordered_map<std::string, std::vector<int64_t>> cache;
  for (const auto& w : words) {
    if (w.size() >= 256) {  // long words (a SentencePiece-style section) are not worth keeping
      bpe(w, out);
      continue;
    }
    auto it = cache.find(w);
    if (it == cache.end()) {
      std::vector<int64_t> ids;
      bpe(w, ids);
      it = cache.emplace(w, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

void Tokenizer::encode_section(const std::string& text, bool first,
                               std::vector<int64_t>& out) const {
  std::string s = text;
  for (const auto& n : p_->normalizer) {
    if (n.type == Parts::NormStep::Type::nfc)
      s = nfc(s);
    else if (n.type == Parts::NormStep::Type::prepend && !s.empty())
      s = n.to + s;
    else if (n.type == Parts::NormStep::Type::replace)
      replace_all(s, n.from, n.to);
  }
  for (const auto& [piece, id] : split_added(*p_, s, /*normalized=*/true)) {
    if (id >= 0)
      out.push_back(id);
    else
      encode_chunk(piece, first, out);
  }
}

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> out;
  if (is_bytes()) {
    for (unsigned char ch : text) out.push_back(ch);
    return out;
  }
  const auto sections = split_added(*p_, text, /*normalized=*/false);
  for (size_t i = 0; i < sections.size(); ++i) {
    if (sections[i].second >= 0)
      out.push_back(sections[i].second);
    else
      encode_section(sections[i].first, i == 0, out);
  }
  return out;
}

}  // namespace nxd::io
