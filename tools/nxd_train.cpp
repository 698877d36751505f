// nxd-train [--config FILE] [--set dotted.key=value ...] [--out DIR]
// Trains a language model as configured (defaults: docs/CONFIG.md). Exit codes: 0 done, 2 a
// user mistake (bad flag, config, data path, a model that does not fit: one line on stderr), 1
// anything else.
// backend.kind=sim runs every rank as a thread of this process; backend.kind=mpi runs one rank
// per process under mpirun: an error on any rank aborts the job (MPI_Abort with the same exit
// code) after that rank printed it, so no rank waits forever for a peer that failed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#ifdef NXD_TRAIN_WITH_MPI
#include <mpi.h>
#endif

#include "nxd/collectives/communicator.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/runtime/error.h"
#include "nxd/trainer/config.h"
#include "nxd/trainer/train.h"

namespace {

const char* kUsage =
    "usage: nxd-train [--config FILE] [--set dotted.key=value ...] [--out DIR]\n"
    "\n"
    "Trains a decoder language model (Llama or GPT-NeoX) on byte-level text, a token file or\n"
    "random tokens, writing DIR/metrics.csv, DIR/config.yaml and DIR/sample.txt. With no\n"
    "arguments it trains the default configuration on /usr/share/games/fortunes.\n"
    "\n"
    "  --config FILE        YAML or JSON (.json) configuration; may be given more than once\n"
    "  --set KEY=VALUE      override one key (VALUE read as YAML: 3e-4, true, [0.9, 0.95])\n"
    "  --out DIR            output directory (exp_manager.exp_dir)\n"
    "  --print-config       print the resolved configuration as YAML and exit\n"
    "  --help-config        print every key with its type, default and description\n"
    "  -h, --help           this text\n";

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

int run(int argc, char** argv) {
  using namespace nxd::trainer;
  Config cfg;
  std::string out;
  bool print_config = false;
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag) -> std::string {
      const std::string pre = std::string(flag) + "=";
      if (a.rfind(pre, 0) == 0) return a.substr(pre.size());
      if (i + 1 >= args.size())
        throw nxd::ConfigError(nxd::str("[nxd-train] ", flag, " needs a value"));
      return args[++i];
    };
    auto is = [&](const char* flag) {
      return a == flag || a.rfind(std::string(flag) + "=", 0) == 0;
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--help-config") {
      std::fputs(config_reference_markdown().c_str(), stdout);
      return 0;
    } else if (a == "--print-config") {
      print_config = true;
    } else if (is("--config")) {
      cfg.merge_file(value("--config"));
    } else if (is("--set")) {
      cfg.apply_override(value("--set"));
    } else if (is("--out")) {
      out = value("--out");
    } else {
      throw nxd::ConfigError(
          nxd::str("[nxd-train] unknown argument '", a, "' (nxd-train --help lists them)"));
    }
  }
  if (!out.empty()) cfg.set("exp_manager.exp_dir", out, "--out");
  TrainConfig tc = resolve(cfg);
  if (print_config) {
    std::fputs(tc.resolved.to_yaml().c_str(), stdout);
    return 0;
  }
  if (tc.dist.backend != "mpi") {
    train(tc);
    return 0;
  }
  if (!nxd::mpi::available())
    throw nxd::ConfigError(
        "[nxd-train] backend.kind=mpi but nxd was built without MPI (NXD_WITH_MPI=OFF)");
  nxd::mpi::Session session(&argc, &argv, tc.seed);
  // errors every rank finds alike (the world does not fit the config): rank 0 prints, then all
  // leave together (a rank exiting first would make mpirun kill rank 0 before it printed)
  std::string world_error;
  try {
    if (tc.dist.world_size_from_launcher && session.size() != tc.dist.world_size) {
      cfg.set("backend.world_size", session.size(), "the MPI world");
      tc = resolve(cfg);
    }
    if (session.size() != tc.dist.world_size)
      throw nxd::ConfigError(nxd::str("[nxd-train] backend.world_size=", tc.dist.world_size,
                                      " but mpirun started ", session.size(), " process(es)"));
    check_world(tc.dist.world_size, tc.dist.tensor_model_parallel_size);
  } catch (const nxd::UserError& e) {
    world_error = e.what();
  }
  if (!world_error.empty()) {
    if (session.rank() == 0) {
      std::fprintf(stderr, "nxd-train: error: %s\n", one_line(world_error).c_str());
      std::fflush(stderr);
    }
    nxd::world().barrier();
    // Only rank 0, which printed, carries the exit code: mpirun tears the job down at the first
    // non-zero exit, and rank 0's forwarded stderr could be lost if another rank got there first.
    return session.rank() == 0 ? 2 : 0;
  }
  int code = 0;
  try {
    train(tc);
  } catch (const nxd::UserError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "nxd-train: error: rank %d: %s\n", session.rank(),
                 one_line(e.what()).c_str());
    code = 2;
  } catch (const nxd::OutOfDeviceMemory& e) {  // the config asks for more than the machine has
    std::fflush(stdout);
    std::fprintf(stderr, "nxd-train: error: rank %d: %s\n", session.rank(),
                 one_line(e.what()).c_str());
    code = 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "nxd-train: internal error: rank %d: %s\n", session.rank(),
                 one_line(e.what()).c_str());
    code = 1;
  }
  if (code != 0) {
    std::fflush(stderr);
#ifdef NXD_TRAIN_WITH_MPI
    MPI_Abort(MPI_COMM_WORLD, code);  // the peers may be waiting in a collective
#endif
  }
  return code;
}

}  // namespace

// Before MPI is initialized: this process's rank from the launcher's environment (0 if none),
// so that an error every rank finds alike (a bad config) is printed once.
int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* r = std::getenv(v)) return std::atoi(r);
  return 0;
}

int main(int argc, char** argv) {
  const bool quiet_errors = launcher_rank() != 0;
  try {
    return run(argc, argv);
  } catch (const nxd::UserError& e) {
    std::fflush(stdout);
    if (!quiet_errors) std::fprintf(stderr, "nxd-train: error: %s\n", one_line(e.what()).c_str());
    // Under mpirun every rank finds a bad config alike; only the rank that printed fails, so
    // mpirun does not stop the job (and lose the message) on another rank's exit first.
    return quiet_errors ? 0 : 2;
  } catch (const nxd::OutOfDeviceMemory& e) {  // the config asks for more than the machine has
    std::fflush(stdout);
    std::fprintf(stderr, "nxd-train: error: %s\n", one_line(e.what()).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    if (!quiet_errors)
      std::fprintf(stderr, "nxd-train: internal error: %s\n", one_line(e.what()).c_str());
    return 1;
  }
}
