// The child of CheckpointCrash: saves checkpoints step_<k>, k = START, START+1, ... under DIR
// forever (keeping 2), every tensor of checkpoint k filled with k, until it is killed. With a
// third argument TAG, every save re-saves that one tag (still filled with k, k = START, ...).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "crash_model.h"
#include "nxd/checkpoint/checkpoint.h"
#include "nxd/layers/models/causal_lm.h"
#include "nxd/optim/optimizer.h"

int main(int argc, char** argv) {
  using namespace nxd;
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: %s DIR START [TAG]\n", argv[0]);
    return 2;
  }
  ckpt::CrashModel crash(1);
  auto& model = crash.model;
  auto& opt = crash.opt;
  for (long k = std::atol(argv[2]);; ++k) {
    {
      NoGradGuard g;
      for (const auto& [n, t] : model->state_dict()) t.detach().fill_(static_cast<double>(k));
      for (const auto& [n, t] : opt.state_tensors()) t.detach().fill_(static_cast<double>(k));
    }
    ckpt::save_checkpoint(argv[1], argc == 4 ? argv[3] : "step_" + std::to_string(k), model.get(),
                          &opt, nullptr, nlohmann::json{{"k", k}}, {.num_kept_ckpts = 2});
  }
}
