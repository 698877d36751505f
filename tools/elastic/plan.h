#pragma once
// nxd-elastic's decisions, kept apart from the processes so they are unit-tested: the hosts and
// their slots, the layout a set of slots allows (TP x PP and the global batch kept, DP shrinks,
// gradient accumulation grows), which ranks and hosts a failed mpirun names, and the merge of
// the metrics.csv pieces written across restarts (docs/design/run_safety.md, "Run safety").
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace nxd::elastic {

struct Host {
  std::string name;
  int slots = 0;
};
// "h1:2,h2:2" (a host without ":n" has 1 slot); a name given twice adds its slots. Throws
// UsageError naming the bad entry.
std::vector<Host> parse_hosts(const std::string& spec);
// An Open MPI style hostfile: "name slots=N" per line, '#' comments.
std::vector<Host> read_hostfile(const std::filesystem::path& file);
int total_slots(const std::vector<Host>& hosts);
// "h1:2,h2:1" for mpirun --host (hosts without slots left out).
std::string host_arg(const std::vector<Host>& hosts);

struct Layout {
  int64_t tp = 1, pp = 1, dp = 1;
  int64_t micro_batch = 1, accumulation = 1;
  int64_t world() const { return tp * pp * dp; }
};
std::string describe(const Layout& l);  // "TP2 x PP1 x DP2 (world 4, micro batch 4 x 1 steps)"

struct LayoutRequest {
  int64_t tp = 1, pp = 1, global_batch = 1;
  std::optional<int64_t> micro_batch;  // null: global / DP (then pinned for later launches)
};
// The largest DP with tp*pp*dp <= slots, global_batch divisible by micro_batch * dp and `fits`
// (when given: the whole configuration resolves with it); nullopt when not even DP 1 fits.
std::optional<Layout> choose_layout(const LayoutRequest& req, int slots,
                                    const std::function<bool(const Layout&)>& fits = {});

// What a failed launch's stderr says: the ranks that died or aborted, and the nodes named; when a
// rank reports a collective timeout, only the ranks it names as never arrived (no nodes).
struct FailureReport {
  std::set<int> ranks;
  std::set<std::string> nodes;
};
FailureReport parse_failure(const std::string& mpirun_stderr);
// The host holding `rank` when ranks fill the hosts in order (mpirun's --map-by slot).
std::optional<std::string> host_of_rank(const std::vector<Host>& hosts, int rank);

// metrics.csv pieces (oldest first, the final metrics.csv last): each piece keeps its rows
// before the next non-empty piece's first step; the last keeps all. Steps are column "step".
struct MergeResult {
  std::string text;  // header + rows
  int64_t rows = 0;
  bool ok = false;  // false: a piece's header differs (nothing merged)
  std::string why;
};
MergeResult merge_metrics(const std::vector<std::filesystem::path>& pieces);
// The last step a metrics file logged (-1 if none).
int64_t last_step(const std::filesystem::path& metrics);
// Data rows of a metrics file (0 if it does not exist).
int64_t data_rows(const std::filesystem::path& metrics);
// The step a checkpoint tag names ("step_12" -> 12; -1 if none).
int64_t tag_step(const std::string& tag);

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace nxd::elastic
