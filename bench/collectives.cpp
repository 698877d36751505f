// nxd-bench-collectives (bench/): an nccl-tests-style table (size, count, dtype, time, algbw, busbw
// with nccl-tests' bus-bandwidth factors; GB/s = 1e9 B/s) for one collective over a range of sizes.
//
//   --backend sim: ranks are threads; prints the host-measured time and bandwidth, a one-thread
//     memcpy of the same size measured in the same run (the baseline) and the ratio, and the
//     modeled time/busbw on --instance, plus the published nccom-test figures next to the model.
//     Rows whose host buffers would not fit the host budget are modeled only (shape-only calls).
//   --backend mpi (run under mpirun): nxd's MPI communicator and raw MPI_* measured in the same
//     run, and the ratio nxd/raw busbw (target >= 0.95 from 1 MiB).
// Bad flags print a message and exit with code 2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "bench_util.h"
#include "nxd/collectives/communicator.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/sim/collective_cost.h"
#include "nxd/collectives/sim/launch.h"
#include "nxd/collectives/sim/nccom_figures.h"

#if NXD_WITH_MPI
#include <mpi.h>

#include "nxd/collectives/mpi/datatype.h"
#endif

using namespace nxd;
using sim::CollKind;

namespace {

struct Args {
  std::string backend = "sim";
  std::string op = "all_reduce";
  int64_t min_bytes = 8, max_bytes = 256 << 20;
  std::string instance;
  int ranks = 0;
  DType dtype = DType::f32;
  int iters = 0;  // 0: by size
  sim::Algorithm algorithm = sim::Algorithm::automatic;
  double host_budget_gib = 8;
};

const char* kUsage =
    "usage: nxd-bench-collectives [--backend sim|mpi] [--op all_reduce|all_gather|reduce_scatter|"
    "broadcast|all_to_all|sendrecv]\n"
    "         [--min 8] [--max 256M] [--instance trn1.32xlarge] [--ranks N] [--dtype f32]\n"
    "         [--iters N] [--algorithm auto|ring|rdh|mesh|kangaring] [--host-budget-gib 8]\n";

int64_t parse_size(const std::string& s) {
  NXD_CHECK(!s.empty(), "[nxd-bench-collectives] empty size");
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw InvalidArgument(str("[nxd-bench-collectives] bad size '", s, "'"));
  }
  std::string suf = s.substr(pos);
  double mul = suf.empty() || suf == "B"    ? 1
               : suf == "K" || suf == "KiB" ? 1024.0
               : suf == "M" || suf == "MiB" ? 1024.0 * 1024
               : suf == "G" || suf == "GiB" ? 1024.0 * 1024 * 1024
                                            : -1;
  NXD_CHECK(mul > 0 && v > 0, "[nxd-bench-collectives] bad size '", s,
            "' (use e.g. 8, 64K, 256M, 1G)");
  return static_cast<int64_t>(v * mul);
}

CollKind parse_op(const std::string& s) {
  for (CollKind k : {CollKind::all_reduce, CollKind::all_gather, CollKind::reduce_scatter,
                     CollKind::broadcast, CollKind::all_to_all})
    if (s == sim::coll_kind_name(k)) return k;
  if (s == "sendrecv") return CollKind::send_recv;
  throw InvalidArgument(str("[nxd-bench-collectives] unknown --op '", s, "'"));
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    NXD_CHECK(i + 1 < argc, "[nxd-bench-collectives] flag ", f, " needs a value");
    std::string v = argv[++i];
    if (f == "--backend")
      a.backend = v;
    else if (f == "--op")
      a.op = v;
    else if (f == "--min")
      a.min_bytes = parse_size(v);
    else if (f == "--max")
      a.max_bytes = parse_size(v);
    else if (f == "--instance")
      a.instance = v;
    else if (f == "--ranks")
      a.ranks = std::stoi(v);
    else if (f == "--dtype")
      a.dtype = dtype_from_name(v);
    else if (f == "--iters")
      a.iters = std::stoi(v);
    else if (f == "--algorithm")
      a.algorithm = sim::algorithm_from_name(v);
    else if (f == "--host-budget-gib")
      a.host_budget_gib = std::stod(v);
    else
      throw InvalidArgument(str("[nxd-bench-collectives] unknown flag ", f));
  }
  NXD_CHECK(a.backend == "sim" || a.backend == "mpi",
            "[nxd-bench-collectives] --backend must be "
            "sim or mpi, got '",
            a.backend, "'");
  parse_op(a.op);
  NXD_CHECK(a.min_bytes <= a.max_bytes, "[nxd-bench-collectives] --min ", a.min_bytes, " > --max ",
            a.max_bytes);
  NXD_CHECK(a.ranks >= 0 && a.iters >= 0, "[nxd-bench-collectives] --ranks/--iters must be >= 0");
  NXD_CHECK(a.dtype != DType::f64 || true, "");
  return a;
}

