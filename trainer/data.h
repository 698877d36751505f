#pragma once
// Training data: fixed-length samples, a held-out split, a data-parallel sampler and the
// micro-batch loader (the token sources nxd-train reads are in corpus.h).
//
//   Dataset       N samples of seq_length + 1 tokens (ids and the targets shifted by one):
//                 RandomDataset draws uniform tokens, SubsetDataset selects samples of another,
//                 CorpusDataset (corpus.h) cuts a corpus into consecutive windows
//   split_dataset a validation subset of round(N * val_fraction) samples chosen by the seed
//   DistributedSampler  the order of samples per epoch for one data-parallel rank: one seeded
//                 permutation of all samples cut into micro batches of b consecutive positions,
//                 rank r taking micro batches r, r + dp, r + 2dp, ... (Megatron-LM's
//                 MegatronPretrainingSampler), and an epoch of whole global batches (dp x b x
//                 accumulation samples; the rest at the end of the permutation are dropped). So
//                 every sample is seen at most once per epoch, and each step's micro batches hold
//                 the same samples whatever the split of the global batch between DP and
//                 accumulation: statistics taken per micro batch (MoE's auxiliary loss) do not
//                 depend on the layout. b = 1 without accumulation is torch's DistributedSampler.
//   DataLoader    micro batches ids/targets [B, S] i64 from a dataset and a sampler, across
//                 epochs without end; its (epoch, position) is the resumable state
// Everything depends only on the seed, never on timing or thread count.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nxd/runtime/tensor.h"

namespace nxd::trainer {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t seq_length() const = 0;
  // Writes the seq_length + 1 tokens of sample i.
  virtual void get(int64_t i, int64_t* out) const = 0;
  // Datasets with labels of their own (SFT and DPO jsonl, train_app/alignment_data.h) override the
  // three below: a sample is rows_per_sample() rows (2: a chosen/rejected pair) of ids, targets
  // (-100 where nothing is trained) and positions (each token's position in its document; packed()
  // says they restart inside a row), each row seq_length long. The default: one row, get()'s
  // tokens and their shift, positions 0, 1, ...
  virtual int64_t rows_per_sample() const { return 1; }
  virtual bool packed() const { return false; }
  virtual void get_rows(int64_t i, int64_t* ids, int64_t* targets, int64_t* positions) const;
};

class RandomDataset : public Dataset {
 public:
  RandomDataset(int64_t num_samples, int64_t seq_length, int64_t vocab_size, uint64_t seed);
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return s_; }
  void get(int64_t i, int64_t* out) const override;

 private:
  int64_t n_, s_, v_;
  uint64_t seed_;
};

class SubsetDataset : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices);
  int64_t size() const override { return static_cast<int64_t>(idx_.size()); }
  int64_t seq_length() const override { return base_->seq_length(); }
  void get(int64_t i, int64_t* out) const override { base_->get(idx_.at(i), out); }
  int64_t rows_per_sample() const override { return base_->rows_per_sample(); }
  bool packed() const override { return base_->packed(); }
  void get_rows(int64_t i, int64_t* ids, int64_t* targets, int64_t* positions) const override {
    base_->get_rows(idx_.at(i), ids, targets, positions);
  }
  const std::vector<int64_t>& indices() const { return idx_; }

 private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> idx_;
};

struct Split {
  std::shared_ptr<const Dataset> train, val;  // val is empty when val_fraction == 0
};
// Holds out round(N * val_fraction) samples (at least 1 when val_fraction > 0 and N >= 2),
// chosen by a permutation from the seed; both subsets keep the base order.
Split split_dataset(std::shared_ptr<const Dataset> base, double val_fraction, uint64_t seed);

// A seeded permutation of [0, n) (Fisher-Yates over the counter-based RNG).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t stream);

struct SamplerOptions {
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t dp_rank = 0;
  int64_t dp_size = 1;
  int64_t micro_batch = 1;   // consecutive positions a rank takes at once (DataLoader sets it)
  int64_t accumulation = 1;  // micro batches per rank in one global batch
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t num_samples, SamplerOptions opts);
  int64_t num_samples() const { return n_; }
  // whole global batches only: this rank's micro batches of n / global_batch() of them
  int64_t samples_per_rank() const {
    return n_ / global_batch() * opts_.micro_batch * opts_.accumulation;
  }
  int64_t global_batch() const { return opts_.dp_size * opts_.micro_batch * opts_.accumulation; }
  // This rank's sample order in `epoch` (a new permutation per epoch when shuffling).
  std::vector<int64_t> indices(int64_t epoch) const;
  const SamplerOptions& options() const { return opts_; }

 private:
  int64_t n_;
  SamplerOptions opts_;
};

struct Batch {
  Tensor ids;        // [B, S] i64
  Tensor targets;    // [B, S] i64: ids shifted by one (-100 where a labeled dataset trains nothing)
  Tensor positions;  // [B, S] i64 of a packed dataset (documents restart at 0), else undefined
  Tensor sample_ids;  // [B / rows_per_sample] i64: the dataset's indices of the samples
};
// The samples `indices` of `ds` as one batch (rows_per_sample rows each, in order).
Batch make_batch(const Dataset& ds, const std::vector<int64_t>& indices);
// This rank's rows of every sequence of `b` under context parallelism (the parallel_state CP
// group: its two balanced chunks of ids and of the already shifted targets,
// layers/parallel/context_parallel.h); `b` itself at CP 1. ShapeError if the sequence length does
// not divide by 2 x CP.
Batch context_parallel_batch(const Batch& b);

class DataLoader {
 public:
  // The sampler takes `micro_batch` consecutive positions at once (opts.micro_batch is replaced).
  // Throws ConfigError if the dataset holds fewer samples than one global batch.
  DataLoader(std::shared_ptr<const Dataset> ds, int64_t micro_batch, SamplerOptions opts,
             const std::string& what = "training");
  Batch next();  // the next micro batch; a partial batch at an epoch's end is dropped
  int64_t batches_per_epoch() const { return per_epoch_; }
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return pos_; }  // micro batches taken in the current epoch
  void set_state(int64_t epoch, int64_t position);

 private:
  std::shared_ptr<const Dataset> ds_;
  int64_t b_;
  DistributedSampler sampler_;
  int64_t per_epoch_;
  int64_t epoch_ = 0, pos_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace nxd::trainer
