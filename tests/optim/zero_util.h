#pragma once
// Shared by the ZeRO tests (zero1_test.cpp, zero2_test.cpp): a DP rank's token ids for a step,
// and a model's parameters as NamedParams.
#include <cstdint>
#include <vector>

#include "nxd/layers/module.h"
#include "nxd/optim/optimizer.h"
#include "support/tiny_models.h"

namespace nxd::testing {

// Ids of DP rank `dp_rank` at `step` (streams from `base`).
inline Tensor zero_ids(uint64_t base, int dp_rank, int step, int64_t vocab) {
  return random_ids(base + static_cast<uint64_t>(step), static_cast<uint64_t>(dp_rank), vocab);
}

inline std::vector<optim::NamedParam> named(Module& m) {
  std::vector<optim::NamedParam> out;
  for (auto& [n, t] : m.named_parameters()) out.push_back({n, t});
  return out;
}

}  // namespace nxd::testing
