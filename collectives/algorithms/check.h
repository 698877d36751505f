#pragma once
// Argument checks of the algorithms' Communicator forms (ring.h, rdh.h): what the backends'
// check_count and check_reduction check, naming the algorithm. Internal to algorithms/.
#include "nxd/collectives/algorithms/rdh_impl.h"  // pow2
#include "nxd/collectives/algorithms/transport.h"

namespace nxd::algorithms::detail {

inline void check_call(const char* name, const Communicator& c, const Call& call) {
  NXD_CHECK(call.count >= 0, "[", name, "] negative count ", call.count, " on group ",
            c.group_str());
  NXD_CHECK(call.count == 0 || (call.send && call.recv), "[", name,
            "] needs send and recv buffers (count ", call.count, ", group ", c.group_str(), ")");
}
inline void check_reduction(const char* name, const Communicator& c, const Call& call) {
  check_call(name, c, call);
  NXD_CHECK(call.op != ReduceOp::avg || is_floating(call.dtype), "[", name,
            "] avg needs a floating dtype, got ", call.dtype, " on group ", c.group_str());
}
inline void check_pow2(const char* name, const Communicator& c) {
  NXD_CHECK(detail::pow2(c.size()), "[", name, "] needs a power-of-two group, got size ", c.size(),
            " on group ", c.group_str());
}

}  // namespace nxd::algorithms::detail
