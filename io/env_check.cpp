#include "nxd/io/env_check.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "nxd/runtime/error.h"

namespace nxd::io {

namespace {

// The value as shown in a message: at most 40 characters.
std::string shown(const char* v) {
  std::string s(v);
  return s.size() <= 40 ? s : s.substr(0, 37) + "...";
}

[[noreturn]] void bad(const char* var, const char* v, const char* want) {
  throw ConfigError(str("[env] ", var, "='", shown(v), "': expected ", want));
}

std::optional<int64_t> env_integer(const char* var, int64_t lo, int64_t hi, const char* want) {
  const char* v = std::getenv(var);
  if (!v) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != 0 || errno == ERANGE || x < lo || x > hi) bad(var, v, want);
  return x;
}

void env_number(const char* var, double lo, bool lo_open, const char* want) {
  const char* v = std::getenv(var);
  if (!v) return;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || *end != 0 || !std::isfinite(x) || x < lo || (lo_open && x == lo))
    bad(var, v, want);
}

}  // namespace

std::optional<int64_t> env_num_threads() {
  return env_integer("NXD_NUM_THREADS", 1, kMaxThreads, "a thread count from 1 to 1024");
}

void check_environment() {
  env_num_threads();
  if (const char* v = std::getenv("NXD_GEMM"))
    if (std::strcmp(v, "openblas") != 0 && std::strcmp(v, "eigen") != 0)
      bad("NXD_GEMM", v, "openblas or eigen");
  env_integer("NXD_HOST_CACHE_MB", 0, int64_t{1} << 30, "MiB from 0 to 2^30");
  env_number("NXD_SIM_TIMEOUT", 0, /*lo_open=*/true, "seconds > 0");
  env_number("NXD_SIM_SPIN_US", 0, /*lo_open=*/false, "microseconds >= 0");
  env_number("NXD_MPI_TIMEOUT", 0, /*lo_open=*/false, "seconds >= 0");
  env_integer("NXD_POOL_SPIN_US", 0, int64_t{1} << 40, "microseconds >= 0");
  env_integer("NXD_HOST_RAM_BYTES", 1, int64_t{1} << 56, "bytes from 1 to 2^56");
}

}  // namespace nxd::io
