#pragma once
// InitScheme: how a model's projections, biases and embeddings are initialized
// (ModelConfig::init_method; nxd-train's model.init_method).
//
//   nxd            PyTorch's and NxD's layer defaults: weights and biases uniform(+-1/sqrt(fan_in))
//                  (kaiming_uniform_(a=sqrt(5))), embeddings normal(0, 1). fan_in is the full
//                  layer's input size at every TP degree, so a shard is always the slice of the
//                  single-rank weight.
//   normal         Hugging Face's _init_weights: weights and embeddings normal(0, std), biases 0.
//   scaled_normal  normal, except the projections that write into the residual stream (attention
//                  output, MLP output) use std / sqrt(2 * num_layers) (GPT-2; Megatron-LM's
//                  scaled_init_method_normal).
// Norm weights are 1 and norm biases 0 under every method.
#include <cstdint>
#include <string>

#include "nxd/layers/module.h"

namespace nxd {

enum class InitMethod { nxd, normal, scaled_normal };
const char* init_method_name(InitMethod m);  // "nxd", "normal", "scaled_normal"
// The method named `s`; ConfigError naming `s` and the accepted names otherwise.
InitMethod parse_init_method(const std::string& s);

// What a projection's output feeds: scaled_normal initializes the projections that write into
// the residual stream (attention's o_proj, the MLP's down projection) with a smaller std.
enum class WeightRole { projection, residual_output };

struct InitScheme {
  InitMethod method = InitMethod::nxd;
  double std = 0.02;       // normal, scaled_normal
  int64_t num_layers = 1;  // scaled_normal: the model's decoder layers

  // A projection's weight; WeightRole::residual_output: it writes into the residual stream.
  ParamInit weight(WeightRole role = WeightRole::projection) const;
  ParamInit bias() const;
  ParamInit embedding() const;
};

}  // namespace nxd
