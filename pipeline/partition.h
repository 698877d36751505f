#pragma once
// Cutting a CausalLM into pipeline stages: the embedding goes with stage 0, the final norm, head
// and loss with the last stage, and the decoder layers are split into contiguous runs, each stage
// holding at least one layer (NxD's NxDPPModel partitions a model the same way). The sizes and
// names come from the model's own pieces (pieces.h).
#include <string>
#include <vector>

#include "nxd/pipeline/pieces.h"

namespace nxd::pipeline {

// What auto_partition balances: each stage's parameters (elements per rank), or its pieces'
// modeled forward + backward time for one microbatch on the sim device (ModelPieces::seconds).
enum class PartitionBalance { parameters, modeled_cost };
const char* partition_balance_name(PartitionBalance b);  // "parameters" | "modeled_cost"
// ConfigError naming the string unless it is one of the names.
PartitionBalance parse_partition_balance(const std::string& s);

// NxD's pipeline_cuts: each name is a decoder layer (pieces.layer_prefix + index, e.g.
// "model.layers.3") after which a new stage starts; num_stages - 1 increasing cuts give
// num_stages parts. ConfigError naming the cut for an unknown or out-of-order name, a count that
// does not match, or a stage left without layers.
std::vector<ModelPart> partition_by_cuts(const ModelPieces& pieces,
                                         const std::vector<std::string>& cuts, int num_stages);

// auto_partition: contiguous layer runs minimizing the largest stage's total of `balance` (the
// embedding counted on stage 0, the head on the last stage; modeled seconds compared in whole
// picoseconds); ties go to the earliest cut. ConfigError naming the numbers when num_layers <
// num_stages or num_stages < 1.
std::vector<ModelPart> auto_partition(const ModelPieces& pieces, int num_stages,
                                      PartitionBalance balance = PartitionBalance::parameters);
// The same for the pieces of cfg's model (measure_pieces(cfg, opts)).
std::vector<ModelPart> auto_partition(const ModelConfig& cfg, int num_stages,
                                      PartitionBalance balance = PartitionBalance::parameters,
                                      const PieceOptions& opts = {});

}  // namespace nxd::pipeline
