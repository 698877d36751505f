#pragma once
// Quantized checkpoints: a causal LM whose decoder linear layers are int8 or int4 (layers/
// quantize.h), quantized once by `nxd-ckpt quantize` and loaded by nxd-generate and nxd-serve
// without the f32/bf16 weights. Layout (version 1; docs/design/quantization.md):
//
//   OUT/quantized.safetensors, the whole (TP 1) model, nxd's safetensors (io/safetensors.h: one
//   CRC-32C per tensor, checked by every read), with per quantized layer L (weight name W):
//     W.qweight  I32 [out, ceil(row_bytes / 4)]: each row's bytes, little-endian, zero padded to a
//                whole word (GPTQ's packing of bytes into I32): int8 one signed byte per input;
//                int4 16 bytes per 32 inputs (runtime/kernels/gemv_int4.h's block layout)
//     W.scales   F32 [out, 1] (int8, one per row) or [out, ceil(in / group)] (int4)
//     W.mins     F32 [out, ceil(in / group)] (int4 asymmetric only)
//   and every other tensor of the model (embedding, norms, output head, biases) by its name, in
//   its dtype. __metadata__: nxd.quantized.layout "1", nxd.quantized.format "int8" | "int4",
//   nxd.quantized.group (int4: "32" | "64" | "128"), nxd.quantized.zero (int4: "symmetric" |
//   "asymmetric"), nxd.quantized.layers (JSON list of the quantized W), nxd.model_config.
//   Layout 2 is layout 1 with the output head quantized too: nxd.quantized.head "int8" | "int4"
//   (int4 in the layers' group and zero point) and the head's H.qweight, H.scales (H.mins) with H
//   its weight's name; an untied head's H itself is absent, a tied head's H is the embedding,
//   which stays (the input lookup reads it). Files without a quantized head are written as 1.
//
// Loading at TP N takes each rank's rows (and their scales) and columns as the unquantized
// layers split them (the parameter's parallel attributes); a row-parallel int8 layer keeps its
// rows' whole scales, an int4 one its groups. The result equals quantizing at load at TP N.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nxd/layers/models/causal_lm.h"
#include "nxd/layers/quantize.h"

namespace nxd::ckpt {

inline constexpr const char* kQuantizedFile = "quantized.safetensors";
inline constexpr int kQuantizedLayout = 2;  // the newest this nxd reads (and 1)

// True when `dir` is a folder holding quantized.safetensors.
bool is_quantized_checkpoint(const std::filesystem::path& dir);

// A quantized checkpoint read into memory (shared read-only by the sim ranks).
struct QuantizedCheckpoint {
  std::filesystem::path file;
  int layout = 1;  // nxd.quantized.layout
  ModelConfig cfg;
  QuantizeOptions opts;             // format, group, zero point
  std::vector<std::string> layers;  // the quantized weights' names
  std::map<std::string, Tensor> tensors;
};

// Reads and checks the file: every tensor's checksum, the metadata (layout version, format, group,
// zero point, model_config), and per listed layer its tensors' dtypes and shapes against each
// other. CheckpointError naming the file and the key otherwise.
QuantizedCheckpoint read_quantized_checkpoint(const std::filesystem::path& dir);

// Loads this rank's shard into m (built from q.cfg at this TP degree): the unquantized tensors,
// and each listed layer's quantized weight. Checks that the listed layers are exactly the
// quantizable layers quantize_causal_lm would quantize, their shapes and scale counts.
// CheckpointError naming the file and key otherwise. Not collective.
void load_quantized_weights(CausalLM& m, const QuantizedCheckpoint& q);

// Sets m's output head (this rank's rows) from q's head tensors in the format q.opts.head (the
// head part of load_quantized_weights, which calls it); an untied head's f32/bf16 weight is freed.
// Returns the head's weight name. CheckpointError naming the file and key. Not collective.
std::string load_quantized_head(CausalLM& m, const QuantizedCheckpoint& q);

struct QuantizeCheckpointReport {
  QuantizeSummary summary;  // the decoder's linear layers
  QuantizeSummary head;     // the output head (layers 0: unquantized)
  int64_t tensors = 0;      // in the file
  int64_t file_bytes = 0;
};

// Quantizes the model of the nxd checkpoint tag_dir (TP 1, as quantize_causal_lm does at load)
// into out_dir/quantized.safetensors. out_dir must be absent or an empty folder (IoError naming
// it otherwise: nothing is overwritten).
QuantizeCheckpointReport quantize_checkpoint(const std::filesystem::path& tag_dir,
                                             const std::filesystem::path& out_dir,
                                             const QuantizeOptions& opts);

struct QuantizedVerifyReport {
  int64_t tensors = 0, layers = 0, bytes = 0;
  std::string format;  // describe(opts)
};
// Everything the loader checks: reads the file and loads it into a TP-1 model.
QuantizedVerifyReport verify_quantized_checkpoint(const std::filesystem::path& dir);

}  // namespace nxd::ckpt
