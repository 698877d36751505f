#pragma once
// LoRA in tests: every adapter's B starts at zero (the adapted model is the base); tests give each
// B the slice of a full random [out, r] tensor of its name, so the adapters change the output and
// A gets gradients, and a TP rank holds exactly its slice of the one-rank tensor.
#include <functional>
#include <map>
#include <string>

#include "nxd/autograd/ops.h"
#include "nxd/layers/parallel/lora.h"
#include "nxd/runtime/init.h"
#include "nxd/runtime/rng.h"

namespace nxd::testing {

// The tests' adapters: rank 4, alpha 8, no dropout, on every projection of a decoder layer.
inline LoraConfig every_projection_lora() {
  LoraConfig c;
  c.lora_rank = 4;
  c.lora_alpha = 8;
  c.lora_dropout = 0;
  c.target_modules = {"qkv_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return c;
}

inline void randomize_lora_b(Module& root, double std = 0.5) {
  std::map<std::string, Module*> mods;
  for (auto& [n, m] : root.named_modules()) mods[n] = m;
  NoGradGuard ng;
  for (auto& [name, t] : lora_parameters(root)) {
    if (!name.ends_with("lora_B.weight")) continue;
    const std::string layer = name.substr(0, name.size() - std::string(".lora_B.weight").size());
    LoraTarget tg;
    auto* pm = dynamic_cast<ParallelModule*>(mods.at(layer));
    NXD_CHECK(pm && pm->lora_target(tg), "[randomize_lora_b] '", layer, "' is not adapted");
    Tensor full = zeros({tg.out, t.size(1)}, t.dtype());
    init::normal(full, RngStream{std::hash<std::string>{}(name) % 100000, 77}, 0.0, std);
    t.detach().copy_(tg.style == LoraTarget::Style::column ? full.narrow(0, tg.out0, tg.local_out)
                                                           : full);
  }
}

}  // namespace nxd::testing
