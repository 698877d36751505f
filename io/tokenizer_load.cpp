// tokenizer.json -> Tokenizer::Parts: the model (BPE: vocabulary, merges, byte_fallback,
// unk_token), the added tokens, the normalizer, the pre-tokenizer and the decoder; anything nxd
// does not run is refused by name.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "nxd/io/bounded_read.h"
#include "nxd/io/tokenizer_parts.h"
#include "nxd/runtime/error.h"

namespace nxd::io {
using json = nlohmann::json;

namespace {

// tokenizers' ByteLevel regex (GPT-2's).
const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr int64_t kMaxId = int64_t{1} << 24;  // ids index tables: 16.7M (the largest vocabularies
                                              // are ~256k)

// A vocabulary or added-token id: an integer in [0, kMaxId) (ConfigError naming the piece).
int64_t checked_id(const std::string& path, const std::string& piece, const json& id) {
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxId ||
      (id.is_number_unsigned() && id.get<uint64_t>() >= static_cast<uint64_t>(kMaxId)))
    throw ConfigError(str("[tokenizer] ", path, ": piece '", shorten(piece), "' has id ",
                          shorten(id.dump()), " (ids are integers in [0, ", kMaxId, "))"));
  return id.get<int64_t>();
}

[[noreturn]] void unsupported(const std::string& path, const std::string& what) {
  throw ConfigError(str("[tokenizer] ", path, ": ", what,
                        " is not supported (byte-level and SentencePiece-style BPE are)"));
}

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

// A Replace's pattern: {"String": s} (a Regex is refused by name).
std::string replace_pattern(const std::string& path, const json& s, const char* where) {
  const json& p = s.at("pattern");
  if (!p.contains("String"))
    unsupported(path, str(where, " Replace with pattern ", shorten(p.dump())));
  return p["String"].get<std::string>();
}

std::vector<json> steps_of(const json& j, const char* list) {
  if (j.is_null()) return {};
  return j.at("type") == "Sequence" ? j.at(list).get<std::vector<json>>() : std::vector<json>{j};
}

Tokenizer::Parts::Prepend prepend_scheme(const std::string& path, const json& s) {
  using P = Tokenizer::Parts::Prepend;
  if (!s.contains("prepend_scheme"))  // files of tokenizers < 0.19: add_prefix_space
    return s.value("add_prefix_space", true) ? P::always : P::never;
  const std::string v = s["prepend_scheme"];
  if (v == "always") return P::always;
  if (v == "first") return P::first;
  if (v == "never") return P::never;
  unsupported(path, str("Metaspace prepend_scheme '", shorten(v), "'"));
}

void load_normalizer(const json& j, const std::string& path, Tokenizer::Parts& p) {
  using T = Tokenizer::Parts::NormStep::Type;
  for (const json& s : steps_of(j.value("normalizer", json()), "normalizers")) {
    const std::string type = s.at("type");
    if (type == "NFC")
      p.normalizer.push_back({T::nfc, "", ""});
    else if (type == "Prepend")
      p.normalizer.push_back({T::prepend, "", s.at("prepend").get<std::string>()});
    else if (type == "Replace")
      p.normalizer.push_back(
          {T::replace, replace_pattern(path, s, "normalizer"), s.at("content").get<std::string>()});
    else
      unsupported(path, str("normalizer ", shorten(s.dump())));
  }
}

void load_pre_tokenizer(const json& j, const std::string& path, Tokenizer::Parts& p) {
  bool byte_level = false;
  for (const json& s : steps_of(j.value("pre_tokenizer", json()), "pretokenizers")) {
    const std::string type = s.at("type");
    if (type == "Split") {
      if (s.value("behavior", std::string()) != "Isolated" || s.value("invert", false))
        unsupported(path,
                    str("Split pre-tokenizer ", shorten(s.dump()), " (behavior Isolated is)"));
      const json& pt = s.at("pattern");
      if (!pt.contains("Regex")) unsupported(path, str("Split pattern ", shorten(pt.dump())));
      p.splits.push_back(compile(path, pt["Regex"].get<std::string>()));
      p.patterns.push_back(pt["Regex"].get<std::string>());
      p.pre_name += (p.pre_name.empty() ? "" : " + ") + std::string("regex split");
    } else if (type == "ByteLevel") {
      byte_level = true;
      p.add_prefix_space = s.value("add_prefix_space", false);
      if (s.value("use_regex", true)) {
        p.splits.push_back(compile(path, kGpt2Regex));
        p.patterns.push_back(kGpt2Regex);
        p.pre_name += (p.pre_name.empty() ? "" : " + ") + std::string("GPT-2 regex");
      }
    } else if (type == "Metaspace") {
      p.metaspace = s.value("replacement", std::string("\u2581"));
      p.prepend = prepend_scheme(path, s);
      p.metaspace_split = s.value("split", true);
      p.pre_name += (p.pre_name.empty() ? "" : " + ") + std::string("Metaspace");
    } else {
      unsupported(path, str("pre-tokenizer '", shorten(type), "'"));
    }
  }
  if (byte_level && !p.metaspace.empty())
    unsupported(path, "a pre-tokenizer with both ByteLevel and Metaspace");
  if (!byte_level && !p.splits.empty())
    unsupported(path, "a Split pre-tokenizer without ByteLevel");
  p.kind = byte_level ? Tokenizer::Parts::Kind::byte_level : Tokenizer::Parts::Kind::sentencepiece;
}

void load_decoder(const json& j, const std::string& path, Tokenizer::Parts& p) {
  using T = Tokenizer::Parts::DecodeStep::Type;
  for (const json& s : steps_of(j.value("decoder", json()), "decoders")) {
    const std::string type = s.at("type");
    Tokenizer::Parts::DecodeStep d{};
    if (type == "ByteLevel" && p.kind == Tokenizer::Parts::Kind::byte_level) continue;
    if (type == "Replace") {
      d = {T::replace, replace_pattern(path, s, "decoder"), s.at("content").get<std::string>()};
    } else if (type == "ByteFallback") {
      d.type = T::byte_fallback;
    } else if (type == "Fuse") {
      d.type = T::fuse;
    } else if (type == "Strip") {
      d.type = T::strip;
      d.to = s.at("content").get<std::string>();
      d.start = s.value("start", int64_t{0});
      d.stop = s.value("stop", int64_t{0});
    } else if (type == "Metaspace") {
      d.type = T::metaspace;
      d.from = s.value("replacement", std::string("\u2581"));
      d.prepend = prepend_scheme(path, s);
    } else {
      unsupported(path,
                  str("decoder '", shorten(type), "' (with a ",
                      p.kind == Tokenizer::Parts::Kind::byte_level ? "ByteLevel" : "non-ByteLevel",
                      " pre-tokenizer)"));
    }
    if (p.kind == Tokenizer::Parts::Kind::byte_level)
      unsupported(path, str("decoder '", type, "' with a ByteLevel pre-tokenizer"));
    p.decoder.push_back(d);
  }
}

void load_model(const json& model, const std::string& path, Tokenizer::Parts& p) {
  if (model.value("type", std::string("BPE")) != "BPE")
    unsupported(path, str("model type '", model.value("type", std::string()), "'"));
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    if (model.contains(k) && !model[k].is_null())
      unsupported(path, str("model.", k, " ", shorten(model[k].dump())));
  p.ignore_merges = model.value("ignore_merges", false);
  p.byte_fallback = model.value("byte_fallback", false);
  p.fuse_unk = model.value("fuse_unk", false);
  if (p.byte_fallback && p.kind == Tokenizer::Parts::Kind::byte_level)
    unsupported(path, "model.byte_fallback: true with a ByteLevel pre-tokenizer");
  for (const auto& [piece, id] : model.at("vocab").items())
    p.vocab[piece] = checked_id(path, piece, id);
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    const auto it = p.vocab.find(model["unk_token"].get<std::string>());
    if (it == p.vocab.end())
      throw ConfigError(str("[tokenizer] ", path, ": model.unk_token '",
                            shorten(model["unk_token"].get<std::string>()),
                            "' is not in the vocabulary"));
    p.unk_id = it->second;
  }
  int64_t rank = 0;
  for (const auto& m : model.at("merges")) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos)
        throw ConfigError(str("[tokenizer] ", path, ": merge '", shorten(s), "' is not 'a b'"));
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      a = m.at(0).get<std::string>(), b = m.at(1).get<std::string>();
    }
    const auto ia = p.vocab.find(a), ib = p.vocab.find(b), iab = p.vocab.find(a + b);
    if (ia == p.vocab.end() || ib == p.vocab.end() || iab == p.vocab.end())
      throw ConfigError(str("[tokenizer] ", path, ": merge ", rank, " ('", shorten(a), "', '",
                            shorten(b), "') names a piece that is not in the vocabulary"));
    const uint64_t key =
        (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint64_t>(ib->second);
    p.merges.emplace(key, std::make_pair(rank++, iab->second));
  }
}

}  // namespace

