// nxd-train [--config FILE] [--set dotted.key=value ...] [--out DIR]
// Trains a language model as configured (defaults: docs/CONFIG.md). Exit codes: 0 done, 2 a
// user mistake (bad flag, config, data path, a model that does not fit: one line on stderr), 1
// anything else. The command line, the backends and the error handling are the trainer library's
// (train_app/cli.h), so a program training a module of its own behaves the same.
#include "nxd/train_app/cli.h"

int main(int argc, char** argv) {
  return nxd::train_app::run_cli(argc, argv);
}
