#include "nxd/cli/exit.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "nxd/io/bounded_read.h"
#include "nxd/runtime/error.h"

namespace nxd::cli {

namespace {

int report(const char* program, const char* kind, const char* what, bool print, int code) {
  std::fflush(stdout);
  if (print) std::fprintf(stderr, "%s: %s: %s\n", program, kind, io::one_line(what).c_str());
  return code;
}

}  // namespace

int run_main(const char* program, const std::function<int()>& body, const ExitOptions& o) {
  try {
    return body();
  } catch (const UserError& e) {
    return report(program, "error", e.what(), !o.quiet, o.quiet ? 0 : 2);
  } catch (const OutOfDeviceMemory& e) {  // the layout asks for more than the machine has
    return report(program, "error", e.what(), true, 2);
  } catch (const CommError& e) {  // a rank failed or hung (named): not a bug of nxd
    return report(program, "error", e.what(), true, 1);
  } catch (const std::filesystem::filesystem_error& e) {  // a path the user gave (under a file,
    // read-only, a component over 255 characters, /proc): a user mistake, not nxd's
    return report(program, "error", e.what(), !o.quiet, o.quiet ? 0 : 2);
  } catch (const std::exception& e) {
    return report(program, "internal error", e.what(), !o.quiet, 1);
  }
}

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
    if (const char* r = std::getenv(v)) return std::atoi(r);
  return 0;
}

}  // namespace nxd::cli
