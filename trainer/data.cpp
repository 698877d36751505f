#include "nxd/trainer/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/context_parallel.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/rng.h"
#include "nxd/trainer/config_limits.h"

namespace fs = std::filesystem;

namespace nxd::trainer {

namespace {

std::string read_file(const fs::path& p) {
  check_regular_file(p.string(), "data.path");  // a FIFO would block, /dev/zero never end
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

RandomDataset::RandomDataset(int64_t num_samples, int64_t seq_length, int64_t vocab_size,
                             uint64_t seed)
    : n_(num_samples), s_(seq_length), v_(vocab_size), seed_(seed) {
  NXD_CHECK(n_ > 0 && s_ > 0 && v_ > 0,
            "[data] random dataset sizes must be positive: samples=", n_, " seq_length=", s_,
            " vocab=", v_);
}

void RandomDataset::get(int64_t i, int64_t* out) const {
  NXD_CHECK(i >= 0 && i < n_, "[data] sample ", i, " out of range [0, ", n_, ")");
  const RngStream rs{seed_, stream_id("nxd.data.random")};
  // sample i holds tokens i*(S+1) .. of one endless random stream
  for (int64_t k = 0; k <= s_; ++k) {
    auto t = static_cast<int64_t>(rs.uniform_f64(static_cast<uint64_t>(i * (s_ + 1) + k)) * v_);
    out[k] = std::min(t, v_ - 1);
  }
}

SubsetDataset::SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices)
    : base_(std::move(base)), idx_(std::move(indices)) {
  for (int64_t i : idx_)
    NXD_CHECK(i >= 0 && i < base_->size(), "[data] subset index ", i, " out of range [0, ",
              base_->size(), ")");
}

std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  const RngStream rs{seed, stream};
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(rs.uniform_f64(static_cast<uint64_t>(i)) * (i + 1));
    std::swap(p[i], p[std::min(j, i)]);
  }
  return p;
}

Split split_dataset(std::shared_ptr<const Dataset> base, double val_fraction, uint64_t seed) {
  NXD_CHECK(val_fraction >= 0 && val_fraction < 1, "[data] val_fraction must be in [0, 1), got ",
            val_fraction);
  const int64_t n = base->size();
  int64_t n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
  if (val_fraction > 0 && n >= 2) n_val = std::clamp<int64_t>(n_val, 1, n - 1);
  if (n_val == 0) return {base, nullptr};
  std::vector<int64_t> perm = permutation(n, seed, stream_id("nxd.data.split"));
  std::vector<int64_t> val(perm.begin(), perm.begin() + n_val);
  std::vector<int64_t> train(perm.begin() + n_val, perm.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());
  return {std::make_shared<SubsetDataset>(base, std::move(train)),
          std::make_shared<SubsetDataset>(base, std::move(val))};
}

DistributedSampler::DistributedSampler(int64_t num_samples, SamplerOptions opts)
    : n_(num_samples), opts_(opts) {
  NXD_CHECK(opts_.dp_size >= 1 && opts_.dp_rank >= 0 && opts_.dp_rank < opts_.dp_size,
            "[DistributedSampler] bad rank ", opts_.dp_rank, " of ", opts_.dp_size);
  NXD_CHECK(n_ >= 0, "[DistributedSampler] negative sample count ", n_);
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> all;
  if (opts_.shuffle) {
    all = permutation(n_, opts_.seed, stream_id("nxd.data.shuffle") + static_cast<uint64_t>(epoch));
  } else {
    all.resize(n_);
    for (int64_t i = 0; i < n_; ++i) all[i] = i;
  }
  std::vector<int64_t> mine;
  const int64_t per = samples_per_rank();
  mine.reserve(per);
  for (int64_t k = 0; k < per; ++k) mine.push_back(all[k * opts_.dp_size + opts_.dp_rank]);
  return mine;
}

Batch make_batch(const Dataset& ds, const std::vector<int64_t>& indices) {
  const int64_t b = static_cast<int64_t>(indices.size()), s = ds.seq_length();
  Batch out{empty({b, s}, DType::i64), empty({b, s}, DType::i64)};
  int64_t* ids = out.ids.data<int64_t>();
  int64_t* tgt = out.targets.data<int64_t>();
  std::vector<int64_t> buf(s + 1);
  for (int64_t r = 0; r < b; ++r) {
    ds.get(indices[r], buf.data());
    std::copy(buf.begin(), buf.end() - 1, ids + r * s);
    std::copy(buf.begin() + 1, buf.end(), tgt + r * s);
  }
  return out;
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> ds, int64_t micro_batch, SamplerOptions opts,
                       const std::string& what)
    : ds_(std::move(ds)), b_(micro_batch), sampler_(ds_->size(), opts) {
  NXD_CHECK(b_ > 0, "[DataLoader] micro batch must be positive, got ", b_);
  per_epoch_ = sampler_.samples_per_rank() / b_;
  if (per_epoch_ == 0)
    throw ConfigError(str("[data] the ", what, " split has ", ds_->size(), " samples of ",
                          ds_->seq_length() + 1, " tokens (", sampler_.samples_per_rank(),
                          " per data-parallel rank), fewer than data.micro_batch_size=", b_));
}

void DataLoader::set_state(int64_t epoch, int64_t position) {
  NXD_CHECK(epoch >= 0 && position >= 0 && position <= per_epoch_,
            "[DataLoader] bad state epoch=", epoch, " position=", position);
  epoch_ = epoch, pos_ = position;
  order_.clear();
}

Batch DataLoader::next() {
  if (pos_ == per_epoch_) ++epoch_, pos_ = 0, order_.clear();
  if (order_.empty()) order_ = sampler_.indices(epoch_);
  std::vector<int64_t> idx(order_.begin() + pos_ * b_, order_.begin() + (pos_ + 1) * b_);
  ++pos_;
  return make_batch(*ds_, idx);
}

Batch context_parallel_batch(const Batch& b) {
  const int cp = model_context_parallel_size();
  if (cp == 1 || !b.ids.defined()) return b;
  const int r = parallel_state::get_context_parallel_rank();
  return {context_parallel_slice(b.ids, 1, r, cp), context_parallel_slice(b.targets, 1, r, cp)};
}

}  // namespace nxd::trainer
