#pragma once
// Llama models as GGUF files (io/gguf.h), both ways, as llama.cpp's convert_hf_to_gguf.py writes
// them and its llama loader reads them:
//   names    model.embed_tokens.weight -> token_embd.weight, model.norm.weight ->
//            output_norm.weight, lm_head.weight -> output.weight (absent when tied), and per
//            layer i: input_layernorm -> blk.i.attn_norm, self_attn.{q,k,v,o}_proj ->
//            blk.i.attn_{q,k,v,output}, post_attention_layernorm -> blk.i.ffn_norm,
//            mlp.{gate,up,down}_proj -> blk.i.ffn_{gate,up,down};
//   rotary   q_proj and k_proj rows permuted from transformers' half-split rotary layout to
//            ggml's interleaved one (each head's rows [h0 | h1] become pairs (h0[i], h1[i])),
//            undone on import;
//   metadata general.architecture = llama, llama.{context_length, embedding_length, block_count,
//            feed_forward_length, rope.dimension_count, attention.head_count,
//            attention.head_count_kv, attention.layer_norm_rms_epsilon, rope.freq_base,
//            vocab_size}, general.file_type; with a tokenizer.json (byte-level BPE), its
//            vocabulary and merges as tokenizer.ggml.* (model "gpt2").
// Tensor types: f32, f16, bf16, q8_0, q4_0 for the matrices (a matrix whose rows are not a
// multiple of 32 values stays f16 under q8_0/q4_0, as llama-quantize falls back); the norms stay
// f32. Anything a file or a model has that this mapping does not cover (another architecture,
// rope scaling, biases, another tensor) is refused by name.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nxd/checkpoint/quantized.h"
#include "nxd/io/gguf.h"
#include "nxd/layers/models/config.h"
#include "nxd/runtime/tensor.h"

namespace nxd::ckpt {

struct GgufExportOptions {
  io::GgmlType type = io::GgmlType::f32;
  std::string tokenizer;  // a tokenizer.json whose vocabulary goes into the file; empty: none
};

struct GgufExportReport {
  int64_t tensors = 0;
  int64_t bytes = 0;     // of the file
  int64_t kept_f16 = 0;  // matrices left f16 (rows not a multiple of 32)
  bool has_tokenizer = false;
};

// Writes the model of the checkpoint tag_dir (any degrees it was saved at) to `out` (must not
// exist). CheckpointError naming what the mapping does not cover.
GgufExportReport export_gguf(const std::filesystem::path& tag_dir, const std::filesystem::path& out,
                             const GgufExportOptions& opts);

// The model of a GGUF file: its config and full f32 tensors under nxd's names.
struct GgufModel {
  ModelConfig cfg;
  std::map<std::string, Tensor> full;
  std::string description;  // "llama, 2 layers, hidden 32, q8_0"
  // The output head's weight (output.weight, or token_embd.weight when tied) as the file stores
  // it: head_name its nxd name, head_type its GGML type, head_bytes its raw bytes.
  std::string head_name;
  io::GgmlType head_type = io::GgmlType::f32;
  std::vector<uint8_t> head_bytes;
};
GgufModel read_gguf_model(const std::filesystem::path& file);

// A q8_0 or q4_0 output head kept quantized (nxd-generate / nxd-serve --gguf): the head's tensors
// in the quantized-checkpoint layout (checkpoint/quantized.h: H.qweight, H.scales; opts.head the
// format) for load_quantized_head. q4_0 blocks are int4 groups of 32 exactly (each block's f16
// scale d as the group's scale, its codes q as the values: Q4_0's (q - 8) * d is the int4 kernel's
// (u - 8) * scale); q8_0's per-block scales have no int8 counterpart (one scale per row), so its
// f32 values are requantized to int8 per row (a second rounding, at most half the row's scale).
// Null for any other type (the head stays f32).
std::shared_ptr<const QuantizedCheckpoint> gguf_quantized_head(const GgufModel& g,
                                                               const std::string& file);

// read_gguf_model into a checkpoint at the given degrees (as import_hf).
void import_gguf(const std::filesystem::path& file, const std::filesystem::path& out_root,
                 const std::string& tag, int tp, int dp);

// The rotary row permutation of q_proj/k_proj (rows = heads * head_dim, any columns): to ggml's
// layout, and back.
Tensor permute_rotary_to_ggml(const Tensor& w, int64_t heads);
Tensor permute_rotary_from_ggml(const Tensor& w, int64_t heads);

}  // namespace nxd::ckpt
