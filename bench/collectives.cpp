// nxd-bench-collectives (bench/): an nccl-tests-style table (size, count, dtype, time, algbw, busbw
// with nccl-tests' bus-bandwidth factors; GB/s = 1e9 B/s) for one collective over a range of sizes.
//
//   --backend sim: ranks are threads; prints the host-measured time and bandwidth, a one-thread
//     memcpy of the same size measured in the same run (the baseline) and the ratio, and the
//     modeled time/busbw on --instance, plus the published nccom-test figures next to the model.
//     Rows whose host buffers would not fit the host budget are modeled only (shape-only calls).
//   --backend mpi (run under mpirun; collectives_mpi.cpp): nxd's MPI communicator, raw MPI_* and
//     a memcpy of the same bytes on every rank, interleaved over --rounds rounds; medians, the
//     ratio raw/nxd time with its spread (target >= 0.95 from 1 MiB), and with --algos each of
//     nxd's algorithms forced in turn.
// Bad flags print a message and exit with code 2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "bench_util.h"
#include "collectives.h"
#include "nxd/collectives/communicator.h"
#include "nxd/collectives/sim/nccom_figures.h"

namespace nxd::bench::coll {
namespace {

const char* kUsage =
    "usage: nxd-bench-collectives [--backend sim|mpi] [--op all_reduce|all_gather|reduce_scatter|"
    "broadcast|all_to_all|sendrecv]\n"
    "         [--min 8] [--max 256M] [--instance trn1.32xlarge] [--ranks N] [--dtype f32]\n"
    "         [--iters N] [--rounds N] [--algorithm auto|ring|rdh|mesh|kangaring]\n"
    "         [--host-budget-gib 8] [--algos mpi,ring,rdh (MPI: nxd's algorithms forced in "
    "turn)]\n";

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

std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = v.find(',', b)) != std::string::npos; b = e + 1)
    out.push_back(v.substr(b, e - b));
  out.push_back(v.substr(b));
  for (const std::string& x : out)
    NXD_CHECK(x == "mpi" || x == "ring" || x == "rdh",
              "[nxd-bench-collectives] --algos takes mpi, ring and rdh, got '", x, "'");
  return out;
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
    else if (f == "--rounds")
      a.rounds = std::stoi(v);
    else if (f == "--algos")
      a.algos = split_list(v);
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
  NXD_CHECK(a.ranks >= 0 && a.iters >= 0 && a.rounds >= 0,
            "[nxd-bench-collectives] --ranks/--iters/--rounds must be >= 0");
  return a;
}

}  // namespace

CollKind parse_op(const std::string& s) {
  for (CollKind k : {CollKind::all_reduce, CollKind::all_gather, CollKind::reduce_scatter,
                     CollKind::broadcast, CollKind::all_to_all})
    if (s == sim::coll_kind_name(k)) return k;
  if (s == "sendrecv") return CollKind::send_recv;
  throw InvalidArgument(str("[nxd-bench-collectives] unknown --op '", s, "'"));
}

int64_t count_for(const Shape& s, int64_t bytes) {
  int64_t n = bytes / dtype_size(s.dtype);
  if (s.kind == CollKind::all_gather || s.kind == CollKind::reduce_scatter ||
      s.kind == CollKind::all_to_all)
    n /= s.ranks;
  return n;
}

int iters_for(const Args& a, int64_t bytes) {
  if (a.iters > 0) return a.iters;
  return static_cast<int>(
      std::clamp<int64_t>((int64_t{512} << 20) / std::max<int64_t>(bytes, 1 << 16), 3, 200));
}

void run_op(Communicator& c, const Row& w) {
  switch (w.kind) {
    case CollKind::all_reduce:
      c.all_reduce(w.a, w.a, w.count, w.dtype, ReduceOp::sum);
      break;
    case CollKind::all_gather:
      c.all_gather(w.a, w.b, w.count, w.dtype);
      break;
    case CollKind::reduce_scatter:
      c.reduce_scatter(w.a, w.b, w.count, w.dtype, ReduceOp::sum);
      break;
    case CollKind::broadcast:
      c.broadcast(w.a, w.count, w.dtype, 0);
      break;
    case CollKind::all_to_all:
      c.all_to_all(w.a, w.b, w.count, w.dtype);
      break;
    case CollKind::send_recv: {
      const int p = c.size(), r = c.rank();
      Work q = c.isend(w.a, w.count, w.dtype, (r + 1) % p, 0);
      c.recv(w.b, w.count, w.dtype, (r + p - 1) % p, 0);
      q.wait();
      break;
    }
    default:
      break;
  }
}

