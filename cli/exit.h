#pragma once
// How nxd's command-line tools end on an exception, written once for every tool's main(): the
// message on one line (io::one_line) after "<program>: error: ", and the exit code of its kind:
//   a user mistake (UserError; a std::filesystem error on a path the user gave; a layout that
//   does not fit in device memory, OutOfDeviceMemory): 2;
//   a rank that failed or hung, named (CommError): 1;
//   anything else: "<program>: internal error: ...", 1.
// A tool's own usage errors are caught in its body, before these.
#include <functional>

namespace nxd::cli {

struct ExitOptions {
  // This process is not the launcher's rank 0 (launcher_rank() != 0): a mistake every rank finds
  // alike (UserError, a filesystem error) is printed by rank 0 only and exits 0 here, so mpirun
  // does not stop the job (and lose rank 0's message) on this rank's exit first; internal errors
  // are not printed. OutOfDeviceMemory and CommError are printed by every rank.
  bool quiet = false;
};

// body()'s exit code, or the code of the exception escaping it (printed to stderr, after
// flushing stdout).
int run_main(const char* program, const std::function<int()>& body, const ExitOptions& o = {});

// Before MPI is initialized: this process's rank from the launcher's environment
// (OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK; 0 if none).
int launcher_rank();

}  // namespace nxd::cli
