#include "nxd/trainer/data.h"

#include <algorithm>
#include <cmath>

#include "nxd/collectives/parallel_state.h"
#include "nxd/layers/parallel/context_parallel.h"
#include "nxd/runtime/error.h"
#include "nxd/runtime/rng.h"

namespace nxd::trainer {

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
  NXD_CHECK(opts_.micro_batch >= 1 && opts_.accumulation >= 1,
            "[DistributedSampler] micro_batch and accumulation must be positive, got ",
            opts_.micro_batch, " and ", opts_.accumulation);
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
  const int64_t b = opts_.micro_batch, per = samples_per_rank();
  mine.reserve(per);
  for (int64_t j = 0; j < per / b; ++j)  // this rank's j-th micro batch: global micro batch j*dp+r
    for (int64_t i = 0; i < b; ++i)
      mine.push_back(all[(j * opts_.dp_size + opts_.dp_rank) * b + i]);
  return mine;
}

void Dataset::get_rows(int64_t i, int64_t* ids, int64_t* targets, int64_t* positions) const {
  const int64_t s = seq_length();
  std::vector<int64_t> buf(s + 1);
  get(i, buf.data());
  std::copy(buf.begin(), buf.end() - 1, ids);
  std::copy(buf.begin() + 1, buf.end(), targets);
  for (int64_t p = 0; p < s; ++p) positions[p] = p;
}

Batch make_batch(const Dataset& ds, const std::vector<int64_t>& indices) {
  const int64_t n = static_cast<int64_t>(indices.size()), s = ds.seq_length();
  const int64_t rows = ds.rows_per_sample(), b = n * rows;
  Batch out{empty({b, s}, DType::i64), empty({b, s}, DType::i64), Tensor(),
            from_vector<int64_t>(indices, {n})};
  Tensor pos = empty({b, s}, DType::i64);
  int64_t* ids = out.ids.data<int64_t>();
  int64_t* tgt = out.targets.data<int64_t>();
  int64_t* pp = pos.data<int64_t>();
  for (int64_t r = 0; r < n; ++r)
    ds.get_rows(indices[r], ids + r * rows * s, tgt + r * rows * s, pp + r * rows * s);
  if (ds.packed()) out.positions = pos;
  return out;
}

namespace {
SamplerOptions with_micro_batch(SamplerOptions o, int64_t micro_batch) {
  NXD_CHECK(micro_batch > 0, "[DataLoader] micro batch must be positive, got ", micro_batch);
  o.micro_batch = micro_batch;
  return o;
}
}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> ds, int64_t micro_batch, SamplerOptions opts,
                       const std::string& what)
    : ds_(std::move(ds)), b_(micro_batch), sampler_(ds_->size(), with_micro_batch(opts, b_)) {
  per_epoch_ = sampler_.samples_per_rank() / b_;
  if (per_epoch_ == 0)
    throw ConfigError(str("[data] the ", what, " split has ", ds_->size(), " samples of ",
                          ds_->seq_length() + 1, " tokens, fewer than one global batch of ",
                          sampler_.global_batch(), " (data.micro_batch_size=", b_,
                          " x data-parallel size ", opts.dp_size, " x ", opts.accumulation,
                          " accumulation step(s))"));
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