std::pair<int64_t, int64_t> buffer_elems(const Shape& s, int64_t n) {
  const int p = s.ranks;
  switch (s.kind) {
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

namespace {

// ------------------------------------------------------------------------------------------
// sim

void print_published(CollKind k, const std::string& instance) {
  // the rows of the instance's generation (the default machine is trn1's)
  const std::string family = instance.find("trn2") != std::string::npos ? "trn2"
                             : instance.empty() || instance.find("trn1") != std::string::npos
                                 ? "trn1"
                                 : "";
  bool header = false;
  for (const sim::NccomFigure& p : sim::kNccomFigures) {
    if (p.kind != k) continue;
    if (family.empty() || std::string(p.instance).find(family) == std::string::npos) continue;
    if (!header) {
      std::printf(
          "\n# Published nccom-test figures (%s) vs the model (GiB/s as nccom-test "
          "prints)\n",
          family.c_str());
      std::printf("# %-40s %10s %12s %12s %9s %9s %6s  %s\n", "case", "size(B)", "pub time(us)",
                  "model(us)", "pub busbw", "mdl busbw", "err", "algo");
      header = true;
    }
    sim::CollCost c;
    const double us = sim::nccom_model_us(p, &c);
    double f = sim::busbw_factor(p.kind, p.ranks);
    double pub_bw = p.bytes / (p.us * 1e-6) * f / sim::kGiB;
    double mdl_bw = p.bytes / (us * 1e-6) * f / sim::kGiB;
    std::printf("  %-40s %10.0f %12.2f %12.2f %9.2f %9.2f %+5.0f%%  %s%s%s\n", p.what, p.bytes,
                p.us, us, pub_bw, mdl_bw, (us / p.us - 1) * 100, sim::algorithm_name(c.algorithm),
                p.calibration ? "  (calibration)" : "",
                p.sdk_floor_us > 0 ? str("  (+", p.sdk_floor_us, " us SDK floor)").c_str() : "");
  }
}

// What the sim run measured per size (index i of sizes(a)), on every rank r for the host times.
struct SimTimes {
  std::vector<std::vector<double>> host_t, host_p50;  // [i][r] seconds per call, -1: not run
  std::vector<double> model_t, copy_t;                // modeled seconds per call; memcpy's
  std::vector<const char*> algo;
  std::vector<int64_t> counts;  // elements per call (0: the size is skipped)
};

// Baseline: the best of `rounds` runs of `iters` one-thread copies of `bytes`, seconds per copy.
double memcpy_seconds(int64_t bytes, int iters, int rounds) {
  std::vector<char> src(bytes, 1), dst(bytes);
  std::memcpy(dst.data(), src.data(), bytes);
  double best = -1;
  for (int round = 0; round < rounds; ++round) {
    double c0 = bench::now_seconds();
    for (int it = 0; it < iters; ++it) std::memcpy(dst.data(), src.data(), bytes);
    const double t = (bench::now_seconds() - c0) / iters;
    best = round == 0 ? t : std::min(best, t);
  }
  return best;
}

// One size (index i) on this rank: host buffers while p x the buffers fit the host budget (else
// meta: modeled time only); the best of `sim_rounds` timed runs, the median call, and on rank 0
// the modeled time, the algorithm and the memcpy baseline.
void time_size(const Args& a, CollKind k, int p, int sim_rounds, const sim::MachineSpec& m,
               int64_t size, size_t i, SimTimes& t) {
  Communicator& c = world();
  const int r = c.rank();
  const int64_t es = dtype_size(a.dtype);
  const int64_t n = t.counts[i];
  auto [ea, eb] = buffer_elems({k, p, a.dtype}, n);
  const bool host = double(p) * (ea + eb) * es <= a.host_budget_gib * sim::kGiB;
  const Device d = host ? Device::host : Device::meta;
  Tensor ta = empty({ea}, a.dtype, d), tb = empty({std::max<int64_t>(eb, 1)}, a.dtype, d);
  void* pa = host ? ta.raw_data() : nullptr;
  void* pb = host ? tb.raw_data() : nullptr;
  if (host) {
    std::memset(pa, 0, ea * es);
    std::memset(pb, 0, eb * es);
  }
  const int iters = iters_for(a, size);
  if (host)
    for (int w = 0; w < 2; ++w) run_op(c, {k, pa, pb, n, a.dtype});
  sim::SimClock* clk = sim::current_sim_clock();
  // The best of `rounds` timed runs of `iters` calls (the machine's neighbours come and go);
  // the median call over all rounds is printed as well.
  const int reps = host ? iters : 1, rounds = host ? sim_rounds : 1;
  std::vector<double> per_call;
  per_call.reserve(size_t(reps) * rounds);
  double best = 1e30, m0 = 0, m1 = 0;
  for (int round = 0; round < rounds; ++round) {
    c.barrier();
    m0 = clk->now();
    const double t0 = bench::now_seconds();
    double q = t0;
    for (int it = 0; it < reps; ++it) {
      run_op(c, {k, pa, pb, n, a.dtype});
      const double q1 = bench::now_seconds();
      per_call.push_back(q1 - q);
      q = q1;
    }
    m1 = clk->now();
    best = std::min(best, (q - t0) / reps);
  }
  if (host) {
    t.host_t[i][r] = best;
    t.host_p50[i][r] = bench::median_of(per_call);
  }
  if (r == 0) {
    t.model_t[i] = (m1 - m0) / reps;
    std::vector<int> ranks(p);
    for (int j = 0; j < p; ++j) ranks[j] = j;
    double bytes = double(size);
    t.algo[i] = sim::algorithm_name(
        sim::collective_cost(m, k, k == CollKind::send_recv ? std::vector<int>{0, 1} : ranks, bytes,
                             a.algorithm)
            .algorithm);
    if (host) t.copy_t[i] = memcpy_seconds(size, iters, sim_rounds);
  }
  c.barrier();
}

void print_sim_table(const Args& a, CollKind k, int p, int sim_rounds, const sim::MachineSpec& m,
                     const std::vector<int64_t>& S, const SimTimes& t) {
  const double f = sim::busbw_factor(k, p);
  std::printf("# nxd-bench-collectives: backend sim, op %s, %d ranks (threads), dtype %s\n",
              a.op.c_str(), p, dtype_name(a.dtype));
  std::printf("# machine %s, algorithm %s; GB/s = 1e9 B/s; busbw = algbw x %.4f (nccl-tests)\n",
              m.name.c_str(), sim::algorithm_name(a.algorithm), f);
  std::printf(
      "# host(us): best of %d runs of the mean call time (slowest rank); p50(us): median call\n"
      "# baseline: one-thread memcpy of the same size in this run; ratio = host busbw / "
      "memcpy GB/s\n",
      sim_rounds);
  std::printf("#%11s %11s %5s | %11s %9s %9s %9s %9s %6s | %11s %9s %9s %6s\n", "size(B)", "count",
              "type", "host(us)", "p50(us)", "algbw", "busbw", "memcpy", "ratio", "model(us)",
              "algbw", "busbw", "algo");
  for (size_t i = 0; i < S.size(); ++i) {
    if (t.counts[i] == 0) continue;
    const double bytes = double(S[i]);
    double ht = *std::max_element(t.host_t[i].begin(), t.host_t[i].end());
    double mt = t.model_t[i];
    if (ht > 0) {
      double alg = bytes / ht / 1e9, cp = bytes / t.copy_t[i] / 1e9;
      double p50 = *std::max_element(t.host_p50[i].begin(), t.host_p50[i].end());
      std::printf(" %11lld %11lld %5s | %11.2f %9.2f %9.2f %9.2f %9.2f %6.2f |", (long long)S[i],
                  (long long)t.counts[i], dtype_name(a.dtype), ht * 1e6, p50 * 1e6, alg, alg * f,
                  cp, alg * f / cp);
    } else {
      std::printf(" %11lld %11lld %5s | %11s %9s %9s %9s %9s %6s |", (long long)S[i],
                  (long long)t.counts[i], dtype_name(a.dtype), "model-only", "-", "-", "-", "-",
                  "-");
    }
    std::printf(" %11.2f %9.2f %9.2f %6s\n", mt * 1e6, bytes / mt / 1e9, bytes / mt / 1e9 * f,
                t.algo[i]);
  }
}

int run_sim(const Args& a) {
  const CollKind k = parse_op(a.op);
  const int p = a.ranks > 0 ? a.ranks : 2;
  const int sim_rounds = a.rounds > 0 ? a.rounds : 3;
  NXD_CHECK(k != CollKind::send_recv || p >= 2,
            "[nxd-bench-collectives] sendrecv needs >= 2 ranks");
  sim::LaunchOptions o;
  o.world_size = p;
  o.instance = a.instance;
  o.algorithm = a.algorithm;
  o.memory_capacity = 0;  // host buffers are not HBM-limited in the benchmark
  sim::MachineSpec m = sim::resolve_machine(o);
  const std::vector<int64_t> S = sizes(a);
  SimTimes t;
  t.host_t.assign(S.size(), std::vector<double>(p, -1));
  t.host_p50 = t.host_t;
  t.model_t.assign(S.size(), 0);
  t.copy_t.assign(S.size(), -1);
  t.algo.assign(S.size(), "");
  t.counts.assign(S.size(), 0);
  for (size_t i = 0; i < S.size(); ++i) t.counts[i] = count_for({k, p, a.dtype}, S[i]);
  sim::launch(o, [&] {
    for (size_t i = 0; i < S.size(); ++i)
      if (t.counts[i] != 0) time_size(a, k, p, sim_rounds, m, S[i], i, t);
  });
  print_sim_table(a, k, p, sim_rounds, m, S, t);
  print_published(k, m.name);
  return 0;
}

}  // namespace
}  // namespace nxd::bench::coll

int main(int argc, char** argv) {
  using namespace nxd;
  using namespace nxd::bench::coll;
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
