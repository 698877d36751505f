#pragma once
// Sharded checkpoints (NxD's save_checkpoint / load_checkpoint), crash-safe and reshardable.
//
// Layout of one checkpoint, <path>/<tag>/ (docs/design/checkpoint.md, "Checkpoints"):
//   checkpoint                 marker: this folder is an nxd checkpoint (written first)
//   model/dp_rank_00_tp_rank_TT_pp_rank_PP.safetensors      parameters and persistent buffers of
//                              one (tp, pp) rank, written by its DP rank 0 (a ZeRO-3 model:
//                              model/zero3_dp_rank_DD_..., every DP rank its blocks, dp_shards.h)
//   optim/dp_rank_DD_tp_rank_TT_pp_rank_PP.safetensors      optimizer state. Unsharded (AdamW,
//                              SGD): every state tensor whole, written by DP rank 0 (DD = 00).
//                              Sharded over DP (ZeRO-1, Optimizer::state_is_sharded()): every DP
//                              rank writes the part of each parameter's state it holds
//                              (checkpoint/dp_shards.h), with no collective gather
//   scheduler.json, user_content.json                       written by global rank 0
//   metadata.json              format version, parallel degrees (and zero1: whether the optimizer
//                              state is in per-DP-rank files), step, every file with its size,
//                              every tensor with dtype, full shape and split (ZeRO-1 state too:
//                              the whole tensors the DP files hold parts of)
//   done                       written last, after every rank finished: the checkpoint counts
//                              only once it exists
// Shards are safetensors files (".safetensors.zst" when compressed) with a CRC-32C per tensor;
// every tensor keeps its Module::state_dict() name on every TP and PP rank, and each shard records
// how its tensors are split (nxd.parallel in __metadata__), so a checkpoint loads into other TP, PP
// or DP degrees than it was saved with, and ZeRO-1 state loads into ZeRO-1 at any DP degree or
// into AdamW (and AdamW's into ZeRO-1).
//
// Every call is collective over the world: every rank calls it with the same arguments. A rank
// that fails makes every rank throw (the failing rank its own error, the others a
// CheckpointError naming that rank and its message) instead of leaving them waiting.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "nxd/checkpoint/error.h"
#include "nxd/checkpoint/metadata.h"
#include "nxd/layers/module.h"
#include "nxd/optim/lr_schedule.h"
#include "nxd/optim/optimizer.h"

