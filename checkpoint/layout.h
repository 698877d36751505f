#pragma once
// Internals shared by save and load: file names of a checkpoint, the parallel degrees of this
// rank, and the world-wide agreement on success that keeps a failing rank from hanging the rest.
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "nxd/checkpoint/error.h"
#include "nxd/checkpoint/reshard.h"
#include "nxd/io/safetensors.h"

namespace nxd::ckpt::detail {

struct Degrees {
  int world = 1, rank = 0;
  int tp = 1, pp = 1, dp = 1;
  int tp_rank = 0, pp_rank = 0, dp_rank = 0;
  // Context parallelism: dp and dp_rank count the DP x CP ranks (CP ranks hold the same
  // parameters as DP ranks do); data_rank is the DP index alone (dp_rank = data_rank * cp +
  // cp_rank).
  int cp = 1, cp_rank = 0, data_rank = 0;
  // Expert parallelism: expert-DP rank 0 of EP rank e (data x context rank e: parallel_state
  // folds EP over DP x CP) writes the MoE experts it holds into the model/optim files of "DP"
  // rank e (rank 0's also have everything else). Its experts' ZeRO-1 parts are sharded over the
  // expert-DP group, which spans CP: every rank writes its own (each part is held once).
  int ep = 1, ep_rank = 0;
  int expert_dp = 1, expert_dp_rank = 0;  // the expert-data-parallel group (DP x CP / EP ranks)
  // The "DP" index of the files holding this rank's experts, or -1 if it writes none.
  int expert_file() const { return expert_dp_rank == 0 ? ep_rank : -1; }
};
// This rank's place in parallel_state (TP = PP = 1 in a one-rank world that never set it up).
Degrees current_degrees();

inline constexpr const char* kMarker = "checkpoint";
inline constexpr const char* kDone = "done";
inline constexpr const char* kMetadata = "metadata.json";
inline constexpr const char* kScheduler = "scheduler.json";
inline constexpr const char* kUserContent = "user_content.json";

// "model/dp_rank_00_tp_rank_01_pp_rank_00.safetensors" (+ ".zst" when compressed); a ZeRO-3
// model block ("parallel": {"zero3": true}, dp_shards.h) "model/zero3_dp_rank_00_...": the
// model's "dp_rank_EE_" files are EP rank EE's experts.
enum class ShardFiles { whole, zero3_blocks };
struct ShardName {
  int dp_rank = 0, tp_rank = 0, pp_rank = 0;
  bool compressed = false;
  ShardFiles files = ShardFiles::whole;
};
std::string shard_file(const std::string& kind, const ShardName& s);

// Runs f() on every rank and agrees on the outcome: if any rank threw, every rank throws (the
// lowest failing rank's exception is rethrown there; the others get a CheckpointError carrying
// its message). `what` prefixes the message ("[save_checkpoint]").
void run_agreed(const char* what, const std::function<void()>& f);
// Global rank 0's string on every rank.
std::string broadcast_string(const std::string& s);

// The split of every parallel-tagged tensor of `model`, by name (unsplit ones are absent).
std::map<std::string, ShardSpec> model_specs(const std::vector<const Module*>& chunks);
// The split recorded in a shard's metadata ("nxd.parallel"), by tensor name.
std::map<std::string, ShardSpec> specs_of(const io::SafetensorsHeader& h, const std::string& file);

// Removes complete checkpoints beyond `keep` (done first, then files) and incomplete marked
// folders other than `current`.
void apply_retention(const std::filesystem::path& path, int keep, const std::string& current);

}  // namespace nxd::ckpt::detail
