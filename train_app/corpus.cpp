#include "nxd/train_app/corpus.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "nxd/runtime/error.h"
#include "nxd/train_app/config_limits.h"

namespace fs = std::filesystem;

namespace nxd::train_app {

namespace {

std::string read_file(const fs::path& p) {
  io::check_regular_file(p.string(), "data.path",
                         "config");  // a FIFO would block, /dev/zero never end
  std::ifstream in(p, std::ios::binary);
  if (!in) throw IoError(str("[data] cannot read '", p.string(), "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw IoError(str("[data] error reading '", p.string(), "'"));
  return ss.str();
}

}  // namespace

bool is_text(const std::string& b, std::string* reason) {
  const auto* s = reinterpret_cast<const unsigned char*>(b.data());
  const size_t n = b.size();
  if (const void* z = std::memchr(s, 0, n)) {
    if (reason)
      *reason = str("binary: NUL byte at offset ", static_cast<const unsigned char*>(z) - s);
    return false;
  }
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      len = 0, cp = 0;
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (s[i + k] & 0xC0) == 0x80;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // no overlong forms, surrogates or code points beyond U+10FFFF
    if (ok)
      ok = !((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
             (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF));
    if (!ok) {
      if (reason) *reason = str("not text: invalid UTF-8 at offset ", i);
      return false;
    }
    i += len;
  }
  return true;
}

Corpus load_text_corpus(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw IoError(str("[data] data.path '", path, "' does not exist"));
  Corpus c;
  c.vocab_size = 256;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (auto it = fs::recursive_directory_iterator(
             path, fs::directory_options::follow_directory_symlink, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec)) files.push_back(it->path());
    if (ec) throw IoError(str("[data] cannot list '", path, "': ", ec.message()));
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::set<fs::path> seen;
  std::vector<std::pair<fs::path, std::string>> read;  // canonical -> first path
  for (const auto& f : files) {
    const fs::path canon = fs::canonical(f, ec);
    if (!ec && !seen.insert(canon).second) {
      c.skipped.push_back({f.string(), str("duplicate: same file as ", canon.string())});
      continue;
    }
    std::string bytes = read_file(f);
    std::string why;
    if (!is_text(bytes, &why)) {
      c.skipped.push_back({f.string(), why});
      continue;
    }
    if (bytes.empty()) {
      c.skipped.push_back({f.string(), "empty"});
      continue;
    }
    c.files.push_back(f.string());
    c.tokens.insert(c.tokens.end(), reinterpret_cast<const unsigned char*>(bytes.data()),
                    reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size());
  }
  if (c.tokens.empty()) {
    std::string detail;
    if (!c.skipped.empty())
      detail = str(" (skipped ", c.skipped.size(), " file(s), e.g. '", c.skipped[0].path,
                   "': ", c.skipped[0].reason, ")");
    throw ConfigError(str("[data] empty corpus: no text in data.path '", path, "'", detail));
  }
  return c;
}

Corpus load_token_file(const std::string& path, int element_bytes, int64_t vocab_size) {
  NXD_CHECK(element_bytes == 2 || element_bytes == 4, "[data] token element must be 2 or 4 bytes");
  std::error_code ec;
  if (!fs::exists(path, ec)) throw IoError(str("[data] data.path '", path, "' does not exist"));
  if (fs::is_directory(path, ec))
    throw ConfigError(
        str("[data] data.kind=tokens needs a token file, '", path, "' is a directory"));
  const std::string bytes = read_file(path);
  if (bytes.size() % element_bytes != 0)
    throw ConfigError(str("[data] token file '", path, "' has ", bytes.size(),
                          " bytes, not a multiple of ", element_bytes, " (data.token_dtype=uint",
                          8 * element_bytes, ")"));
  if (bytes.empty())
    throw ConfigError(str("[data] empty corpus: token file '", path, "' is empty"));
  Corpus c;
  c.vocab_size = vocab_size;
  c.files.push_back(path);
  const size_t n = bytes.size() / element_bytes;
  c.tokens.resize(n);
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    for (int k = element_bytes - 1; k >= 0; --k) v = (v << 8) | u[i * element_bytes + k];
    if (static_cast<int64_t>(v) >= vocab_size)
      throw ConfigError(str("[data] token file '", path, "': id ", v, " at position ", i,
                            " is >= model.vocab_size=", vocab_size));
    c.tokens[i] = v;
  }
  return c;
}

CorpusDataset::CorpusDataset(std::shared_ptr<const Corpus> corpus, int64_t seq_length,
                             const std::string& what)
    : corpus_(std::move(corpus)), s_(seq_length) {
  NXD_CHECK(s_ > 0, "[data] seq_length must be positive, got ", s_);
  const int64_t t = static_cast<int64_t>(corpus_->tokens.size());
  if (t < s_ + 1)
    throw ConfigError(str("[data] the ", what, " has ", t,
                          " tokens, too few for one sample of data.seq_length=", s_,
                          " (needs seq_length + 1)"));
  n_ = (t - 1) / s_;
}

void CorpusDataset::get(int64_t i, int64_t* out) const {
  NXD_CHECK(i >= 0 && i < n_, "[data] sample ", i, " out of range [0, ", n_, ")");
  const uint32_t* src = corpus_->tokens.data() + i * s_;
  for (int64_t k = 0; k <= s_; ++k) out[k] = src[k];
}
}  // namespace nxd::train_app
