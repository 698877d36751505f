#pragma once
// Checks of one shard that both load_checkpoint and verify_checkpoint (nxd-ckpt verify) run, so
// that verify passes exactly the checkpoints load accepts (docs/DESIGN.md, "Checkpoints"):
//   - its recorded identity (nxd.kind, nxd.tp_rank, nxd.pp_rank, nxd.dp_rank in __metadata__)
//     is the one its file name says: swapped or copied shard files are refused;
//   - every tensor has a CRC-32C entry (nxd.crc32c.<name>): nxd always writes one, so a missing
//     one is damage (a read without it would check nothing);
//   - model tensors are finite (NaN/Inf weights are refused by load and reported by verify; the
//     trainer never saves a non-finite step, trainer.on_nonfinite).
#include <cstdint>
#include <string>

#include "nxd/checkpoint/error.h"
#include "nxd/io/safetensors.h"

namespace nxd::ckpt::detail {

// CheckpointError naming `prefix` ("[load_checkpoint]"), the file and what disagrees.
void check_shard_identity(const io::SafetensorsHeader& h, const std::string& rel,
                          const std::string& path, const char* prefix);

// The NaN and infinite values among n elements of a floating dtype (0 for integer dtypes).
int64_t count_nonfinite(const void* data, int64_t n, DType dtype);

}  // namespace nxd::ckpt::detail
