// What exists with and without MPI: available(), under_launcher() and the backend's tuning
// (mpi.h).
#include <cstdlib>
#include <string>
#include <utility>

#include "nxd/collectives/mpi/mpi.h"

namespace nxd::mpi {

bool available() {
  return NXD_WITH_MPI != 0;
}

bool under_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

// ---------------------------------------------------------------------------------------------
// Tuning

namespace {
Tuning g_tuning;

int64_t parse_bytes(const char* var, const std::string& v) {
  size_t pos = 0;
  double x = -1;
  try {
    x = std::stod(v, &pos);
  } catch (...) {
  }
  const std::string suf = pos ? v.substr(pos) : "?";
  const double mul = suf.empty() || suf == "B" ? 1
                     : suf == "K"              ? 1024.0
                     : suf == "M"              ? 1024.0 * 1024
                     : suf == "G"              ? 1024.0 * 1024 * 1024
                                               : -1;
  NXD_CHECK_T(ConfigError, mul > 0 && x >= 0, "[mpi] ", var, "='", v,
              "' is not a size in bytes (e.g. 262144, 256K, 16M)");
  return static_cast<int64_t>(x * mul);
}

int parse_depth(const std::string& d) {
  size_t pos = 0;
  int x = 0;
  try {
    x = std::stoi(d, &pos);
  } catch (...) {
  }
  NXD_CHECK_T(ConfigError, pos == d.size() && x >= 1 && x <= 64, "[mpi] NXD_MPI_DEPTH='", d,
              "' must be an integer in [1, 64]");
  return x;
}

Algorithm parse_algorithm(const std::string& a) {
  if (a == "auto") return Algorithm::automatic;
  if (a == "mpi") return Algorithm::native;
  if (a == "ring") return Algorithm::ring;
  if (a == "rdh") return Algorithm::rdh;
  throw ConfigError(str("[mpi] NXD_MPI_ALGO='", a, "' must be auto, mpi, ring or rdh"));
}

}  // namespace

namespace {
double g_collective_timeout = 0;
}  // namespace

void set_collective_timeout(double seconds) {
  NXD_CHECK_T(ConfigError, seconds >= 0 && seconds <= 1e6, "[mpi::set_collective_timeout] ",
              seconds, " s is not in [0, 1e6] (0: no timeout)");
  g_collective_timeout = seconds;
}

double collective_timeout() {
  return g_collective_timeout;
}

void set_collective_timeout_from_env() {
  const char* v = std::getenv("NXD_MPI_TIMEOUT");
  if (!v) return;
  size_t pos = 0;
  double x = -1;
  try {
    x = std::stod(v, &pos);
  } catch (...) {
  }
  NXD_CHECK_T(ConfigError, pos > 0 && v[pos] == '\0' && x >= 0 && x <= 1e6,
              "[mpi] NXD_MPI_TIMEOUT='", v, "' must be seconds in [0, 1e6] (0: no timeout)");
  set_collective_timeout(x);
}

Tuning tuning() {
  return g_tuning;
}

void set_tuning(const Tuning& t) {
  NXD_CHECK(t.chunk_bytes >= 1 && t.chunk_bytes <= (int64_t{1} << 30),
            "[mpi::set_tuning] chunk_bytes ", t.chunk_bytes, " must be in [1, 1 GiB]");
  NXD_CHECK(t.depth >= 1 && t.depth <= 64, "[mpi::set_tuning] depth ", t.depth,
            " must be in [1, 64]");
  for (auto [name, v] :
       {std::pair{"rdh_min_bytes", t.rdh_min_bytes}, std::pair{"ring_min_bytes", t.ring_min_bytes},
        std::pair{"rs_ring_min_bytes", t.rs_ring_min_bytes},
        std::pair{"ag_ring_min_bytes", t.ag_ring_min_bytes}})
    NXD_CHECK(v >= 0, "[mpi::set_tuning] ", name, " ", v, " must be >= 0");
  g_tuning = t;
}

Tuning tuning_from_env() {
  Tuning t;
  if (const char* v = std::getenv("NXD_MPI_ALGO")) t.algorithm = parse_algorithm(v);
  for (auto [var, field] : {std::pair{"NXD_MPI_RDH_MIN", &t.rdh_min_bytes},
                            std::pair{"NXD_MPI_RING_MIN", &t.ring_min_bytes},
                            std::pair{"NXD_MPI_RS_RING_MIN", &t.rs_ring_min_bytes},
                            std::pair{"NXD_MPI_AG_RING_MIN", &t.ag_ring_min_bytes}})
    if (const char* v = std::getenv(var)) *field = parse_bytes(var, v);
  if (const char* v = std::getenv("NXD_MPI_CHUNK")) {
    t.chunk_bytes = parse_bytes("NXD_MPI_CHUNK", v);
    NXD_CHECK_T(ConfigError, t.chunk_bytes >= 1 && t.chunk_bytes <= (int64_t{1} << 30),
                "[mpi] NXD_MPI_CHUNK='", v, "' must be between 1 byte and 1G");
  }
  if (const char* v = std::getenv("NXD_MPI_DEPTH")) t.depth = parse_depth(v);
  return t;
}

Algorithm choose(Op op, int64_t bytes, int size) {
  const Tuning& t = g_tuning;
  if (size < 2 || t.algorithm == Algorithm::native) return Algorithm::native;
  const bool pow2 = (size & (size - 1)) == 0;
  // RDH's reduce_scatter and all_gather exist for power-of-two groups only.
  if (t.algorithm == Algorithm::rdh && op != Op::all_reduce && !pow2) return Algorithm::ring;
  if (t.algorithm != Algorithm::automatic) return t.algorithm;
  switch (op) {
    case Op::all_reduce:
      return bytes >= t.ring_min_bytes  ? Algorithm::ring
             : bytes >= t.rdh_min_bytes ? Algorithm::rdh
                                        : Algorithm::native;
    case Op::reduce_scatter:
      return bytes >= t.rs_ring_min_bytes ? Algorithm::ring : Algorithm::native;
    case Op::all_gather:
      return bytes >= t.ag_ring_min_bytes ? Algorithm::ring : Algorithm::native;
  }
  return Algorithm::native;
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::automatic:
      return "auto";
    case Algorithm::native:
      return "mpi";
    case Algorithm::ring:
      return "ring";
    case Algorithm::rdh:
      return "rdh";
  }
  return "?";
}

const char* algorithm_for(Op op, int64_t bytes, int size) {
  return algorithm_name(choose(op, bytes, size));
}

}  // namespace nxd::mpi
