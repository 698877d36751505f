#pragma once
// The pieces a pipeline cuts a CausalLM into — the input embedding, each decoder layer, and the
// final norm + output head + loss — measured on the model itself. Each piece is built alone as a
// ModelPart on the meta device (shapes only: nothing is allocated or initialized) by the same
// builder the pipeline builds its stages with, so any CausalLM subclass that builds the ModelPart
// it is given can be pipelined, and its sizes, layer names and tied weights come from its own
// modules rather than from a formula per family.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nxd/layers/models/causal_lm.h"

namespace nxd::pipeline {

// Builds `part` of the model cfg describes over the current TP group, parameters initialized by
// name from `seed` (cfg.device may be meta: shapes only). A CausalLM subclass passes the part to
// CausalLM's constructor and builds only that part's modules, under the whole model's names
// (layer i keeps its index: ModuleList(part.layer_begin)); with tie_word_embeddings the part
// holding the head also holds the input embedding (layers/models/config.h, ModelPart).
using PartBuilder = std::function<std::shared_ptr<CausalLM>(const ModelConfig& cfg, uint64_t seed,
                                                            const ModelPart& part)>;

// build(cfg, seed, part), or make_causal_lm when `build` is empty. ConfigError naming the parts
// when the builder returns no model or a model of another part.
std::shared_ptr<CausalLM> build_part(const PartBuilder& build, const ModelConfig& cfg,
                                     uint64_t seed, const ModelPart& part);

struct PieceOptions {
  PartBuilder build;  // empty: make_causal_lm
  // The microbatch whose forward and backward the modeled cost prices: ids [micro_batch_size,
  // seq_length] (seq_length 0: max_position_embeddings).
  int64_t micro_batch_size = 1;
  int64_t seq_length = 0;
  // The decoder layer's module type (TrainingModule::transformer_layer_type, NxD's
  // transformer_layer_cls), e.g. "LlamaDecoderLayer": when set, every layer piece must hold
  // exactly one module of that type, named by the layer's index (ConfigError naming the types it
  // holds otherwise). Empty: the layers are found by their parameters' names alone.
  std::string layer_type;
};

struct PieceSize {
  int64_t parameters = 0;  // elements on one rank at the current tensor-parallel degree
  int64_t bytes = 0;       // their bytes
  double seconds = 0;      // modeled forward + backward of one microbatch (measure_pieces)
  PieceSize& operator+=(const PieceSize& o);
};

struct ModelPieces {
  // Decoder layer l is the module layer_prefix + l ("model.layers.", "transformer.h."): the
  // names pipeline_cuts take. Empty when no layer has parameters to name it by.
  std::string layer_prefix;
  PieceSize embedding;            // ids -> hidden states (the first stage)
  std::vector<PieceSize> layers;  // each decoder layer
  PieceSize head;                 // final norm, output head and loss (the last stage), with the
                                  // tied embedding's copy when tie_word_embeddings
  std::vector<std::string> tied;  // parameters both the embedding and the head piece hold
  PieceSize tied_size;            // their size, counted once by a part that holds both pieces
  std::string cost_model;         // what `seconds` are: "forward + backward of one [1, 64] ..."

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  // A part's total: its layers, plus the embedding and/or head it holds.
  PieceSize part_size(const ModelPart& part) const;
};

// Measures every piece of the model opts.build makes of cfg (validated: ConfigError):
//   - parameters and bytes per rank: each piece built on the meta device over the current TP
//     group (collective over it when the model's layers build groups, as building the model is),
//     one piece at a time;
//   - seconds: each piece's forward and backward of one microbatch on meta inputs, as the
//     pipeline runs them (embed + decoder_layers, decoder_layers, decoder_layers + head_loss),
//     priced by the sim device's roofline (sim::SimClock) of the current sim clock's NeuronCore,
//     or trn1.32xlarge's without one. It runs in a scratch Context at TP = 1 with its own clock,
//     RNG and memory counter, so this rank's simulated time, random stream and memory are
//     untouched and every rank measures the same numbers without communicating.
// ConfigError naming the values for a micro_batch_size < 1, a seq_length outside [0,
// max_position_embeddings], a layer whose parameters do not carry its index, or layers named
// under different prefixes.
ModelPieces measure_pieces(const ModelConfig& cfg, const PieceOptions& opts = {});

}  // namespace nxd::pipeline