// Elements per rank call for a row of `bytes` (nccl-tests: S is the full array; for all-gather
// the output, for reduce-scatter the input, for all-to-all the per-rank buffer).
int64_t count_for(CollKind k, int64_t bytes, int p, int64_t es) {
  int64_t n = bytes / es;
  if (k == CollKind::all_gather || k == CollKind::reduce_scatter || k == CollKind::all_to_all)
    n /= p;
  return n;
}

// Timed runs per row; each backend keeps the best (as the MPI side always has).
constexpr int kRounds = 3;

int iters_for(const Args& a, int64_t bytes) {
  if (a.iters > 0) return a.iters;
  return static_cast<int>(
      std::clamp<int64_t>((int64_t{512} << 20) / std::max<int64_t>(bytes, 1 << 16), 3, 200));
}

// One call of the op on communicator c with buffers a (send / in-place) and b (recv).
void run_op(Communicator& c, CollKind k, void* a, void* b, int64_t n, DType t) {
  switch (k) {
    case CollKind::all_reduce:
      c.all_reduce(a, a, n, t, ReduceOp::sum);
      break;
    case CollKind::all_gather:
      c.all_gather(a, b, n, t);
      break;
    case CollKind::reduce_scatter:
      c.reduce_scatter(a, b, n, t, ReduceOp::sum);
      break;
    case CollKind::broadcast:
      c.broadcast(a, n, t, 0);
      break;
    case CollKind::all_to_all:
      c.all_to_all(a, b, n, t);
      break;
    case CollKind::send_recv: {
      const int p = c.size(), r = c.rank();
      Work w = c.isend(a, n, t, (r + 1) % p, 0);
      c.recv(b, n, t, (r + p - 1) % p, 0);
      w.wait();
      break;
    }
    default:
      break;
  }
}

// Bytes of host buffers (a, b) one rank needs for a row.
std::pair<int64_t, int64_t> buffer_elems(CollKind k, int64_t n, int p) {
  switch (k) {
    case CollKind::all_reduce:
    case CollKind::broadcast:
      return {n, 0};
    case CollKind::all_gather:
      return {n, n * p};
    case CollKind::reduce_scatter:
      return {n * p, n};
    case CollKind::all_to_all:
      return {n * p, n * p};
    default:
      return {n, n};
  }
}

std::vector<int64_t> sizes(const Args& a) {
  std::vector<int64_t> s;
  for (int64_t b = a.min_bytes; b <= a.max_bytes; b *= 2) s.push_back(b);
  return s;
}

// ------------------------------------------------------------------------------------------
// sim

void print_published(CollKind k, const std::string& instance) {
  bool header = false;
  for (const sim::NccomFigure& p : sim::kNccomFigures) {
    if (p.kind != k) continue;
    if (!instance.empty() && instance.find("trn1") == std::string::npos) continue;
    if (!header) {
      std::printf(
          "\n# Published nccom-test figures (Trn1) vs the model (GiB/s as nccom-test "
          "prints)\n");
      std::printf("# %-40s %10s %12s %12s %9s %9s %6s  %s\n", "case", "size(B)", "pub time(us)",
                  "model(us)", "pub busbw", "mdl busbw", "err", "algo");
      header = true;
    }
    sim::MachineSpec m = sim::machine(p.instance);
    std::vector<int> ranks(p.ranks);
    for (int i = 0; i < p.ranks; ++i) ranks[i] = i;
    sim::CollCost c = sim::collective_cost(m, p.kind, ranks, p.bytes);
    double f = sim::busbw_factor(p.kind, p.ranks);
    double pub_bw = p.bytes / (p.us * 1e-6) * f / sim::kGiB;
    double mdl_bw = p.bytes / c.seconds * f / sim::kGiB;
    std::printf("  %-40s %10.0f %12.2f %12.2f %9.2f %9.2f %+5.0f%%  %s%s\n", p.what, p.bytes, p.us,
                c.seconds * 1e6, pub_bw, mdl_bw, (c.seconds * 1e6 / p.us - 1) * 100,
                sim::algorithm_name(c.algorithm), p.calibration ? "  (calibration)" : "");
  }
}

