#pragma once
// Cutting a CausalLM into pipeline stages: the embedding goes with stage 0, the final norm, head
// and loss with the last stage, and the decoder layers are split into contiguous runs, each stage
// holding at least one layer (NxD's NxDPPModel partitions a model the same way).
#include <cstdint>
#include <string>
#include <vector>

#include "nxd/layers/models/config.h"

namespace nxd::pipeline {

// The prefix of decoder layer names: "model.layers." (llama) or "gpt_neox.layers.".
std::string layer_prefix(const ModelConfig& cfg);

// NxD's pipeline_cuts: each name is a decoder layer ("model.layers.3") after which a new stage
// starts; num_stages - 1 increasing cuts give num_stages parts. ConfigError naming the cut for an
// unknown or out-of-order name, a count that does not match, or a stage left without layers.
std::vector<ModelPart> partition_by_cuts(const ModelConfig& cfg,
                                         const std::vector<std::string>& cuts, int num_stages);

// Parameter elements of the whole model (at TP = 1) by piece: each decoder layer, the embedding,
// and the final norm + untied head.
struct ParameterCounts {
  std::vector<int64_t> layers;
  int64_t embedding = 0;
  int64_t head = 0;  // final norm + output head (0 for a tied head's weight)
};
ParameterCounts count_parameters(const ModelConfig& cfg);
// Elements a part holds (a tied last stage counts its copy of the embedding).
int64_t part_parameters(const ModelConfig& cfg, const ParameterCounts& counts,
                        const ModelPart& part);

// auto_partition: contiguous layer runs minimizing the largest stage's parameter count (the
// embedding counted on stage 0, the head on the last stage); ties go to the earliest cut.
// ConfigError when num_layers < num_stages.
std::vector<ModelPart> auto_partition(const ModelConfig& cfg, int num_stages);

}  // namespace nxd::pipeline
