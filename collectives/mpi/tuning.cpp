// What exists with and without MPI: available(), under_launcher() and the backend's tuning
// (mpi.h).
#include <cstdlib>
#include <string>

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
}  // namespace

Tuning tuning() {
  return g_tuning;
}

void set_tuning(const Tuning& t) {
  NXD_CHECK(t.chunk_bytes >= 1 && t.chunk_bytes <= (int64_t{1} << 30),
            "[mpi::set_tuning] chunk_bytes ", t.chunk_bytes, " must be in [1, 1 GiB]");
  NXD_CHECK(t.depth >= 1 && t.depth <= 64, "[mpi::set_tuning] depth ", t.depth,
            " must be in [1, 64]");
  NXD_CHECK(t.ring_min_bytes >= 0, "[mpi::set_tuning] ring_min_bytes ", t.ring_min_bytes,
            " must be >= 0");
  g_tuning = t;
}

Tuning tuning_from_env() {
  Tuning t;
  if (const char* v = std::getenv("NXD_MPI_ALGO")) {
    const std::string a = v;
    NXD_CHECK_T(ConfigError, a == "auto" || a == "mpi" || a == "ring", "[mpi] NXD_MPI_ALGO='", a,
                "' must be auto, mpi or ring");
    t.algorithm = a == "mpi"    ? Algorithm::native
                  : a == "ring" ? Algorithm::ring
                                : Algorithm::automatic;
  }
  if (const char* v = std::getenv("NXD_MPI_RS_RING_MIN"))
    t.rs_ring_min_bytes = parse_bytes("NXD_MPI_RS_RING_MIN", v);
  if (const char* v = std::getenv("NXD_MPI_RING_MIN"))
    t.ring_min_bytes = parse_bytes("NXD_MPI_RING_MIN", v);
  if (const char* v = std::getenv("NXD_MPI_CHUNK")) {
    t.chunk_bytes = parse_bytes("NXD_MPI_CHUNK", v);
    NXD_CHECK_T(ConfigError, t.chunk_bytes >= 1 && t.chunk_bytes <= (int64_t{1} << 30),
                "[mpi] NXD_MPI_CHUNK='", v, "' must be between 1 byte and 1G");
  }
  if (const char* v = std::getenv("NXD_MPI_DEPTH")) {
    const std::string d = v;
    size_t pos = 0;
    int x = 0;
    try {
      x = std::stoi(d, &pos);
    } catch (...) {
    }
    NXD_CHECK_T(ConfigError, pos == d.size() && x >= 1 && x <= 64, "[mpi] NXD_MPI_DEPTH='", d,
                "' must be an integer in [1, 64]");
    t.depth = x;
  }
  return t;
}

const char* algorithm_for(Op op, int64_t bytes, int size) {
  if (size < 2 || g_tuning.algorithm == Algorithm::native) return "mpi";
  if (g_tuning.algorithm == Algorithm::ring) return "ring";
  switch (op) {
    case Op::all_reduce:
      return bytes >= g_tuning.ring_min_bytes ? "ring" : "mpi";
    case Op::reduce_scatter:
      return bytes >= g_tuning.rs_ring_min_bytes ? "ring" : "mpi";
    case Op::all_gather:
      return "mpi";
  }
  return "mpi";
}

}  // namespace nxd::mpi
