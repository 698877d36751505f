#pragma once
// Alpha-beta cost of collectives on a simulated Neuron machine.
//
// Inside an instance the model follows the Neuron runtime's algorithm choice by size
// (intranode-collective-comm docs): Mesh below 1 MiB, recursive halving-doubling (RDH, power-of-2
// groups) up to 56 MiB, KangaRing above (groups made of whole chips), Ring otherwise. Across
// instances it is the hierarchical algorithm (internode docs): intra reduce-scatter, inter-node
// all-reduce of 1/Y of the buffer over EFA, intra all-gather. Every time includes the machine's
// collective launch latency. Mesh moves data in one step but over multi-hop routes, so its
// bandwidth term is divided by the group's mean chip-to-chip hop count. Bandwidth is per rank:
// the calibrated achievable busbw, capped by the chip's NeuronLink share. The calibrated busbw is
// a ring's (2 ranks); nxd takes it to be bound by the ring's HBM traffic, so KangaRing, which the
// runtime docs say touches HBM 3 times per byte instead of 4 in an all-gather and 4 instead of 6
// in a reduce-scatter (one read, two writes to the chip's two cores), runs 4/3 and 3/2 as fast,
// up to what the chip's NeuronLinks carry into it (its primary receives for both cores; a
// Trainium2 chip of 4 logical cores has two primaries sharing them). Notation:
// p ranks, n bytes of the full array (the all-gather output, the reduce-scatter input), alpha
// seconds per step, bw per-rank bus bandwidth in bytes/s.
#include <vector>

#include "nxd/runtime/sim/machine.h"

namespace nxd::sim {

enum class CollKind {
  all_reduce,
  all_gather,
  reduce_scatter,
  broadcast,
  reduce,
  all_to_all,
  send_recv,
  barrier
};
const char* coll_kind_name(CollKind k);

enum class Algorithm { automatic, ring, rdh, mesh, kangaring, hierarchical, tree, direct };
const char* algorithm_name(Algorithm a);
Algorithm algorithm_from_name(const std::string& s);  // throws ConfigError

// The links a group of (global) ranks uses.
struct GroupLinks {
  int p = 1;                 // ranks
  int instances = 1;         // X: instances the group spans
  int per_instance = 1;      // Y: most ranks of the group on one instance
  bool whole_chips = false;  // every chip touched has all its cores in the group
  double alpha = 0;          // s per intra-instance step (hop latency x farthest ring neighbour)
  double bw = 0;             // per-rank intra-instance bandwidth, bytes/s
  double mesh_hops = 1;      // mean NeuronLink hops between members on different chips: Mesh
                             // traffic is routed over that many links (over-subscription)
  double kanga_ag_bw = 0;    // per-rank KangaRing bandwidth of an all-gather, bytes/s: bw_ring
                             // x 4/3 (3 HBM touches instead of 4), capped by the chip's links
  double kanga_rs_bw = 0;    // the same for a reduce-scatter: x 3/2 (4 touches instead of 6)
  double inter_alpha = 0;    // s per EFA step
  double inter_bw = 0;       // per-rank EFA share, bytes/s
  double launch = 0;
};
GroupLinks group_links(const MachineSpec& m, const std::vector<int>& ranks);

struct CollCost {
  double seconds = 0;
  Algorithm algorithm = Algorithm::ring;
};
// Modeled time of one collective of `bytes` (see the notation above) on `ranks`. `force` picks
// the intra-instance algorithm (falling back to ring where it does not apply).
CollCost collective_cost(const MachineSpec& m, CollKind kind, const std::vector<int>& ranks,
                         double bytes, Algorithm force = Algorithm::automatic);
// The same with the group's links computed once by the caller (group_links(m, ranks)): a
// communicator charges every call without recomputing its O(p^2) hop table.
CollCost collective_cost(const MachineSpec& m, CollKind kind, const std::vector<int>& ranks,
                         const GroupLinks& links, double bytes,
                         Algorithm force = Algorithm::automatic);

// Closed forms (Thakur, Rabenseifner, Gropp, IJHPCA 2005; docs/HARDWARE.md#collectives).
// The ring and RDH forms are what collectives/algorithms/ring.h and rdh.h take on the sim
// backend when every step costs alpha + bytes/bw (tests/collectives/sim_model_test.cpp).
double ring_all_reduce_time(int p, double n, double alpha, double bw);  // 2(p-1)a + 2(p-1)/p n/B
double ring_all_gather_time(int p, double n, double alpha, double bw);  // (p-1)a + (p-1)/p n/B
double ring_reduce_scatter_time(int p, double n, double alpha, double bw);  // (p-1)a + (p-1)/p n/B
double rdh_all_reduce_time(int p, double n, double alpha, double bw);   // 2 lg p a + 2(p-1)/p n/B
double rdh_all_gather_time(int p, double n, double alpha, double bw);   // lg p a + (p-1)/p n/B
double mesh_all_reduce_time(int p, double n, double alpha, double bw);  // 2a + 2(p-1)/p n/B
double mesh_all_gather_time(int p, double n, double alpha, double bw);  // a + (p-1)/p n/B

// nccl-tests bus-bandwidth factor (PERFORMANCE.md): all-reduce 2(p-1)/p, all-gather,
// reduce-scatter and all-to-all (p-1)/p, others 1.
double busbw_factor(CollKind k, int p);
// All-to-all of n bytes per rank (n/p to each member) as a pairwise exchange over the machine's
// topology: p-1 rounds, in round i member k sends to member (k+i) % p, and a round lasts its
// slowest pair: hop latency + n/p at the core's collective bandwidth on one chip; hop latency x
// hops + n/p at the chip-link share / hops between chips of an instance; EFA latency + n/p at the
// core's EFA share between instances. collective_cost uses it up to 64 ranks (beyond: the
// group-bottleneck form (p-1)/p n/B, to keep the O(p^2) pair scan out of large plans).
double pairwise_all_to_all_time(const MachineSpec& m, const std::vector<int>& ranks, double n);

}  // namespace nxd::sim
