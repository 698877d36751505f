#pragma once
// ZeRO-1 optimizer state in a checkpoint (format 2, metadata.json "parallel": {"zero1": true}):
// every DP rank writes its own part of every parameter's state to
// optim/dp_rank_DD_tp_rank_TT_pp_rank_PP.safetensors, as Optimizer::sharded_state() gives it.
// A tensor "<param>.exp_avg" (".exp_avg_sq", ".master") of such a file is f32 [hi - lo]: elements
// [lo, hi) of the flattened TP-local state tensor; "<param>.step" is the parameter's i64 step
// count. The file's "nxd.zero1" metadata records, per parameter it holds, the range and the
// parameter's TP-local shape: {"<param>": {"range": [lo, hi], "shape": [...]}}. A parameter whose
// range is empty on a rank is not in that rank's file. Together the DP files of one (tp, pp) rank
// tile every state tensor exactly once, which index_dp_files checks.
//
// A ZeRO-3 model (format 3, metadata.json "parallel": {"zero3": true}) is written the same way:
// every DP rank writes its block of each unit's flat parameter buffers to
// model/zero3_dp_rank_DD_tp_rank_TT_pp_rank_PP.safetensors, a tensor "<param>" of the saved dtype
// [hi - lo] per parameter with the same "nxd.zero1" ranges; DP rank 0's file also holds the
// tensors outside units whole (range [0, numel)). index_dp_files(kind "model") checks the tiling
// alike.
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "nxd/checkpoint/error.h"
#include "nxd/io/safetensors.h"
#include "nxd/optim/optimizer.h"

namespace nxd::ckpt::detail {

inline constexpr const char* kZero1Key = "nxd.zero1";

// The "nxd.zero1" metadata of a file holding `records`.
std::string zero1_json(const std::vector<const optim::StateShard*>& records);

// One file's share of a logical state tensor: its tensor holds elements [lo, hi) of the
// flattened tensor (a scalar step: [0, 1)).
struct Piece {
  std::string file;  // relative to the checkpoint folder
  int64_t lo = 0, hi = 0;
};

// The state tensors of one (tp, pp) rank as its DP files hold them.
struct DpIndex {
  struct Entry {
    DType dtype = DType::f32;
    Shape shape;                // TP-local shape of the whole tensor ([] for a step)
    std::vector<Piece> pieces;  // by lo (a step: every file that has it)
    bool step = false;          // an optimizer step count: every file holds all of it
  };
  std::map<std::string, Entry> tensors;  // by state tensor name ("<param>.exp_avg", ...)
  struct File {
    std::string rel;
    int64_t bytes = 0, tensors = 0;
    io::SafetensorsHeader header;
  };
  std::vector<File> files;  // dp rank order
};

// The ZeRO-1 files of one (tp, pp) rank: one per DP rank. kind "optim" (ZeRO-1 state) or "model"
// (ZeRO-3 blocks: a tensor named as its parameter, in any dtype, no step).
struct DpFiles {
  int dp_size = 1, tp_rank = 0, pp_rank = 0;
  bool compressed = false;
  std::string kind = "optim";
};
// Reads the headers of the dp_size files of `f` and checks them: "nxd.zero1" parses, every tensor
// belongs to a listed parameter with the listed range, and the ranges of every state tensor tile
// it exactly. CheckpointError naming the file and tensor otherwise; a missing file is named
// together with the first tensor whose elements no other file holds.
DpIndex index_dp_files(const std::filesystem::path& dir, const DpFiles& f);

}  // namespace nxd::ckpt::detail
