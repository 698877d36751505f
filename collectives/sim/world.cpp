#include "nxd/collectives/sim/world.h"

namespace nxd::sim::detail {

std::string missing_str(const World& w, const Group& g, uint64_t round) {
  std::string s;
  for (size_t i = 0; i < g.members.size(); ++i) {
    if (g.arrived_round[i].load() > round) continue;
    int r = g.members[i];
    s += str("\n  rank ", r, ": ");
    switch (w.ranks[r].s) {
      case RankState::running:
        s += "still running (never arrived)";
        break;
      case RankState::blocked:
        s += w.ranks[r].what;
        break;
      case RankState::done:
        s += "returned from its function";
        break;
    }
  }
  return s;
}

}  // namespace nxd::sim::detail