int run_sim(const Args& a) {
  const CollKind k = parse_op(a.op);
  const int p = a.ranks > 0 ? a.ranks : 2;
  NXD_CHECK(k != CollKind::send_recv || p >= 2,
            "[nxd-bench-collectives] sendrecv needs >= 2 ranks");
  sim::LaunchOptions o;
  o.world_size = p;
  o.instance = a.instance;
  o.algorithm = a.algorithm;
  o.memory_capacity = 0;  // host buffers are not HBM-limited in the benchmark
  sim::MachineSpec m = sim::resolve_machine(o);
  const int64_t es = dtype_size(a.dtype);
  const std::vector<int64_t> S = sizes(a);
  const double budget = a.host_budget_gib * sim::kGiB;
  std::vector<std::vector<double>> host_t(S.size(), std::vector<double>(p, -1)), host_p50 = host_t;
  std::vector<double> model_t(S.size(), 0), copy_t(S.size(), -1);
  std::vector<const char*> algo(S.size(), "");
  std::vector<int64_t> counts(S.size(), 0);
  for (size_t i = 0; i < S.size(); ++i) counts[i] = count_for(k, S[i], p, es);

  sim::launch(o, [&] {
    Communicator& c = world();
    const int r = c.rank();
    for (size_t i = 0; i < S.size(); ++i) {
      const int64_t n = counts[i];
      if (n == 0) continue;
      auto [ea, eb] = buffer_elems(k, n, p);
      const bool host = double(p) * (ea + eb) * es <= budget;
      const Device d = host ? Device::host : Device::meta;
      Tensor ta = empty({ea}, a.dtype, d), tb = empty({std::max<int64_t>(eb, 1)}, a.dtype, d);
      void* pa = host ? ta.raw_data() : nullptr;
      void* pb = host ? tb.raw_data() : nullptr;
      if (host) {
        std::memset(pa, 0, ea * es);
        std::memset(pb, 0, eb * es);
      }
      const int iters = iters_for(a, S[i]);
      if (host)
        for (int w = 0; w < 2; ++w) run_op(c, k, pa, pb, n, a.dtype);
      sim::SimClock* clk = sim::current_sim_clock();
      // As on the MPI side: the best of kRounds timed runs of `iters` calls (the machine's
      // neighbours come and go); the median call over all rounds is printed as well.
      const int reps = host ? iters : 1, rounds = host ? kRounds : 1;
      std::vector<double> per_call;
      per_call.reserve(size_t(reps) * rounds);
      double best = 1e30, m0 = 0, m1 = 0;
      for (int round = 0; round < rounds; ++round) {
        c.barrier();
        m0 = clk->now();
        const double t0 = bench::now_seconds();
        double q = t0;
        for (int it = 0; it < reps; ++it) {
          run_op(c, k, pa, pb, n, a.dtype);
          const double q1 = bench::now_seconds();
          per_call.push_back(q1 - q);
          q = q1;
        }
        m1 = clk->now();
        best = std::min(best, (q - t0) / reps);
      }
      if (host) {
        host_t[i][r] = best;
        host_p50[i][r] = bench::median_of(per_call);
      }
      if (r == 0) {
        model_t[i] = (m1 - m0) / reps;
        std::vector<int> ranks(p);
        for (int j = 0; j < p; ++j) ranks[j] = j;
        double bytes = double(S[i]);
        algo[i] = sim::algorithm_name(
            sim::collective_cost(m, k, k == CollKind::send_recv ? std::vector<int>{0, 1} : ranks,
                                 bytes, a.algorithm)
                .algorithm);
        if (host) {  // baseline: one thread copying the same bytes
          std::vector<char> src(S[i], 1), dst(S[i]);
          std::memcpy(dst.data(), src.data(), S[i]);
          for (int round = 0; round < kRounds; ++round) {
            double c0 = bench::now_seconds();
            for (int it = 0; it < iters; ++it) std::memcpy(dst.data(), src.data(), S[i]);
            const double t = (bench::now_seconds() - c0) / iters;
            copy_t[i] = round == 0 ? t : std::min(copy_t[i], t);
          }
        }
      }
      c.barrier();
    }
  });

  const double f = sim::busbw_factor(k, p);
  std::printf("# nxd-bench-collectives: backend sim, op %s, %d ranks (threads), dtype %s\n",
              a.op.c_str(), p, dtype_name(a.dtype));
  std::printf("# machine %s, algorithm %s; GB/s = 1e9 B/s; busbw = algbw x %.4f (nccl-tests)\n",
              m.name.c_str(), sim::algorithm_name(a.algorithm), f);
  std::printf(
      "# host(us): best of %d runs of the mean call time (slowest rank); p50(us): median call\n"
      "# baseline: one-thread memcpy of the same size in this run; ratio = host busbw / "
      "memcpy GB/s\n",
      kRounds);
  std::printf("#%11s %11s %5s | %11s %9s %9s %9s %9s %6s | %11s %9s %9s %6s\n", "size(B)", "count",
              "type", "host(us)", "p50(us)", "algbw", "busbw", "memcpy", "ratio", "model(us)",
              "algbw", "busbw", "algo");
  for (size_t i = 0; i < S.size(); ++i) {
    if (counts[i] == 0) continue;
    const double bytes = double(S[i]);
    double ht = *std::max_element(host_t[i].begin(), host_t[i].end());
    double mt = model_t[i];
    if (ht > 0) {
      double alg = bytes / ht / 1e9, cp = bytes / copy_t[i] / 1e9;
      double p50 = *std::max_element(host_p50[i].begin(), host_p50[i].end());
      std::printf(" %11lld %11lld %5s | %11.2f %9.2f %9.2f %9.2f %9.2f %6.2f |", (long long)S[i],
                  (long long)counts[i], dtype_name(a.dtype), ht * 1e6, p50 * 1e6, alg, alg * f, cp,
                  alg * f / cp);
    } else {
      std::printf(" %11lld %11lld %5s | %11s %9s %9s %9s %9s %6s |", (long long)S[i],
                  (long long)counts[i], dtype_name(a.dtype), "model-only", "-", "-", "-", "-", "-");
    }
    std::printf(" %11.2f %9.2f %9.2f %6s\n", mt * 1e6, bytes / mt / 1e9, bytes / mt / 1e9 * f,
                algo[i]);
  }
  print_published(k, m.name);
  return 0;
}

