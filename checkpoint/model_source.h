#pragma once
// Where an inference tool's model comes from (nxd-generate, nxd-serve): an nxd checkpoint, a
// quantized checkpoint (checkpoint/quantized.h), a transformers folder or a GGUF file, with LoRA
// adapters merged; resolved once before any rank starts (a bad path or config is found before
// the ranks run), then built on every rank.
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "nxd/checkpoint/quantized.h"
#include "nxd/layers/models/causal_lm.h"

namespace nxd::ckpt {

// A checkpoint holding LoRA adapters: merged into its weights, or refused (ConfigError).
enum class LoraCheckpoints { merge, refuse };

struct ModelSourceOptions {
  std::string tool;  // names the errors: "nxd-generate"
  // exactly one of these
  std::string checkpoint;  // an nxd checkpoint (DIR/<tag> or a folder of them), or quantized
  std::string hf;          // a transformers folder
  std::string gguf;        // a GGUF file
  std::string lora;        // a PEFT adapter folder merged into the weights (not with quantized)
  int tp = 1;
  LoraCheckpoints lora_checkpoints = LoraCheckpoints::merge;
  // Called with the config before any weights are read (e.g. a memory check); `source` names
  // the file the config came from.
  std::function<void(const ModelConfig&, const std::string& source)> check_config;
};

struct ModelSource {
  ModelConfig cfg;                     // for inference: no sequence parallelism, no dropout
  std::filesystem::path tag_dir;       // an nxd checkpoint's folder
  std::string hf_dir;                  // names the source of `full`
  std::map<std::string, Tensor> full;  // full tensors (read-only, shared by sim ranks)
  std::shared_ptr<const QuantizedCheckpoint> quantized;  // a quantized checkpoint
  // A GGUF file's q8_0 / q4_0 output head, kept quantized (gguf_quantized_head); null otherwise.
  std::shared_ptr<const QuantizedCheckpoint> head;
};

ModelSource resolve_model_source(const ModelSourceOptions& o);

// Sets o's source from one path (a draft model's): a regular file is a GGUF file, a folder with a
// config.json a transformers folder, anything else an nxd checkpoint.
void set_source_path(ModelSourceOptions& o, const std::string& path);

// This rank's model with its weights (parallel_state already set up).
std::shared_ptr<CausalLM> build_model(const ModelSource& s);

}  // namespace nxd::ckpt
