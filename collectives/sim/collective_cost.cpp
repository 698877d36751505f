#include "nxd/collectives/sim/collective_cost.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "nxd/runtime/error.h"

namespace nxd::sim {
namespace {
bool pow2(int p) {
  return p > 0 && (p & (p - 1)) == 0;
}
double lg(int p) {
  return std::ceil(std::log2(std::max(1, p)));
}
constexpr double kMeshMax = 1 << 20;  // Mesh below ~1 MB (size-to-algorithm figure)
constexpr double kRdhMax = 56 << 20;  // RDH 1-56 MB, KangaRing above
// KangaRing's HBM touches per byte against a ring's (intranode-collective-comm docs): all-gather
// 3 instead of 4, reduce-scatter 4 instead of 6.
constexpr double kKangaAgSpeedup = 4.0 / 3.0;
constexpr double kKangaRsSpeedup = 6.0 / 4.0;
}  // namespace

const char* coll_kind_name(CollKind k) {
  switch (k) {
    case CollKind::all_reduce:
      return "all_reduce";
    case CollKind::all_gather:
      return "all_gather";
    case CollKind::reduce_scatter:
      return "reduce_scatter";
    case CollKind::broadcast:
      return "broadcast";
    case CollKind::reduce:
      return "reduce";
    case CollKind::all_to_all:
      return "all_to_all";
    case CollKind::send_recv:
      return "send_recv";
    case CollKind::barrier:
      return "barrier";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::automatic:
      return "auto";
    case Algorithm::ring:
      return "ring";
    case Algorithm::rdh:
      return "rdh";
    case Algorithm::mesh:
      return "mesh";
    case Algorithm::kangaring:
      return "kangaring";
    case Algorithm::hierarchical:
      return "hier";
    case Algorithm::tree:
      return "tree";
    case Algorithm::direct:
      return "direct";
  }
  return "?";
}

Algorithm algorithm_from_name(const std::string& s) {
  for (Algorithm a :
       {Algorithm::automatic, Algorithm::ring, Algorithm::rdh, Algorithm::mesh,
        Algorithm::kangaring, Algorithm::hierarchical, Algorithm::tree, Algorithm::direct})
    if (s == algorithm_name(a)) return a;
  throw ConfigError(
      str("[sim] unknown collective algorithm '", s, "' (auto, ring, rdh, mesh, kangaring)"));
}

double ring_all_reduce_time(int p, double n, double a, double bw) {
  return 2.0 * (p - 1) * a + 2.0 * (p - 1) / p * n / bw;
}
double ring_all_gather_time(int p, double n, double a, double bw) {
  return (p - 1) * a + double(p - 1) / p * n / bw;
}
double ring_reduce_scatter_time(int p, double n, double a, double bw) {
  return ring_all_gather_time(p, n, a, bw);
}
double rdh_all_reduce_time(int p, double n, double a, double bw) {
  return 2.0 * lg(p) * a + 2.0 * (p - 1) / p * n / bw;
}
double rdh_all_gather_time(int p, double n, double a, double bw) {
  return lg(p) * a + double(p - 1) / p * n / bw;
}
double mesh_all_reduce_time(int p, double n, double a, double bw) {
  return 2.0 * a + 2.0 * (p - 1) / p * n / bw;
}
double mesh_all_gather_time(int p, double n, double a, double bw) {
  return a + double(p - 1) / p * n / bw;
}

double busbw_factor(CollKind k, int p) {
  switch (k) {
    case CollKind::all_reduce:
      return p > 1 ? 2.0 * (p - 1) / p : 1.0;
    case CollKind::all_gather:
    case CollKind::reduce_scatter:
    case CollKind::all_to_all:
      return p > 1 ? double(p - 1) / p : 1.0;
    default:
      return 1.0;
  }
}

GroupLinks group_links(const MachineSpec& m, const std::vector<int>& ranks) {
  GroupLinks g;
  g.p = static_cast<int>(ranks.size());
  g.launch = m.launch_latency;
  std::map<int, int> per_inst, per_chip;
  for (int r : ranks) {
    NXD_CHECK(r >= 0 && r < m.world_size(), "[sim] rank ", r, " outside machine ", m.name, " with ",
              m.world_size(), " cores");
    per_inst[m.instance_of(r)]++;
    per_chip[m.chip_of(r)]++;
  }
  g.instances = static_cast<int>(per_inst.size());
  for (auto& [i, c] : per_inst) g.per_instance = std::max(g.per_instance, c);
  g.whole_chips = std::all_of(per_chip.begin(), per_chip.end(),
                              [&](auto& kv) { return kv.second == m.cores_per_chip; });
  // Farthest ring neighbour inside an instance (ranks in group order).
  int hops = 1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    int a = ranks[i], b = ranks[(i + 1) % ranks.size()];
    if (m.instance_of(a) == m.instance_of(b)) hops = std::max(hops, m.chip_hops(a, b));
  }
  g.alpha = m.hop_latency * hops;
  double hop_sum = 0;
  int pairs = 0;
  for (size_t i = 0; i < ranks.size(); ++i)
    for (size_t j = i + 1; j < ranks.size(); ++j)
      if (m.instance_of(ranks[i]) == m.instance_of(ranks[j]) &&
          m.chip_of(ranks[i]) != m.chip_of(ranks[j])) {
        hop_sum += m.chip_hops(ranks[i], ranks[j]);
        ++pairs;
      }
  g.mesh_hops = pairs > 0 ? std::max(1.0, hop_sum / pairs) : 1.0;
  bool one_chip = per_chip.size() == 1;
  // The links a group's traffic can use are those between its own chips (the other links carry
  // the other groups' collectives): the fewest any member chip has to other member chips of its
  // instance (a torus row: 2 of 4; two rows: 3; the whole instance: 4), each shared by the
  // group's cores on that chip.
  int cores_on_chip = 1;
  for (auto& [c, n] : per_chip) cores_on_chip = std::max(cores_on_chip, n);
  int in_links = m.links_per_chip;
  if (!one_chip && m.links_per_chip > 0) {
    std::map<int, int> first_rank;  // global chip -> a member rank on it
    for (int r : ranks) first_rank.emplace(m.chip_of(r), r);
    for (auto& [ca, ra] : first_rank) {
      int links = 0;
      for (auto& [cb, rb] : first_rank)
        if (ca != cb && m.instance_of(ra) == m.instance_of(rb) && m.chip_hops(ra, rb) == 1) ++links;
      in_links = std::min(in_links, links);
    }
    // no two member chips adjacent (a strided group): its traffic is routed over the chips'
    // links as a whole
    if (in_links == 0) in_links = m.links_per_chip;
  }
  double link_share =
      m.links_per_chip > 0 ? m.link_bandwidth * in_links / 2.0 / cores_on_chip : m.collective_busbw;
  g.bw = one_chip ? m.collective_busbw : std::min(m.collective_busbw, link_share);
  // KangaRing: a ring of the chips' primaries; a chip receives once for its two cores over the
  // group's links (the torus's two Hamiltonian cycles, both directions, for a whole instance),
  // so its cap is those links' share of the chip, not the per-core one; a chip of more than
  // two cores (Trn2: 4 at LNC=2) has one primary per pair, each receiving for its pair
  const double primaries = std::max(1, cores_on_chip / 2);
  const double chip_in = m.links_per_chip > 0 ? m.link_bandwidth * in_links / 2.0 / primaries
                                              : m.collective_busbw * kKangaRsSpeedup;
  g.kanga_ag_bw = std::min(m.collective_busbw * kKangaAgSpeedup, chip_in);
  g.kanga_rs_bw = std::min(m.collective_busbw * kKangaRsSpeedup, chip_in);
  if (!m.kangaring) g.kanga_ag_bw = g.kanga_rs_bw = 0;  // not this machine's algorithm
  g.inter_alpha = m.efa_latency;
  g.inter_bw = m.efa_bandwidth / m.cores_per_instance();
  return g;
}