namespace nxd::ckpt {

// How a ZeRO-3 model (one with units: optim/zero1.h stage three) is written
// (docs/design/fsdp.md, "Checkpoints").
enum class Zero3ModelFiles {
  // Every DP rank writes its block of each unit's flat parameter buffers to
  // model/zero3_dp_rank_DD_... (dp_shards.h; format 3): no gather, no host copy of the model.
  // With expert parallelism (EP > 1) the experts' blocks are over expert-DP, in the same files.
  per_rank,
  // Each unit gathered in turn and DP rank 0 writing whole tensors (format 1 or 2: what an nxd
  // older than format 3 reads); one unit's full buffers on the device, the model on the host.
  gathered,
};

struct SaveOptions {
  // Keep only the newest this many complete checkpoints under `path` (0: keep all). Older ones
  // lose their `done` marker first, then their files; incomplete checkpoints left by a crash are
  // removed too.
  int num_kept_ckpts = 0;
  // Copy the tensors (the only stall) and write them on a background thread while training goes
  // on. The checkpoint is completed (metadata, done, retention) by the next save_checkpoint or
  // finalize_checkpoint(), which wait for the writer.
  bool async_save = false;
  bool compress = false;  // zstd
  int zstd_level = 1;
  bool sync = true;   // fsync files and folders (off only for benchmarks of the page cache)
  int64_t step = -1;  // recorded in metadata.json; -1: the optimizer's steps() (or 0)
  // NxD's down_cast_bf16 (NxD Training's exp_manager.save_bf16): the model's floating tensors
  // are written in bf16 (rounded to nearest even), half the bytes of f32 weights; the optimizer
  // state, f32 master weights included, is written as held. load_checkpoint converts such model
  // tensors to the target's dtype (bf16 into an f32 run: exact).
  bool down_cast_bf16 = false;
  Zero3ModelFiles zero3_files = Zero3ModelFiles::per_rank;
};

struct SaveStats {
  double stall_seconds = 0;  // time the caller was blocked (async: the snapshot copy)
  int64_t bytes = 0;         // tensor bytes this rank wrote (or will write)
};

// Saves model (parameters and persistent buffers), optimizer state, scheduler and user content
// (any may be null / empty) as <path>/<tag>/. Re-saving a complete tag writes the new one aside
// (<path>/.<tag>.saving/) and exchanges the two folders once it is complete: a crash at any
// moment leaves a complete checkpoint under the tag. Re-saving an incomplete one replaces it.
SaveStats save_checkpoint(const std::filesystem::path& path, const std::string& tag,
                          const Module* model, const optim::Optimizer* optimizer,
                          const optim::LRSchedule* scheduler,
                          const nlohmann::json& user_content = nullptr,
                          const SaveOptions& opts = {});

// The same for a model held as several modules on this rank: the chunks of a pipeline stage
// (PipelineModel::chunks(), each with the whole model's parameter names). Names must be unique
// across the chunks of a rank; a tied weight held by two stages is saved by both, equal.
SaveStats save_checkpoint(const std::filesystem::path& path, const std::string& tag,
                          const std::vector<const Module*>& model_chunks,
                          const optim::Optimizer* optimizer, const optim::LRSchedule* scheduler,
                          const nlohmann::json& user_content = nullptr,
                          const SaveOptions& opts = {});

// Waits for this rank's pending async save, then completes it. Collective; a no-op without one.
void finalize_checkpoint();

struct LoadOptions {
  std::string tag;     // empty: the newest complete checkpoint under path
  bool strict = true;  // names must match both ways (else missing ones are left unchanged)
};

// Loads <path>/<tag>/ into model, optimizer and scheduler (any may be null), resharding when the
// TP, PP or DP degrees differ from the saved ones, and returns the user content (null if none).
// Everything is read and verified into staging tensors first and copied into the model and
// optimizer only when every rank succeeded: a bad checkpoint (missing or truncated file, flipped
// byte, missing DP shard, other model, newer format) throws CheckpointError naming the file and
// tensor and leaves them untouched. The optimizer must be the same kind (AdamW, SGD, Lion, a
// user's; ZeRO-1 has its rule's kind: either state loads into either optimizer, at any DP
// degree); at TP > 1 resharding its state needs the model too. A model tensor saved in another
// floating dtype (SaveOptions::down_cast_bf16) is converted to the target's.
nlohmann::json load_checkpoint(const std::filesystem::path& path, Module* model,
                               optim::Optimizer* optimizer, optim::LRSchedule* scheduler,
                               const LoadOptions& opts = {});

// The same for a model held as several modules on this rank (a pipeline stage's chunks). With
// PP > 1 each stage loads the names it holds; names of the checkpoint that no stage holds are
// not detected (strict covers only names missing from the checkpoint).
nlohmann::json load_checkpoint(const std::filesystem::path& path,
                               const std::vector<Module*>& model_chunks,
                               optim::Optimizer* optimizer, optim::LRSchedule* scheduler,
                               const LoadOptions& opts = {});

// ---- inspection (not collective) ----
struct TagInfo {
  std::string tag;
  bool complete = false;
  int64_t seq = -1;  // save order among complete checkpoints (from `done`)
};
// Every checkpoint folder under path (those with the `checkpoint` marker), complete ones in save
// order first (oldest to newest), then incomplete ones by name.
std::vector<TagInfo> list_checkpoints(const std::filesystem::path& path);
// The newest complete tag, if any.
std::optional<std::string> newest_checkpoint(const std::filesystem::path& path);
bool has_checkpoint(const std::filesystem::path& path);
// Removes one checkpoint: its done marker first (so it stops counting), then its folder. Not
// collective: call it on one rank, after any async save of it was finalized.
void remove_checkpoint(const std::filesystem::path& path, const std::string& tag);
// metadata.json of a complete checkpoint, validated (parse_metadata, checkpoint/metadata.h);
// CheckpointError otherwise.
nlohmann::json read_metadata(const std::filesystem::path& tag_dir);

}  // namespace nxd::ckpt
