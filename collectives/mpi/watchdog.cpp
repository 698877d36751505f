// The MPI backend's collective timeout (mpi/watchdog.h).
#include "nxd/collectives/mpi/watchdog.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <string>
#include <thread>

#include "nxd/collectives/mpi/mpi.h"
#include "nxd/runtime/error.h"

namespace nxd::mpi::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kQueryTag = 0x6e7864;   // "where are you?"
constexpr int kStatusTag = 0x6e7865;  // the answer: a Status
// Polls yield the core for the first kYieldS of a wait (a small collective completes within
// tens of microseconds when both sides poll; sleeping at once made each cost ~200 us), then sleep
// kMinSleepS doubling to kMaxSleepS (a waiting rank wakes at most 4000 times a second).
constexpr double kYieldS = 2e-4, kMinSleepS = 2e-5, kMaxSleepS = 2.5e-4;

MPI_Comm g_watch = MPI_COMM_NULL;
int g_world_rank = 0;

// A rank's answer: where it waits and for how long.
struct Status {
  std::array<char, 200> where{};
  double waited_s = 0;
};

// Sends in flight on the side channel (completed by later polls; a std::list keeps the buffers
// where MPI was given them).
struct Outgoing {
  MPI_Request req = MPI_REQUEST_NULL;
  Status status;
  int query = 0;
};
std::list<Outgoing> g_out;

// What this rank waits in right now (answers to queries), and since when.
const Waiting* g_current = nullptr;
Clock::time_point g_since;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// "0,1,2"
std::string list_str(const std::vector<int>& g) {
  std::string s;
  for (size_t i = 0; i < g.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(g[i]);
  }
  return s;
}

std::string group_str(const std::vector<int>& g) {
  return str("[", list_str(g), "]");
}

// "all_reduce #12 on group [0,1,2]"; point-to-point: "send to rank 3 on group [2,3]".
std::string describe(const Waiting& w) {
  if (w.peer >= 0)
    return str(w.op, w.op[0] == 's' ? " to" : " from", " rank ",
               w.group[static_cast<size_t>(w.peer)], " on group ", group_str(w.group));
  return str(w.op, " #", w.seq, " on group ", group_str(w.group));
}

void send_query(int world_rank) {
  Outgoing& o = g_out.emplace_back();
  MPI_Isend(&o.query, 1, MPI_INT, world_rank, kQueryTag, g_watch, &o.req);
}

void send_status(int world_rank) {
  Outgoing& o = g_out.emplace_back();
  const std::string w = g_current ? describe(*g_current) : "no call";
  std::snprintf(o.status.where.data(), o.status.where.size(), "%s", w.c_str());
  o.status.waited_s = g_current ? seconds_since(g_since) : 0;
  MPI_Isend(&o.status, sizeof(Status), MPI_BYTE, world_rank, kStatusTag, g_watch, &o.req);
}

// Completes finished sends, answers queries, and files answers in `replies` (or drops them: a
// late answer to a wait that completed).
void serve(std::map<int, Status>* replies) {
  for (auto it = g_out.begin(); it != g_out.end();) {
    int done = 0;
    MPI_Test(&it->req, &done, MPI_STATUS_IGNORE);
    it = done ? g_out.erase(it) : std::next(it);
  }
  for (;;) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, g_watch, &flag, &st);
    if (!flag) return;
    if (st.MPI_TAG == kQueryTag) {
      int q = 0;
      MPI_Recv(&q, 1, MPI_INT, st.MPI_SOURCE, kQueryTag, g_watch, MPI_STATUS_IGNORE);
      send_status(st.MPI_SOURCE);
    } else {
      Status s;
      MPI_Recv(&s, sizeof(Status), MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, g_watch, MPI_STATUS_IGNORE);
      s.where.back() = '\0';
      if (replies) (*replies)[st.MPI_SOURCE] = s;
    }
  }
}

// Polls the requests once: true when all completed (rc holds MPI's error code).
bool poll(int n, MPI_Request* reqs, MPI_Status* statuses, int& rc) {
  int done = 0;
  rc = MPI_Testall(n, reqs, &done, statuses);
  return rc != MPI_SUCCESS || done != 0;
}

