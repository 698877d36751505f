// Recursive halving-doubling on a Communicator's point-to-point messages (rdh.h): rdh_impl.h's
// templates instantiated for CommTransport.
#include "nxd/collectives/algorithms/rdh.h"

#include "nxd/collectives/algorithms/check.h"
#include "nxd/collectives/algorithms/rdh_impl.h"

namespace nxd::algorithms {

using detail::check_call;
using detail::check_pow2;
using detail::check_reduction;

void rdh_all_reduce(Communicator& c, const Call& call, const P2pOptions& o) {
  CommTransport tr(c, o);
  check_reduction("rdh_all_reduce", c, call);
  detail::rdh_all_reduce(tr, call);
}
void rdh_reduce_scatter(Communicator& c, const Call& call, const P2pOptions& o) {
  CommTransport tr(c, o);
  check_reduction("rdh_reduce_scatter", c, call);
  check_pow2("rdh_reduce_scatter", c);
  detail::rdh_reduce_scatter(tr, call);
}
void rdh_all_gather(Communicator& c, const Call& call, const P2pOptions& o) {
  CommTransport tr(c, o);
  check_call("rdh_all_gather", c, call);
  check_pow2("rdh_all_gather", c);
  detail::rdh_all_gather(tr, call);
}

}  // namespace nxd::algorithms
