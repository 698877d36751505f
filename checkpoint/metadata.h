#pragma once
// metadata.json of a checkpoint, parsed and validated before anything reads its fields, so a
// damaged or hand-edited file gives a CheckpointError naming it and the offending key instead of
// a wrong read, a division by zero or an allocation of a nonsense size. A fuzz target
// (tests/checkpoint/fuzz_metadata.cpp); read_metadata() (checkpoint.h) uses it.
#include <nlohmann/json.hpp>
#include <string>

namespace nxd::ckpt {

// The newest metadata.json format_version this nxd reads. A checkpoint records the oldest version
// that describes it: 1 (every optimizer tensor whole in DP rank 0's file; all checkpoints of
// earlier nxd versions, ZeRO-1 ones included, which saved AdamW's gathered layout), 2 (ZeRO-1
// state in per-DP-rank files) or 3 (a ZeRO-3 model in per-DP-rank blocks, "parallel": {"zero3":
// true}, checkpoint/dp_shards.h). All load; a newer version is refused naming it (so an nxd that
// reads up to 2 refuses a format-3 checkpoint cleanly).
inline constexpr int kFormatVersion = 3;

// The checks: a JSON object with "format": "nxd-checkpoint" and an integer "format_version" from
// 1 to kFormatVersion (a newer one is refused naming it and the nxd that wrote it); "parallel"
// with positive integers world = tp x pp x dp and optional booleans zero1 (true only from
// format 2 on) and zero3 (true only from format 3 on); "files": relative paths inside the
// checkpoint (no "..", not absolute) to
// {"bytes" >= 0, optional "tensors" >= 0}; optional string tag / nxd_version, integer step >= 0,
// boolean compressed, object model_config, integer expert_parallel (EP, dividing dp); "model" and
// "optimizer"."tensors" tables of name -> {"dtype": F32 | BF16 | F64 | I32 | I64, "shape":
// non-negative integers, "pp_rank": 0 <= r < pp, optional "split" (checkpoint/reshard.h) that the
// shape divides into, optional "dp_rank": 0 <= r < EP (the files of a MoE expert's EP rank)};
// "optimizer"."info" with string kind, integer steps >= 0 and groups of {string name, numbers lr,
// weight_decay, lr_scale, params: strings}. `file` names the source in the errors.
nlohmann::json parse_metadata(const std::string& text, const std::string& file);

// The layout a metadata.json that parse_metadata accepted records; keys that older checkpoints
// lack take the value they meant.
struct SavedLayout {
  int world = 1, tp = 1, pp = 1, dp = 1;  // dp: DP x CP ranks
  int ep = 1;                             // expert_parallel (absent: 1)
  bool zero1 = false;       // ZeRO-1 optimizer state in per-DP-rank files (absent: no)
  bool zero3 = false;       // the model in per-DP-rank ZeRO-3 blocks (absent: no)
  bool compressed = false;  // zstd shards, named .safetensors.zst (absent: no)
};
SavedLayout saved_layout(const nlohmann::json& meta);

}  // namespace nxd::ckpt
