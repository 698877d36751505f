#pragma once
// Shared benchmark helpers: a timer (warm-up, repetitions, median) and flag parsing. Every bench
// measures its baseline in the same run, interleaved with the candidate so that both see the
// same machine load, and prints one parseable `key=value` line per case.
//
// Interleaving is by blocks, not by single calls: time_pair and time_rotation time each function
// for a block of consecutive calls (at least TimerOptions::block_calls calls and block_seconds of
// timed calls), rotate the order of the blocks from round to round, and call
// TimerOptions::between_blocks (if set) after every block, outside the timed region. Medians are
// still per call. Why: a multi-threaded raw OpenBLAS call (the usual baseline) leaves OpenBLAS's
// idle worker busy-waiting for ~0.1 s, so with per-call alternation every call timed after a
// cblas call ran with an extra busy thread, which on a 2-core machine biased the comparison
// against nxd. Benches that time raw cblas_* at more than one thread set between_blocks =
// blas::stop_openblas_pool; the first OpenBLAS call of each block then restarts the pool (thread
// creation, tens of microseconds), one call in a block of >= 5, which the per-call median (and
// the min) excludes.
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace nxd::bench {

struct TimerOptions {
  int warmup = 2;            // untimed calls first
  int min_reps = 5;          // at least this many timed calls
  int max_reps = 200;        // at most this many
  double min_seconds = 0.3;  // keep repeating until this much time was measured (per function)
  // Interleaved timers only (time_pair, time_rotation): a block of one function is at least
  // block_calls consecutive calls and at least block_seconds of timed calls (fewer only when
  // max_reps runs out).
  int block_calls = 5;
  double block_seconds = 0.005;
  // Called after the warm-up, after every block and after the last one (time_fn: after the last
  // call), never inside a timed call; nullptr: nothing. Benches timing raw cblas_* at more than one
  // thread set blas::stop_openblas_pool so that OpenBLAS's spinning idle worker does not run into
  // the next function's block (or whatever the bench does next).
  void (*between_blocks)() = nullptr;
};

struct Timing {
  double median = 0;  // seconds per call (wall clock)
  double min = 0;
  double cpu_median = 0;  // process CPU seconds per call (all threads): unaffected by preemption
  int reps = 0;
};

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

inline double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline double median_of(std::vector<double> t) {
  if (t.empty()) return 0;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

// q in [0, 1] of v (nearest rank; 0 when empty).
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto k = static_cast<size_t>(std::ceil(q * double(v.size())));
  return v[std::min(v.size() - 1, k == 0 ? 0 : k - 1)];
}

inline Timing summarize(const std::vector<double>& t, const std::vector<double>& cpu = {}) {
  Timing r;
  if (t.empty()) return r;
  r.median = median_of(t);
  r.min = *std::min_element(t.begin(), t.end());
  r.cpu_median = median_of(cpu);
  r.reps = static_cast<int>(t.size());
  return r;
}

// Times one function: median seconds per call.
template <class F>
Timing time_fn(F&& f, TimerOptions o = {}) {
  for (int i = 0; i < o.warmup; ++i) f();
  std::vector<double> t, c;
  double total = 0;
  while (static_cast<int>(t.size()) < o.min_reps ||
         (total < o.min_seconds && static_cast<int>(t.size()) < o.max_reps)) {
    const double s = now_seconds(), cs = cpu_seconds();
    f();
    c.push_back(cpu_seconds() - cs);
    const double d = now_seconds() - s;
    t.push_back(d);
    total += d;
  }
  if (o.between_blocks) o.between_blocks();
  return summarize(t, c);
}

// Times n functions interleaved by blocks (see the top of this file): round r times one block of
// each function in the order r, r+1, ... (mod n), e.g. for three: a b c, b c a, c a b, ..., so
// that over the run each function sees the same machine load and each is first as often. Rounds
// go on until every function has min_reps calls and min_seconds of timed calls (or max_reps calls).
// Medians, minima and reps are per function (reps may differ: a faster function makes more calls
// in a block).
template <size_t N>
std::array<Timing, N> time_rotation(const std::array<std::function<void()>, N>& fns,
                                    const TimerOptions& o) {
  for (int i = 0; i < o.warmup; ++i)
    for (const auto& f : fns) f();
  if (o.between_blocks) o.between_blocks();
  const int cap = std::max(o.min_reps, o.max_reps);
  std::array<std::vector<double>, N> t, cpu;
  std::array<double, N> total{};
  auto done = [&](size_t f) {
    const int n = static_cast<int>(t[f].size());
    return n >= cap || (n >= o.min_reps && total[f] >= o.min_seconds);
  };
  for (size_t round = 0;; ++round) {
    bool all_done = true;
    for (size_t f = 0; f < N; ++f) all_done = all_done && done(f);
    if (all_done) break;
    for (size_t j = 0; j < N; ++j) {
      const size_t f = (round + j) % N;
      if (static_cast<int>(t[f].size()) >= cap) continue;
      double block = 0;
      for (int calls = 0; (calls < o.block_calls || block < o.block_seconds) &&
                          static_cast<int>(t[f].size()) < cap;
           ++calls) {
        const double s = now_seconds(), cs = cpu_seconds();
        fns[f]();
        cpu[f].push_back(cpu_seconds() - cs);
        const double d = now_seconds() - s;
        t[f].push_back(d);
        block += d;
      }
      total[f] += block;
      if (o.between_blocks) o.between_blocks();
    }
  }
  std::array<Timing, N> r;
  for (size_t f = 0; f < N; ++f) r[f] = summarize(t[f], cpu[f]);
  return r;
}

// Times a candidate and its baseline interleaved by blocks (a-block, b-block, b-block, a-block,
// ...; see time_rotation): medians of each.
template <class A, class B>
std::pair<Timing, Timing> time_pair(A&& a, B&& b, TimerOptions o = {}) {
  const auto r = time_rotation<2>({std::function<void()>(a), std::function<void()>(b)}, o);
  return {r[0], r[1]};
}

// Flags: each bench declares its flags (a switch, or a flag with a value), so `--help` prints
// them and exits 0, and an unknown flag, a missing or malformed value, or a value outside the
// flag's choices exits 2 with one line naming it (a mistyped flag never runs the full bench).
struct Flag {
  std::string name;                  // "--threads"
  std::string value;                 // "N" for a flag with a value; empty for a switch
  std::string help;                  // one line
  std::vector<std::string> choices;  // allowed values (empty: any)
};

// The decode-kernel benches' timing (nxd-bench-gemv-rows, -gemv-bf16-rows): rotating blocks, at
// least 10 timed calls per function and up to 300 over at least 0.3 s (30 over 0.05 s when
// `quick`); `between_blocks` after each block (blas::stop_openblas_pool at more than one thread).
inline TimerOptions decode_kernel_timer(bool quick, void (*between_blocks)()) {
  TimerOptions to;
  to.warmup = 2;
  to.min_reps = 10;
  to.max_reps = quick ? 30 : 300;
  to.min_seconds = quick ? 0.05 : 0.3;
  to.between_blocks = between_blocks;
  return to;
}

class Args {
 public:
  Args(int argc, char** av, std::string synopsis, std::vector<Flag> flags)
      : prog_(argc > 0 ? av[0] : "bench"),
        synopsis_(std::move(synopsis)),
        flags_(std::move(flags)) {
    const size_t slash = prog_.rfind('/');
    if (slash != std::string::npos) prog_ = prog_.substr(slash + 1);
    for (int i = 1; i < argc; ++i) {
      const std::string a = av[i];
      if (a == "--help" || a == "-h") usage(0);
      const Flag* f = find(a);
      if (f == nullptr)
        fail(a.rfind("--", 0) == 0 ? "unknown flag " + a : "unexpected argument " + a);
      if (f->value.empty()) {
        given_.emplace_back(a, "");
        continue;
      }
      if (i + 1 >= argc) fail(a + " needs a value (" + f->value + ")");
      const std::string v = av[++i];
      if (!f->choices.empty() &&
          std::find(f->choices.begin(), f->choices.end(), v) == f->choices.end())
        fail(a + " " + v + ": expected one of " + join(f->choices));
      given_.emplace_back(a, v);
    }
  }
  bool has(const std::string& flag) const {
    declared(flag);
    for (const auto& g : given_)
      if (g.first == flag) return true;
    return false;
  }
  long get_int(const std::string& flag, long dflt) const {
    const std::string* v = value(flag);
    if (v == nullptr) return dflt;
    char* end = nullptr;
    errno = 0;
    const long r = std::strtol(v->c_str(), &end, 10);
    if (v->empty() || *end != 0 || errno != 0) fail(flag + " " + *v + ": expected an integer");
    return r;
  }
  // An integer in [lo, hi]; exit 2 naming the flag otherwise.
  long get_int(const std::string& flag, long dflt, long lo, long hi) const {
    const long r = get_int(flag, dflt);
    if (r < lo || r > hi)
      fail(flag + " " + std::to_string(r) + ": expected " + std::to_string(lo) + ".." +
           std::to_string(hi));
    return r;
  }
  // A comma-separated list of integers in [lo, hi] ("1,4,8"); exit 2 naming the flag otherwise.
  std::vector<int64_t> get_int_list(const std::string& flag, const std::string& dflt, int64_t lo,
                                    int64_t hi) const {
    const std::string* given = value(flag);
    const std::string v = given == nullptr ? dflt : *given;
    std::vector<int64_t> r;
    for (size_t at = 0; at <= v.size();) {
      const size_t comma = std::min(v.find(',', at), v.size());
      const std::string item = v.substr(at, comma - at);
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || *end != 0 || errno != 0 || x < lo || x > hi)
        fail(flag + " " + v + ": expected integers " + std::to_string(lo) + ".." +
             std::to_string(hi) + " separated by commas");
      r.push_back(x);
      at = comma + 1;
    }
    return r;
  }
  std::string get_str(const std::string& flag, const std::string& dflt) const {
    const std::string* v = value(flag);
    return v == nullptr ? dflt : *v;
  }

 private:
  const Flag* find(const std::string& name) const {
    for (const Flag& f : flags_)
      if (f.name == name) return &f;
    return nullptr;
  }
  void declared(const std::string& flag) const {
    if (find(flag) == nullptr) {  // a bench reading a flag it did not declare: its own bug
      std::fprintf(stderr, "%s: internal: flag %s read but not declared\n", prog_.c_str(),
                   flag.c_str());
      std::exit(1);
    }
  }
  const std::string* value(const std::string& flag) const {
    declared(flag);
    const std::string* r = nullptr;
    for (const auto& g : given_)
      if (g.first == flag) r = &g.second;  // the last one wins
    return r;
  }
  static std::string join(const std::vector<std::string>& v) {
    std::string r;
    for (const auto& s : v) r += (r.empty() ? "" : ", ") + s;
    return r;
  }
  [[noreturn]] void fail(const std::string& what) const {
    std::fprintf(stderr, "%s: %s (see %s --help)\n", prog_.c_str(), what.c_str(), prog_.c_str());
    std::exit(2);
  }
  [[noreturn]] void usage(int code) const {
    std::printf("usage: %s [flags]\n%s\n\nflags:\n", prog_.c_str(), synopsis_.c_str());
    for (const Flag& f : flags_) {
      std::string lhs = f.name + (f.value.empty() ? "" : " " + f.value);
      std::printf("  %-24s %s", lhs.c_str(), f.help.c_str());
      if (!f.choices.empty()) std::printf(" (%s)", join(f.choices).c_str());
      std::printf("\n");
    }
    std::printf("  %-24s %s\n", "--help", "this text");
    std::exit(code);
  }
  std::string prog_, synopsis_;
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> given_;
};

}  // namespace nxd::bench
