#pragma once
// The reading half of load_checkpoint: every tensor a rank needs is read from the saved shards
// into a staging tensor, resharded on the way when the TP split differs, and verified; nothing
// live is written here (load.cpp commits the staged tensors once every rank succeeded).
//
// Sources: a "model" tensor, or an "optim" tensor of an unsharded optimizer, is read whole from
// the DP rank 0 file of its (tp, pp) rank. The state of a ZeRO-1 optimizer (metadata.json
// "parallel": {"zero1": true}) is assembled from the DP files of its (tp, pp) rank
// (checkpoint/dp_shards.h), which works for any saved DP degree; so is every model tensor of a
// ZeRO-3 checkpoint with per-rank blocks ("parallel": {"zero3": true}). Targets: a whole (TP-local)
// tensor, or elements [lo, hi) of one flattened (a ZeRO-1 optimizer's own part of its state).
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "nxd/checkpoint/dp_shards.h"
#include "nxd/checkpoint/layout.h"

namespace nxd::ckpt::detail {

// One tensor wanted by this rank.
struct Want {
  std::string name;
  Tensor target;            // where it is committed (or a stand-in with its shape and dtype)
  Tensor staged;            // the target's shape and dtype, filled from the checkpoint
  ShardSpec spec;           // how the whole tensor is split at this rank's TP degree
  Shape local;              // the whole TP-local shape (= target's unless a range)
  int64_t lo = 0, hi = -1;  // a range of the flattened whole tensor (hi < 0: all of it)
  bool ranged() const { return hi >= 0; }
};

class Stager {
 public:
  Stager(std::filesystem::path dir, const nlohmann::json& meta, const Degrees& d);

  struct StageOptions {
    bool strict = true;             // a want the table lacks is an error naming it (else dropped)
    bool check_unexpected = false;  // strict also refuses table names no want has
  };
  // Fills every want.staged from the table `kind` ("model" or "optim") of metadata.json (name ->
  // {dtype, shape, pp_rank, split}).
  void stage(const char* kind, const nlohmann::json& table, std::vector<Want>& wants,
             StageOptions opts);

 private:
  // A copy of elements [src, src + n) of a file's tensor to `dst`.
  struct Copy {
    int64_t src = 0, n = 0;
    char* dst = nullptr;
  };
  struct FileTensor {
    DType dtype = DType::f32;
    Shape shape;
    std::vector<Copy> copies;
  };
  // A want whose TP split differs from the saved one: the saved shards covering the whole tensor.
  struct Gather {
    Want* want;
    Tensor full;
    ShardSpec saved;
    std::vector<std::pair<int64_t, Tensor>> parts;  // saved tp rank, its shard
  };
  // Checks one want against its table entry and schedules its reads (or a gather).
  void plan(const char* kind, const nlohmann::json& entry, Want& w);
  // Schedules the read of elements [lo, hi) of the flattened TP-local tensor `name` saved by
  // (tp, pp) into dst (hi - lo elements of `dtype`).
  void fetch(const char* kind, const std::string& name, int tp, int pp, const Shape& local,
             DType dtype, int64_t lo, int64_t hi, char* dst, int dp = 0);
  const DpIndex& dp_index(const char* kind, int tp, int pp);
  // Whether `kind`'s tensors are in per-DP-rank files (ZeRO-1 optim, ZeRO-3 model).
  bool in_dp_files(const char* kind) const;
  void read_file(const std::string& rel, std::map<std::string, FileTensor>& tensors);

  std::filesystem::path dir_;
  Degrees d_;
  int saved_tp_ = 1, saved_dp_ = 1;
  bool compressed_ = false, zero1_ = false, zero3_ = false;
  std::map<std::tuple<std::string, int, int>, DpIndex> dp_;         // by (kind, tp, pp)
  std::map<std::string, std::map<std::string, FileTensor>> reads_;  // by file, tensor
  std::vector<Gather> gathers_;
};

}  // namespace nxd::ckpt::detail