// ------------------------------------------------------------------------------------------
// mpi

#if NXD_WITH_MPI
void run_raw(CollKind k, void* a, void* b, int n, MPI_Datatype t, int p, int r) {
  switch (k) {
    case CollKind::all_reduce:
      MPI_Allreduce(MPI_IN_PLACE, a, n, t, MPI_SUM, MPI_COMM_WORLD);
      break;
    case CollKind::all_gather:
      MPI_Allgather(a, n, t, b, n, t, MPI_COMM_WORLD);
      break;
    case CollKind::reduce_scatter:
      MPI_Reduce_scatter_block(a, b, n, t, MPI_SUM, MPI_COMM_WORLD);
      break;
    case CollKind::broadcast:
      MPI_Bcast(a, n, t, 0, MPI_COMM_WORLD);
      break;
    case CollKind::all_to_all:
      MPI_Alltoall(a, n, t, b, n, t, MPI_COMM_WORLD);
      break;
    case CollKind::send_recv:
      MPI_Sendrecv(a, n, t, (r + 1) % p, 0, b, n, t, (r + p - 1) % p, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
      break;
    default:
      break;
  }
}
#endif

int run_mpi(const Args& a, int argc, char** argv) {
#if NXD_WITH_MPI
  mpi::Session session(&argc, &argv);
  Communicator& c = world();
  const int p = c.size(), r = c.rank();
  const CollKind k = parse_op(a.op);
  NXD_CHECK(a.ranks == 0 || a.ranks == p, "[nxd-bench-collectives] --ranks ", a.ranks,
            " differs from the MPI world size ", p, " (use mpirun -np)");
  NXD_CHECK(a.dtype != DType::bf16, "[nxd-bench-collectives] raw MPI has no bf16; use f32");
  NXD_CHECK(k != CollKind::send_recv || p >= 2,
            "[nxd-bench-collectives] sendrecv needs >= 2 ranks");
  const int64_t es = dtype_size(a.dtype);
  const double f = sim::busbw_factor(k, p);
  if (r == 0) {
    std::printf("# nxd-bench-collectives: backend mpi, op %s, %d processes, dtype %s\n",
                a.op.c_str(), p, dtype_name(a.dtype));
    std::printf(
        "# baseline: raw MPI_* on the same buffers in this run; GB/s = 1e9 B/s; busbw = "
        "algbw x %.4f\n",
        f);
    const mpi::Tuning tu = mpi::tuning();
    std::printf(
        "# nxd algo: mpi = MPI's own collective, ring = nxd's pipelined ring (chunk %lld B, "
        "depth %d, auto from %lld B; NXD_MPI_ALGO/CHUNK/DEPTH/RING_MIN)\n",
        (long long)tu.chunk_bytes, tu.depth, (long long)tu.ring_min_bytes);
    std::printf("#%11s %11s %5s | %11s %9s %9s %5s | %11s %9s %9s | %6s\n", "size(B)", "count",
                "type", "nxd(us)", "algbw", "busbw", "algo", "raw(us)", "algbw", "busbw", "ratio");
  }
  for (int64_t bytes : sizes(a)) {
    const int64_t n = count_for(k, bytes, p, es);
    if (n == 0) continue;
    auto [ea, eb] = buffer_elems(k, n, p);
    std::vector<char> A(ea * es, 0), B(std::max<int64_t>(eb, 1) * es, 0);
    const int iters = iters_for(a, bytes);
    auto time = [&](auto&& once) {
      for (int w = 0; w < 2; ++w) once();
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int it = 0; it < iters; ++it) once();
      double t = (MPI_Wtime() - t0) / iters, tmax = 0;
      MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      return tmax;
    };
    // Alternate to share any drift, swapping which goes first each round (raw nxd, nxd raw,
    // raw nxd); keep the best of each.
    double t_raw = 1e30, t_nxd = 1e30;
    auto raw = [&] {
      t_raw = std::min(t_raw, time([&] {
                         run_raw(k, A.data(), B.data(), static_cast<int>(n), mpi::datatype(a.dtype),
                                 p, r);
                       }));
    };
    auto ours = [&] {
      t_nxd = std::min(t_nxd, time([&] { run_op(c, k, A.data(), B.data(), n, a.dtype); }));
    };
    for (int round = 0; round < kRounds; ++round) {
      if (round % 2 == 0) {
        raw();
        ours();
      } else {
        ours();
        raw();
      }
    }
    if (r == 0) {
      double an = bytes / t_nxd / 1e9, ar = bytes / t_raw / 1e9;
      const bool reduces_or_gathers =
          k == CollKind::all_reduce || k == CollKind::all_gather || k == CollKind::reduce_scatter;
      std::printf(" %11lld %11lld %5s | %11.2f %9.2f %9.2f %5s | %11.2f %9.2f %9.2f | %6.3f\n",
                  (long long)bytes, (long long)n, dtype_name(a.dtype), t_nxd * 1e6, an, an * f,
                  reduces_or_gathers
                      ? mpi::algorithm_for(k == CollKind::all_reduce   ? mpi::Op::all_reduce
                                           : k == CollKind::all_gather ? mpi::Op::all_gather
                                                                       : mpi::Op::reduce_scatter,
                                           bytes, p)
                      : "mpi",
                  t_raw * 1e6, ar, ar * f, t_raw / t_nxd);
    }
  }
  return 0;
#else
  (void)a;
  (void)argc;
  (void)argv;
  throw ConfigError("[nxd-bench-collectives] --backend mpi: nxd was built without MPI");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    if (a.backend == "mpi") return run_mpi(a, argc, argv);
    return run_sim(a);
  } catch (const UserError& e) {
    std::fprintf(stderr, "%s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::logic_error& e) {  // std::stoi/stod on a bad number
    std::fprintf(stderr, "[nxd-bench-collectives] bad numeric flag value (%s)\n%s", e.what(),
                 kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nxd-bench-collectives: %s\n", e.what());
    return 1;
  }
}
