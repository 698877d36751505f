#pragma once
// The inside of save_checkpoint shared by its two files: a rank's plan (save.cpp builds it and
// writes its files) and global rank 0's completion of the checkpoint (save_complete.cpp).
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "nxd/checkpoint/checkpoint.h"
#include "nxd/checkpoint/layout.h"

namespace nxd::ckpt::detail {

struct Shard {
  std::string file;  // relative to the tag folder
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> meta;
};

struct SavePlan {
  std::filesystem::path path,
      dir;  // dir: where the files go (path/tag, or the aside folder of a re-save)
  std::string tag;
  bool swap = false;  // re-saving a complete tag: dir is aside, swapped in once complete
  SaveOptions opts;
  Degrees deg;
  bool has_model = false, has_optim = false;
  bool zero1 = false;  // the optimizer's state is sharded over DP: one file per DP rank
  bool zero3 = false;  // the model's ZeRO-3 blocks: one file per DP rank (format 3)
  int64_t step = 0;
  nlohmann::json model_config = nullptr;  // a CausalLM's config (what offline resharding rebuilds)
  nlohmann::json lora = nullptr;  // the adapters' config (lora_json), when the model has any
  std::vector<Shard> shards;      // this rank's files
  std::vector<std::pair<std::string, std::string>> texts;  // this rank's JSON files
};

// Global rank 0, after every rank wrote its files: metadata.json from the shards' headers (so
// every shard exists and parses before the checkpoint counts), then done, then retention (and a
// re-save swapped in).
void complete(const SavePlan& p);

}  // namespace nxd::ckpt::detail
