// nxd-example-new-model: gpt2.h's GPT-2 trained with nxd-train's flags, keys, backends and exit
// codes (train_app/cli.h). Defaults differ only below. E.g. `--set trainer.max_steps=200`, or
// `mpirun -np 2 nxd-example-new-model --set backend.kind=mpi`.
#include "gpt2.h"
#include "nxd/train_app/cli.h"

int main(int argc, char** argv) {
  nxd::train_app::CliOptions o;
  o.program = "nxd-example-new-model";
  o.description = "Trains a GPT-2 (examples/new_model/gpt2.h) as nxd-train trains its models.\n";
  o.defaults = [](nxd::train_app::Config& c) {
    c.set("model.arch", "gpt2", "new_model");
    c.set("model.tie_word_embeddings", true, "new_model");
    c.set("model.init_method", "scaled_normal", "new_model");  // GPT-2's own
    c.set("distributed_strategy.sequence_parallel", false, "new_model");
    c.set("exp_manager.exp_dir", "runs/new_model", "new_model");
  };
  o.make_module = [](const nxd::train_app::TrainConfig& c) {
    return std::make_unique<gpt2::LMModule>(c);
  };
  return nxd::train_app::run_cli(argc, argv, o);
}
