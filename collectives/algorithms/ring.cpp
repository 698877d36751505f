// The ring algorithms on a Communicator's point-to-point messages (ring.h): ring_impl.h's
// templates instantiated for CommTransport; the argument checks the algorithms' Communicator
// forms share (check.h).
#include "nxd/collectives/algorithms/ring.h"

#include "nxd/collectives/algorithms/check.h"
#include "nxd/collectives/algorithms/ring_impl.h"

namespace nxd::algorithms {

using detail::check_call;
using detail::check_reduction;

std::pair<int64_t, int64_t> chunk_range(int64_t count, int p, int k) {
  const int64_t base = count / p, extra = count % p;
  const int64_t begin = k * base + std::min<int64_t>(k, extra);
  return {begin, begin + base + (k < extra ? 1 : 0)};
}

void ring_all_reduce(Communicator& c, const Call& call, const P2pOptions& o) {
  CommTransport tr(c, o);
  check_reduction("ring_all_reduce", c, call);
  detail::ring_all_reduce(tr, call);
}
void ring_reduce_scatter(Communicator& c, const Call& call, const P2pOptions& o) {
  CommTransport tr(c, o);
  check_reduction("ring_reduce_scatter", c, call);
  detail::ring_reduce_scatter(tr, call);
}
void ring_all_gather(Communicator& c, const Call& call, const P2pOptions& o) {
  CommTransport tr(c, o);
  check_call("ring_all_gather", c, call);
  detail::ring_all_gather(tr, call);
}

}  // namespace nxd::algorithms