// The members this wait needs (world ranks).
std::vector<int> awaited(const Waiting& w) {
  if (w.peer >= 0) return {w.group[static_cast<size_t>(w.peer)]};
  std::vector<int> r;
  for (size_t i = 0; i < w.group.size(); ++i)
    if (static_cast<int>(i) != w.rank) r.push_back(w.group[i]);
  return r;
}

[[noreturn]] void report_and_abort(const Waiting& w, double waited, double grace,
                                   const std::map<int, Status>& replies) {
  const std::string me = describe(w);
  std::vector<int> silent_ranks, same_ranks;
  std::string elsewhere;
  for (int r : awaited(w)) {
    auto it = replies.find(r);
    if (it == replies.end()) {
      silent_ranks.push_back(r);
    } else if (w.peer < 0 && me == it->second.where.data()) {
      same_ranks.push_back(r);
    } else {
      elsewhere += str("; rank ", r, " waits in ", it->second.where.data(), " (for ",
                       static_cast<int64_t>(it->second.waited_s * 1e3), " ms)");
    }
  }
  const std::string silent = list_str(silent_ranks), same = list_str(same_ranks);
  std::string msg = str("[mpi] collective timeout: rank ", g_world_rank, " waited ",
                        static_cast<int64_t>(waited * 1e3), " ms in ", me, " (collective_timeout ",
                        collective_timeout(), " s): ");
  if (!silent.empty())
    msg += str("rank(s) ", silent, " never arrived (no answer within ",
               static_cast<int64_t>(grace * 1e3), " ms: hung, stopped or cut off)");
  else
    msg += "every awaited rank answers but has not arrived";
  if (!same.empty()) msg += str("; rank(s) ", same, " wait in the same call");
  msg += elsewhere + "; aborting the job";
  std::fprintf(stderr, "%s\n", msg.c_str());
  std::fflush(stderr);
  // a moment for the launcher to forward the line before MPI_Abort tears the job down (Open MPI
  // drops a rank's last output now and then: 200 ms lost it once on a loaded machine)
  std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace

void watch_start() {
  MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
  MPI_Comm_dup(MPI_COMM_WORLD, &g_watch);
}

void watch_stop() {
  for (Outgoing& o : g_out) MPI_Request_free(&o.req);
  g_out.clear();
  if (g_watch != MPI_COMM_NULL) MPI_Comm_free(&g_watch);
}

bool timed() {
  return collective_timeout() > 0 && g_watch != MPI_COMM_NULL;
}

int wait_all(int n, MPI_Request* reqs, const Waiting& w, MPI_Status* statuses) {
  if (!timed()) return MPI_Waitall(n, reqs, statuses);
  const double timeout = collective_timeout();
  const Waiting* outer = g_current;
  const Clock::time_point outer_since = g_since;
  g_current = &w;
  g_since = Clock::now();
  struct Restore {
    const Waiting* w;
    Clock::time_point t;
    ~Restore() { g_current = w, g_since = t; }
  } restore{outer, outer_since};
  int rc = MPI_SUCCESS;
  double sleep_s = kMinSleepS;
  while (!poll(n, reqs, statuses, rc)) {
    if (seconds_since(g_since) < kYieldS) {  // a short call: poll, yielding the core
      std::this_thread::yield();
      continue;
    }
    serve(nullptr);
    if (seconds_since(g_since) > timeout) {
      // ask the awaited members where they are; silent ones for the grace period never arrived
      const double waited = seconds_since(g_since);
      const double grace = std::clamp(timeout / 4, 1.0, 10.0);
      const std::vector<int> ask = awaited(w);
      for (int r : ask) send_query(r);
      std::map<int, Status> replies;
      const Clock::time_point t = Clock::now();
      while (seconds_since(t) < grace && replies.size() < ask.size()) {
        if (poll(n, reqs, statuses, rc)) return rc;  // only slow
        serve(&replies);
        std::this_thread::sleep_for(std::chrono::duration<double>(kMaxSleepS));
      }
      report_and_abort(w, waited, grace, replies);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
    sleep_s = std::min(2 * sleep_s, kMaxSleepS);
  }
  return rc;
}

}  // namespace nxd::mpi::detail
