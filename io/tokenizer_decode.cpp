// io::Tokenizer's decoding: ids back to text, byte-level (GPT-2's byte characters) or through a
// SentencePiece-style tokenizer's decoder chain (tokenizer.h).
#include <cctype>
#include <string>
#include <vector>

#include "nxd/io/tokenizer.h"
#include "nxd/io/tokenizer_parts.h"
#include "nxd/runtime/error.h"

namespace nxd::io {
using Parts = Tokenizer::Parts;

namespace {

// Whether `b` is valid UTF-8 (what Rust's String::from_utf8 accepts).
bool valid_utf8(const std::string& b) {
  for (size_t i = 0; i < b.size();) {
    const auto c = static_cast<unsigned char>(b[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > b.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(b[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

// tokenizers' ByteFallback decoder: runs of <0xNN> tokens become their bytes when these are
// UTF-8, else one U+FFFD per byte.
std::vector<std::string> byte_fallback(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  size_t count = 0;
  auto flush = [&] {
    if (count == 0) return;
    if (valid_utf8(bytes))
      out.push_back(bytes);
    else
      for (size_t i = 0; i < count; ++i) out.push_back("\xEF\xBF\xBD");
    bytes.clear();
    count = 0;
  };
  for (const std::string& t : tokens) {
    const bool is_byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                         std::isxdigit(static_cast<unsigned char>(t[3])) &&
                         std::isxdigit(static_cast<unsigned char>(t[4]));
    if (is_byte) {
      bytes += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
      ++count;
    } else {
      flush();
      out.push_back(t);
    }
  }
  flush();
  return out;
}

// tokenizers' Strip decoder on one token: up to `start` leading and `stop` trailing `c`.
std::string strip(const std::string& t, const std::string& c, int64_t start, int64_t stop) {
  size_t b = 0, e = t.size();
  for (int64_t i = 0; i < start && !c.empty() && t.compare(b, c.size(), c) == 0; ++i) b += c.size();
  for (int64_t i = 0;
       i < stop && !c.empty() && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0;
       ++i)
    e -= c.size();
  return t.substr(b, e - b);
}

// The SentencePiece kind's decoder chain over the tokens' strings.
std::string decode_chain(const Parts& p, std::vector<std::string> tokens) {
  using T = Parts::DecodeStep::Type;
  for (const auto& d : p.decoder) {
    if (d.type == T::replace) {
      for (auto& t : tokens) replace_all(t, d.from, d.to);
    } else if (d.type == T::byte_fallback) {
      tokens = byte_fallback(tokens);
    } else if (d.type == T::fuse) {
      std::string all;
      for (const auto& t : tokens) all += t;
      tokens = {all};
    } else if (d.type == T::strip) {
      for (auto& t : tokens) t = strip(t, d.to, d.start, d.stop);
    } else {  // Metaspace: the replacement is a space, and none at all in the first token
      for (size_t i = 0; i < tokens.size(); ++i)
        replace_all(tokens[i], d.from, i == 0 && d.prepend != Parts::Prepend::never ? "" : " ");
    }
  }
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

}  // namespace

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  if (is_bytes()) {
    std::string out;
    for (int64_t id : ids) {
      if (id < 0 || id >= 256)
        throw ConfigError(str("[tokenizer] bytes: id ", id, " is not a byte (0..255)"));
      out += static_cast<char>(id);
    }
    return out;
  }
  const Parts& p = *p_;
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size_ || p.pieces[static_cast<size_t>(id)].empty())
      throw ConfigError(str("[tokenizer] ", path_, ": id ", id, " is not in the vocabulary of ",
                            vocab_size_, " ids"));
    tokens.push_back(p.pieces[static_cast<size_t>(id)]);
  }
  if (p.kind == Parts::Kind::sentencepiece) return decode_chain(p, std::move(tokens));
  const ByteChars& bc = byte_chars();
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string& t = tokens[i];
    if (p.is_added[static_cast<size_t>(ids[i])]) {
      out += t;
      continue;
    }
    for (size_t k = 0; k < t.size();) {
      const size_t n = utf8_len(static_cast<unsigned char>(t[k]));
      const auto it = bc.byte_of.find(t.substr(k, n));
      if (it == bc.byte_of.end())
        throw ConfigError(
            str("[tokenizer] ", path_, ": piece '", t, "' of id ", ids[i], " is not byte-level"));
      out += static_cast<char>(it->second);
      k += n;
    }
  }
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

}  // namespace nxd::io