double pairwise_all_to_all_time(const MachineSpec& m, const std::vector<int>& ranks, double n) {
  const int p = static_cast<int>(ranks.size());
  if (p <= 1) return 0;
  const double chunk = n / p;
  const double link_share = m.links_per_chip > 0
                                ? m.link_bandwidth * m.links_per_chip / 2.0 / m.cores_per_chip
                                : m.collective_busbw;
  const double chip_bw = std::min(m.collective_busbw, link_share);
  const double efa_bw = m.efa_bandwidth / m.cores_per_instance();
  auto pair = [&](int a, int b) {
    if (m.instance_of(a) != m.instance_of(b)) return m.efa_latency + chunk / efa_bw;
    if (m.chip_of(a) == m.chip_of(b)) return m.hop_latency + chunk / m.collective_busbw;
    const int hops = std::max(1, m.chip_hops(a, b));
    return m.hop_latency * hops + chunk / (chip_bw / hops);
  };
  double t = 0;
  for (int i = 1; i < p; ++i) {  // round i: member k sends its chunk to member (k + i) % p
    double round = 0;
    for (int k = 0; k < p; ++k) round = std::max(round, pair(ranks[k], ranks[(k + i) % p]));
    t += round;
  }
  return t;
}

namespace {

// Intra-instance time of `kind` over p ranks with links g.
CollCost intra(CollKind kind, int p, double n, const GroupLinks& g, Algorithm force) {
  CollCost c;
  if (p <= 1) return c;
  Algorithm a = force;
  if (a == Algorithm::automatic) {
    if (n < kMeshMax)
      a = Algorithm::mesh;
    else if (n <= kRdhMax)
      a = Algorithm::rdh;
    else
      a = Algorithm::kangaring;
  }
  if (a == Algorithm::rdh && !pow2(p)) a = Algorithm::ring;
  if (a == Algorithm::kangaring && (!g.whole_chips || p < 4 || g.kanga_ag_bw <= 0))
    a = Algorithm::ring;
  if (a != Algorithm::mesh && a != Algorithm::rdh && a != Algorithm::kangaring) a = Algorithm::ring;
  c.algorithm = a;
  double al = g.alpha, bw = g.bw;
  bool ar = kind == CollKind::all_reduce;
  switch (a) {
    case Algorithm::mesh:  // one step, but the traffic crosses mesh_hops links on average
      c.seconds = ar ? mesh_all_reduce_time(p, n, al, bw / g.mesh_hops)
                     : mesh_all_gather_time(p, n, al, bw / g.mesh_hops);
      break;
    case Algorithm::rdh:
      c.seconds = ar ? rdh_all_reduce_time(p, n, al, bw) : rdh_all_gather_time(p, n, al, bw);
      break;
    case Algorithm::kangaring: {  // ring over chip primaries: p/2 steps per phase
      const double moved = double(p - 1) / p * n;
      const bool rs = ar || kind == CollKind::reduce_scatter, ag = kind != CollKind::reduce_scatter;
      c.seconds = (ar ? 2.0 : 1.0) * (p / 2) * al + (rs ? moved / g.kanga_rs_bw : 0) +
                  (ag ? moved / g.kanga_ag_bw : 0);
      break;
    }
    default:
      c.seconds = ar ? ring_all_reduce_time(p, n, al, bw) : ring_all_gather_time(p, n, al, bw);
  }
  return c;
}

}  // namespace

