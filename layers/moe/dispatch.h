#pragma once
// Expert-parallel token exchange: a differentiable variable-size all-to-all of rows.
#include <cstdint>
#include <vector>

#include "nxd/collectives/communicator.h"
#include "nxd/runtime/tensor.h"

namespace nxd {

// Counts of one all-to-all: member p receives send[p] rows from this member and this member
// receives recv[p] rows from member p.
struct RowCounts {
  std::vector<int64_t> send, recv;
  // The largest count any member sends to any member in this exchange (every block is padded to
  // it), when the caller knows it, the same on every member (e.g. from gather_counts); -1: the
  // exchange agrees on it with an all-reduce MAX first.
  int64_t cap = -1;
};

// Raw all-gather of every member's n i64 counts: out[p*n + i] = in_p[i] (one collective: every
// member then knows every pair's counts, so no exchange needs its own agreement).
std::vector<int64_t> gather_counts(Communicator& g, const std::vector<int64_t>& in);

// x [sum(send), D] (rows for member 0 first, then member 1, ...) -> [sum(recv), D] (rows from
// member 0 first, ...). Implemented as one all-to-all padded to the largest count of the group
// (counts.cap, or agreed by an all-reduce MAX), so it runs on every backend. Backward exchanges the
// gradient the other way (send and recv swapped). The group must outlive the graph.
Tensor all_to_all_rows(const Tensor& x, const RowCounts& counts, Communicator& g);

// Modeled seconds this rank spent in all_to_all_rows' exchanges (forward and backward, the count
// agreement included) and in gather_counts since the rank started: the sim clock's advance over
// them; 0 off the sim.
double moe_all_to_all_seconds();

}  // namespace nxd
