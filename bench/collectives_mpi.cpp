// nxd-bench-collectives --backend mpi (run under mpirun). Per row, candidates are timed in turn,
// the order rotating from round to round (bench_util.h's convention: every candidate sees the
// same machine load), for --rounds rounds (default 5):
//   raw     MPI_* on the same buffers: the baseline
//   nxd     nxd's MPI communicator with its automatic choice (the "algo" column)
//   memcpy  every rank copies the row's bytes at the same time: what the memory system gives
//           the same number of processes (nxd/memcpy says how close a collective gets to it)
//   and, with --algos mpi,ring,rdh, nxd with each algorithm forced (mpi::set_tuning).
// A candidate's round is a barrier, `iters` calls and the slowest rank's mean call. Printed:
// medians over the rounds, the ratio raw/nxd of the medians (target >= 0.95) with its min-max
// over rounds.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "collectives.h"
#include "nxd/collectives/mpi/mpi.h"

#if NXD_WITH_MPI
#include <mpi.h>

#include "nxd/collectives/mpi/datatype.h"
#endif

namespace nxd::bench::coll {

#if NXD_WITH_MPI
namespace {

void run_raw(const Row& w, int p, int r) {
  const int n = static_cast<int>(w.count);
  const MPI_Datatype t = mpi::datatype(w.dtype);
  switch (w.kind) {
    case CollKind::all_reduce:
      MPI_Allreduce(MPI_IN_PLACE, w.a, n, t, MPI_SUM, MPI_COMM_WORLD);
      break;
    case CollKind::all_gather:
      MPI_Allgather(w.a, n, t, w.b, n, t, MPI_COMM_WORLD);
      break;
    case CollKind::reduce_scatter:
      MPI_Reduce_scatter_block(w.a, w.b, n, t, MPI_SUM, MPI_COMM_WORLD);
      break;
    case CollKind::broadcast:
      MPI_Bcast(w.a, n, t, 0, MPI_COMM_WORLD);
      break;
    case CollKind::all_to_all:
      MPI_Alltoall(w.a, n, t, w.b, n, t, MPI_COMM_WORLD);
      break;
    case CollKind::send_recv:
      MPI_Sendrecv(w.a, n, t, (r + 1) % p, 0, w.b, n, t, (r + p - 1) % p, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
      break;
    default:
      break;
  }
}

struct Candidate {
  std::string name;
  std::function<void()> once;
  std::vector<double> t;  // per round: the slowest rank's mean call (seconds)
};

double time_round(const Candidate& c, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int it = 0; it < iters; ++it) c.once();
  double t = (MPI_Wtime() - t0) / iters, tmax = 0;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return tmax;
}

mpi::Op mpi_op(CollKind k) {
  return k == CollKind::all_reduce   ? mpi::Op::all_reduce
         : k == CollKind::all_gather ? mpi::Op::all_gather
                                     : mpi::Op::reduce_scatter;
}

bool has_algorithms(CollKind k) {
  return k == CollKind::all_reduce || k == CollKind::all_gather || k == CollKind::reduce_scatter;
}

// nxd with algorithm `name` forced for its calls, the rest of the tuning as it was.
std::function<void()> forced(Communicator& c, const Row& w, const std::string& name) {
  mpi::Tuning tu = mpi::tuning();
  tu.algorithm = name == "mpi"    ? mpi::Algorithm::native
                 : name == "ring" ? mpi::Algorithm::ring
                                  : mpi::Algorithm::rdh;
  return [&c, w, tu] {
    const mpi::Tuning saved = mpi::tuning();
    mpi::set_tuning(tu);
    run_op(c, w);
    mpi::set_tuning(saved);
  };
}

void print_header(const Args& a, const Shape& s, double f) {
  const mpi::Tuning tu = mpi::tuning();
  std::printf("# nxd-bench-collectives: backend mpi, op %s, %d processes, dtype %s\n", a.op.c_str(),
              s.ranks, dtype_name(a.dtype));
  std::printf(
      "# GB/s = 1e9 B/s; busbw = algbw x %.4f; medians of %d rounds (rotating order), each the "
      "slowest rank's mean call\n"
      "# raw: MPI_* on the same buffers; ratio = raw time / nxd time (min-max over rounds)\n"
      "# memcpy: every rank copies the row's bytes at the same time (GB/s per rank)\n",
      f, a.rounds > 0 ? a.rounds : 5);
  std::printf(
      "# nxd algo: mpi = MPI's own, ring = nxd's pipelined ring (segment %lld B, depth %d), rdh "
      "= recursive halving-doubling; auto: all_reduce rdh from %lld B, ring from %lld B; "
      "reduce_scatter ring from %lld B; all_gather ring from %lld B (NXD_MPI_*)\n",
      (long long)tu.chunk_bytes, tu.depth, (long long)tu.rdh_min_bytes,
      (long long)tu.ring_min_bytes, (long long)tu.rs_ring_min_bytes,
      (long long)tu.ag_ring_min_bytes);
  std::printf("#%11s %11s %5s | %10s %8s %5s | %10s %8s | %6s %11s | %7s %6s", "size(B)", "count",
              "type", "nxd(us)", "busbw", "algo", "raw(us)", "busbw", "ratio", "(min-max)",
              "memcpy", "/memcp");
  for (const std::string& x : a.algos) std::printf(" | %5s busbw ratio", x.c_str());
  std::printf("\n");
}

}  // namespace
#endif

int run_mpi(const Args& a, int argc, char** argv) {
#if NXD_WITH_MPI
  mpi::Session session(&argc, &argv);
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  const Shape shape{parse_op(a.op), p, a.dtype};
  const CollKind k = shape.kind;
  NXD_CHECK(a.ranks == 0 || a.ranks == p, "[nxd-bench-collectives] --ranks ", a.ranks,
            " differs from the MPI world size ", p, " (use mpirun -np)");
  NXD_CHECK(a.dtype != DType::bf16, "[nxd-bench-collectives] raw MPI has no bf16; use f32");
  NXD_CHECK(k != CollKind::send_recv || p >= 2,
            "[nxd-bench-collectives] sendrecv needs >= 2 ranks");
  NXD_CHECK(a.algos.empty() || has_algorithms(k), "[nxd-bench-collectives] --algos needs --op ",
            "all_reduce, all_gather or reduce_scatter, got ", a.op);
  const int64_t es = dtype_size(a.dtype);
  const double f = sim::busbw_factor(k, p);
  const int rounds = a.rounds > 0 ? a.rounds : 5;
  if (r == 0) print_header(a, shape, f);
  for (int64_t bytes : sizes(a)) {
    const int64_t n = count_for(shape, bytes);
    if (n == 0) continue;
    auto [ea, eb] = buffer_elems(shape, n);
    std::vector<char> A(ea * es, 0), B(std::max<int64_t>(eb, 1) * es, 0);
    std::vector<char> from(bytes, 1), to(bytes, 0);
    const Row w{k, A.data(), B.data(), n, a.dtype};
    std::vector<Candidate> cs;
    cs.push_back({"raw", [&] { run_raw(w, p, r); }, {}});
    cs.push_back({"nxd", [&] { run_op(c, w); }, {}});
    cs.push_back({"memcpy", [&] { std::memcpy(to.data(), from.data(), bytes); }, {}});
    for (const std::string& x : a.algos) cs.push_back({x, forced(c, w, x), {}});
    const int iters = iters_for(a, bytes);
    for (Candidate& x : cs)
      for (int i = 0; i < 2; ++i) x.once();  // warm-up: buffers faulted in, MPI connections up
    for (int round = 0; round < rounds; ++round)
      for (size_t j = 0; j < cs.size(); ++j) {
        Candidate& x = cs[(round + j) % cs.size()];
        x.t.push_back(time_round(x, iters));
      }
    if (r != 0) continue;
    auto med = [](const Candidate& x) { return median_of(x.t); };
    const double t_raw = med(cs[0]), t_nxd = med(cs[1]), t_cp = med(cs[2]);
    double lo = 1e30, hi = 0;
    for (int i = 0; i < rounds; ++i) {
      lo = std::min(lo, cs[0].t[i] / cs[1].t[i]);
      hi = std::max(hi, cs[0].t[i] / cs[1].t[i]);
    }
    const double bw_nxd = bytes / t_nxd / 1e9 * f, bw_raw = bytes / t_raw / 1e9 * f;
    const double bw_cp = bytes / t_cp / 1e9;
    std::printf(
        " %11lld %11lld %5s | %10.2f %8.2f %5s | %10.2f %8.2f | %6.3f %5.2f-%5.2f | %7.2f %6.2f",
        (long long)bytes, (long long)n, dtype_name(a.dtype), t_nxd * 1e6, bw_nxd,
        has_algorithms(k) ? mpi::algorithm_for(mpi_op(k), bytes, p) : "mpi", t_raw * 1e6, bw_raw,
        t_raw / t_nxd, lo, hi, bw_cp, bw_nxd / bw_cp);
    for (size_t j = 3; j < cs.size(); ++j)
      std::printf(" | %5s %5.2f %5.3f", "", bytes / med(cs[j]) / 1e9 * f, t_raw / med(cs[j]));
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
#else
  (void)a;
  (void)argc;
  (void)argv;
  throw ConfigError("[nxd-bench-collectives] --backend mpi: nxd was built without MPI");
#endif
}

}  // namespace nxd::bench::coll
