#include "plan.h"

#include <fstream>
#include <map>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;

namespace nxd::elastic {

namespace {

void add_host(std::vector<Host>& hosts, const std::string& name, int slots) {
  for (auto& h : hosts)
    if (h.name == name) {
      h.slots += slots;
      return;
    }
  hosts.push_back({name, slots});
}

int parse_slots(const std::string& s, const std::string& entry) {
  size_t used = 0;
  int n = -1;
  try {
    n = std::stoi(s, &used);
  } catch (const std::exception&) {
  }
  if (used != s.size() || n < 1 || n > 65536)
    throw UsageError("host entry '" + entry + "': slots must be a number from 1 to 65536");
  return n;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// The step of a data row (its first field, when the header's first column is "step").
std::optional<int64_t> row_step(const std::string& row) {
  const std::string f = row.substr(0, row.find(','));
  try {
    size_t used = 0;
    const int64_t s = std::stoll(f, &used);
    if (used == f.size()) return s;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

struct Piece {
  std::string header;
  std::vector<std::string> rows;
};

Piece read_piece(const fs::path& p) {
  Piece piece;
  auto lines = split_lines(slurp(p));
  if (lines.empty()) return piece;
  piece.header = lines[0];
  for (size_t i = 1; i < lines.size(); ++i)
    if (!lines[i].empty()) piece.rows.push_back(lines[i]);
  return piece;
}

}  // namespace

std::vector<Host> parse_hosts(const std::string& spec) {
  std::vector<Host> hosts;
  std::istringstream in(spec);
  for (std::string entry; std::getline(in, entry, ',');) {
    if (entry.empty()) throw UsageError("--hosts '" + spec + "' has an empty entry");
    const auto colon = entry.rfind(':');
    const std::string name = entry.substr(0, colon);
    if (name.empty()) throw UsageError("host entry '" + entry + "' has no name");
    add_host(hosts, name,
             colon == std::string::npos ? 1 : parse_slots(entry.substr(colon + 1), entry));
  }
  if (hosts.empty()) throw UsageError("--hosts names no host");
  return hosts;
}

std::vector<Host> read_hostfile(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    throw UsageError("--hostfile " + file.string() + " is not a readable file");
  std::vector<Host> hosts;
  for (std::string line : split_lines(slurp(file))) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string name, w;
    if (!(words >> name)) continue;
    int slots = 1;
    while (words >> w)
      if (w.rfind("slots=", 0) == 0) slots = parse_slots(w.substr(6), line);
    add_host(hosts, name, slots);
  }
  if (hosts.empty()) throw UsageError("--hostfile " + file.string() + " names no host");
  return hosts;
}

int total_slots(const std::vector<Host>& hosts) {
  int n = 0;
  for (const auto& h : hosts) n += h.slots;
  return n;
}

std::string host_arg(const std::vector<Host>& hosts) {
  std::string s;
  for (const auto& h : hosts)
    if (h.slots > 0) s += (s.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
  return s;
}

std::string describe(const Layout& l) {
  std::ostringstream s;
  s << "TP" << l.tp << " x PP" << l.pp << " x DP" << l.dp << " (world " << l.world()
    << ", micro batch " << l.micro_batch << " x " << l.accumulation << " accumulation steps)";
  return s.str();
}

std::optional<Layout> choose_layout(const LayoutRequest& req, int slots,
                                    const std::function<bool(const Layout&)>& fits) {
  const int64_t m = req.tp * req.pp;
  for (int64_t dp = slots / m; dp >= 1; --dp) {
    const int64_t mb = req.micro_batch ? *req.micro_batch : req.global_batch / dp;
    if (mb < 1 || req.global_batch % (mb * dp) != 0) continue;
    const Layout l{.tp = req.tp,
                   .pp = req.pp,
                   .dp = dp,
                   .micro_batch = mb,
                   .accumulation = req.global_batch / (mb * dp)};
    if (!fits || fits(l)) return l;
  }
  return std::nullopt;
}

FailureReport parse_failure(const std::string& err) {
  FailureReport r;
  static const std::regex abort_re(R"(MPI_ABORT was invoked on rank (\d+))");
  static const std::regex signal_re(
      R"(process rank (\d+) with PID \d+ on node (\S+) exited on signal)");
  static const std::regex name_re(R"(Process name: \[\[\d+,\d+\],(\d+)\])");
  static const std::regex node_re(R"(Node:\s+(\S+))");
  // the MPI backend's collective timeout (mpi/watchdog.h) names the ranks that never arrived;
  // the rank that printed it and called MPI_Abort is healthy
  static const std::regex hung_re(
      R"(collective timeout: rank \d+ .* rank\(s\) ([0-9,]+) never arrived)");
  std::set<int> hung;
  for (const std::string& line : split_lines(err)) {
    std::smatch m;
    if (std::regex_search(line, m, hung_re)) {
      std::stringstream ranks(m[1]);
      for (std::string r; std::getline(ranks, r, ',');) hung.insert(std::stoi(r));
    } else if (std::regex_search(line, m, abort_re) || std::regex_search(line, m, name_re)) {
      r.ranks.insert(std::stoi(m[1]));
    } else if (std::regex_search(line, m, signal_re)) {
      r.ranks.insert(std::stoi(m[1]));
      r.nodes.insert(m[2]);
    } else if (std::regex_search(line, m, node_re) && !r.ranks.empty()) {
      r.nodes.insert(m[1]);
    }
  }
  if (!hung.empty()) r = {.ranks = hung, .nodes = {}};
  return r;
}

std::optional<std::string> host_of_rank(const std::vector<Host>& hosts, int rank) {
  int first = 0;
  for (const auto& h : hosts) {
    if (rank >= first && rank < first + h.slots) return h.name;
    first += h.slots;
  }
  return std::nullopt;
}

MergeResult merge_metrics(const std::vector<fs::path>& paths) {
  MergeResult res;
  std::vector<Piece> pieces;
  for (const auto& p : paths) {
    Piece piece = read_piece(p);
    if (piece.rows.empty()) continue;  // a launch that died before its first step
    if (!pieces.empty() && piece.header != pieces[0].header) {
      res.why = p.string() + "'s header differs from " + paths[0].string() + "'s";
      return res;
    }
    if (piece.header.rfind("step,", 0) != 0) {
      res.why = p.string() + " does not start with a step column";
      return res;
    }
    pieces.push_back(std::move(piece));
  }
  if (pieces.empty()) {
    res.why = "no metrics row";
    return res;
  }
  res.text = pieces[0].header + "\n";
  for (size_t i = 0; i < pieces.size(); ++i) {
    std::optional<int64_t> next_first;
    if (i + 1 < pieces.size()) next_first = row_step(pieces[i + 1].rows[0]);
    for (const auto& row : pieces[i].rows) {
      const auto s = row_step(row);
      if (next_first && s && *s >= *next_first) continue;  // trained again by a later launch
      res.text += row + "\n";
      ++res.rows;
    }
  }
  res.ok = true;
  return res;
}

int64_t last_step(const fs::path& metrics) {
  int64_t last = -1;
  for (const auto& row : read_piece(metrics).rows)
    if (auto s = row_step(row)) last = std::max(last, *s);
  return last;
}

int64_t data_rows(const fs::path& metrics) {
  return static_cast<int64_t>(read_piece(metrics).rows.size());
}

int64_t tag_step(const std::string& tag) {
  static const std::regex re(R"((\d+)$)");
  std::smatch m;
  return std::regex_search(tag, m, re) ? std::stoll(m[1]) : -1;
}

}  // namespace nxd::elastic