CollCost collective_cost(const MachineSpec& m, CollKind kind, const std::vector<int>& ranks,
                         double n, Algorithm force) {
  return collective_cost(m, kind, ranks, group_links(m, ranks), n, force);
}

CollCost collective_cost(const MachineSpec& m, CollKind kind, const std::vector<int>& ranks,
                         const GroupLinks& g, double n, Algorithm force) {
  int p = g.p;
  CollCost c;
  if (p <= 1 && kind != CollKind::send_recv) return c;
  bool multi = g.instances > 1;
  double bw = multi ? std::min(g.bw, g.inter_bw) : g.bw;
  double al = multi ? g.inter_alpha : g.alpha;
  switch (kind) {
    case CollKind::all_reduce:
    case CollKind::all_gather:
    case CollKind::reduce_scatter:
      if (!multi) {
        c = intra(kind, p, n, g, force);
      } else {
        // Hierarchical: X instances x Y ranks. Each stage is an algorithm of its own (internode
        // docs) and pays its own launch: the call's launch below, and one more per extra stage.
        int X = g.instances, Y = g.per_instance;
        double t_rs = Y > 1 ? intra(CollKind::reduce_scatter, Y, n, g, force).seconds : 0;
        double t_ag = Y > 1 ? intra(CollKind::all_gather, Y, n, g, force).seconds : 0;
        double sub = n / Y;
        if (kind == CollKind::all_reduce)
          c.seconds = t_rs + ring_all_reduce_time(X, sub, g.inter_alpha, g.inter_bw) + t_ag;
        else if (kind == CollKind::all_gather)
          c.seconds = ring_all_gather_time(X, sub, g.inter_alpha, g.inter_bw) + t_ag;
        else
          c.seconds = t_rs + ring_reduce_scatter_time(X, sub, g.inter_alpha, g.inter_bw);
        const int stages = Y > 1 ? (kind == CollKind::all_reduce ? 3 : 2) : 1;
        c.seconds += (stages - 1) * g.launch;
        c.algorithm = Algorithm::hierarchical;
      }
      break;
    case CollKind::broadcast:
    case CollKind::reduce: {
      double tree = lg(p) * (al + n / bw), chain = (p - 1) * al + n / bw;
      c.seconds = std::min(tree, chain);
      c.algorithm = tree < chain ? Algorithm::tree : Algorithm::ring;
      break;
    }
    case CollKind::all_to_all:  // pairwise exchange over the topology (up to 64 ranks)
      c.seconds = p <= 64 ? pairwise_all_to_all_time(m, ranks, n) : al + double(p - 1) / p * n / bw;
      c.algorithm = Algorithm::direct;
      break;
    case CollKind::send_recv: {
      int a = ranks.front(), b = ranks.back();
      bool same_inst = m.instance_of(a) == m.instance_of(b);
      double lat = same_inst ? m.hop_latency * std::max(1, m.chip_hops(a, b)) : m.efa_latency;
      c.seconds = lat + n / (same_inst ? g.bw : g.inter_bw);
      c.algorithm = Algorithm::direct;
      return c;  // no collective launch for point to point
    }
    case CollKind::barrier:
      c.seconds = lg(p) * al;
      c.algorithm = Algorithm::rdh;
      break;
  }
  c.seconds += g.launch;
  return c;
}

}  // namespace nxd::sim
