#pragma once
// nxd-train's command line as a library: a program that trains a module of its own (another
// architecture, another loss) gets nxd-train's flags, configuration keys, backends (the sim world
// in this process, or one rank per process under mpirun) and exit codes by calling run_cli from
// main(). tools/nxd_train.cpp is run_cli with the defaults; examples/new_model trains a GPT-2.
//
//   PROGRAM [--config FILE]... [--set dotted.key=value]... [--out DIR] [--print-config]
//           [--help-config] [-h|--help]
//
// Exit codes: 0 done, 2 a user mistake (bad flag, config, data path, a model that does not fit:
// one line on stderr, no stack trace), 1 anything else. Under mpirun an error on any rank aborts
// the job (MPI_Abort with the same code) after that rank printed it, so no rank waits forever for
// a peer that failed; an error every rank finds alike (a bad config) is printed once, by rank 0.
#include <functional>
#include <string>

#include "nxd/train_app/config.h"
#include "nxd/train_app/train.h"

namespace nxd::train_app {

struct CliOptions {
  std::string program = "nxd-train";  // in usage and error lines
  std::string description;            // --help's paragraph ("" = nxd-train's)
  // Applied to the configuration before the files, overrides and --out (e.g. model.arch).
  std::function<void(Config&)> defaults;
  ModuleFactory make_module;  // the module every rank trains (default: the built-in one)
};

int run_cli(int argc, char** argv, const CliOptions& opts = {});

}  // namespace nxd::train_app
