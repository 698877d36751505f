#pragma once
// Checks of one shard that both load_checkpoint and verify_checkpoint (nxd-ckpt verify) run, so
// that verify passes exactly the checkpoints load accepts (docs/design/checkpoint.md,
// "Checkpoints"):
//   - its recorded identity (nxd.kind, nxd.tp_rank, nxd.pp_rank, nxd.dp_rank in __metadata__)
//     is the one its file name says: swapped or copied shard files are refused;
//   - every tensor has a CRC-32C entry (nxd.crc32c.<name>): nxd always writes one, so a missing
//     one is damage (a read without it would check nothing);
//   - model tensors are finite (NaN/Inf weights are refused by load and reported by verify; the
//     trainer never saves a non-finite step, trainer.on_nonfinite);
//   - every file metadata.json lists is there with the byte count it records (shards too);
//   - a JSON side file (scheduler.json, user_content.json) is a regular file of the size
//     metadata.json records, nested at most 64 deep; scheduler.json is a valid schedule, also
//     when the load restores no scheduler; user_content.json's trainer section (the loop state
//     the Trainer saves) holds integers in range (a step of 1e15 is refused naming the key).
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "nxd/checkpoint/error.h"
#include "nxd/io/safetensors.h"
#include "nxd/optim/lr_schedule.h"

namespace nxd::ckpt::detail {

// CheckpointError naming `prefix` ("[load_checkpoint]"), the file and what disagrees.
void check_shard_identity(const io::SafetensorsHeader& h, const std::string& rel,
                          const std::string& path, const char* prefix);

// The NaN and infinite values among n elements of a floating dtype (0 for integer dtypes).
int64_t count_nonfinite(const void* data, int64_t n, DType dtype);

// The JSON side file `rel` of the checkpoint at tag_dir, read through the I/O floor's limits and
// checked against its metadata.json entry (`meta`: the parsed metadata.json) before parsing.
nlohmann::json read_side_file(const std::filesystem::path& tag_dir, const std::string& rel,
                              const nlohmann::json& meta, const char* prefix);
// scheduler.json as schedule options, validated as LRSchedule validates them.
optim::LRScheduleOptions read_scheduler(const std::filesystem::path& tag_dir,
                                        const nlohmann::json& meta, const char* prefix);

// The counters of user_content.json's "trainer" section (step, data.epoch, data.position, ...)
// as integers in [0, kMaxLoopCount]: CheckpointError naming the key and `path` otherwise. Other
// sections are the user's own and are not checked.
inline constexpr int64_t kMaxLoopCount = int64_t{1} << 40;  // ~1.1e12 steps or batches
void check_user_content(const nlohmann::json& user, const std::string& path, const char* prefix);

// The checks of metadata.json's file list that load and verify share (the one list): every listed
// file is there with the byte count metadata.json records (a ZeRO-1 optimizer shard or ZeRO-3
// model block file that is missing is left to dp_shards.h, which names the tensors it held),
// scheduler.json is a valid schedule and user_content.json passes check_user_content. Returns the
// two side files' values.
struct SideFiles {
  std::optional<optim::LRScheduleOptions> scheduler;  // when scheduler.json is listed
  nlohmann::json user = nullptr;                      // user_content.json (null: none)
};
SideFiles check_listed_files(const std::filesystem::path& tag_dir, const nlohmann::json& meta,
                             const char* prefix);

}  // namespace nxd::ckpt::detail
