#pragma once
// Shared benchmark helpers: a timer (warm-up, repetitions, median) and flag parsing. Every bench
// measures its baseline in the same run, interleaved with the candidate so that both see the
// same machine load, and prints one parseable `key=value` line per case.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

namespace nxd::bench {

struct TimerOptions {
  int warmup = 2;            // untimed calls first
  int min_reps = 5;          // at least this many timed calls
  int max_reps = 200;        // at most this many
  double min_seconds = 0.3;  // keep repeating until this much time was measured (per function)
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
  return summarize(t, c);
}

// Times a candidate and its baseline alternately (a, b, a, b, ...): medians of each.
template <class A, class B>
std::pair<Timing, Timing> time_pair(A&& a, B&& b, TimerOptions o = {}) {
  for (int i = 0; i < o.warmup; ++i) {
    a();
    b();
  }
  std::vector<double> ta, tb, ca, cb;
  double total_a = 0, total_b = 0;
  while (static_cast<int>(ta.size()) < o.min_reps ||
         (std::min(total_a, total_b) < o.min_seconds && static_cast<int>(ta.size()) < o.max_reps)) {
    double s = now_seconds(), cs = cpu_seconds();
    a();
    ca.push_back(cpu_seconds() - cs);
    double d = now_seconds() - s;
    ta.push_back(d);
    total_a += d;
    s = now_seconds();
    cs = cpu_seconds();
    b();
    cb.push_back(cpu_seconds() - cs);
    d = now_seconds() - s;
    tb.push_back(d);
    total_b += d;
  }
  return {summarize(ta, ca), summarize(tb, cb)};
}

// Minimal flags: --name value and --switch.
struct Args {
  std::vector<std::string> argv;
  Args(int argc, char** av) : argv(av + 1, av + argc) {}
  bool has(const std::string& flag) const {
    return std::find(argv.begin(), argv.end(), flag) != argv.end();
  }
  long get_int(const std::string& flag, long dflt) const {
    for (size_t i = 0; i + 1 < argv.size(); ++i)
      if (argv[i] == flag) return std::strtol(argv[i + 1].c_str(), nullptr, 10);
    return dflt;
  }
  std::string get_str(const std::string& flag, const std::string& dflt) const {
    for (size_t i = 0; i + 1 < argv.size(); ++i)
      if (argv[i] == flag) return argv[i + 1];
    return dflt;
  }
};

}  // namespace nxd::bench