int64_t load_tokenizer_parts(const json& j, const std::string& path, Tokenizer::Parts& p) {
  try {
    load_pre_tokenizer(j, path, p);  // decides the kind
    load_normalizer(j, path, p);
    load_model(j.at("model"), path, p);
    load_decoder(j, path, p);
    for (const auto& a : j.value("added_tokens", json::array())) {
      const std::string c = a.at("content").get<std::string>();
      if (a.value("single_word", false))
        unsupported(path, str("added token '", shorten(c), "' with single_word: true"));
      p.added.push_back({c, checked_id(path, c, a.at("id")), a.value("lstrip", false),
                         a.value("rstrip", false),
                         a.value("normalized", !a.value("special", false))});
    }
    std::stable_sort(p.added.begin(), p.added.end(), [](const auto& a, const auto& b) {
      return a.content.size() > b.content.size();
    });
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(str("[tokenizer] ", path, ": ", shorten(e.what(), 200)));
  }
  int64_t n = 0;
  for (const auto& [piece, id] : p.vocab) n = std::max(n, id + 1);
  for (const auto& a : p.added) n = std::max(n, a.id + 1);
  p.in_merge.assign(static_cast<size_t>(n), false);
  for (const auto& [key, m] : p.merges) {
    p.in_merge[static_cast<size_t>(key >> 32)] = true;
    p.in_merge[static_cast<size_t>(key & 0xffffffffu)] = true;
  }
  p.pieces.assign(static_cast<size_t>(n), "");
  p.is_added.assign(static_cast<size_t>(n), false);
  for (const auto& [piece, id] : p.vocab) p.pieces[static_cast<size_t>(id)] = piece;
  for (const auto& a : p.added) {
    p.pieces[static_cast<size_t>(a.id)] = a.content;
    p.is_added[static_cast<size_t>(a.id)] = true;
  }
  return n;
}

}  // namespace nxd::io
