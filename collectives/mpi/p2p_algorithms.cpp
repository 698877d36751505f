// The MPI backend's ring and RDH: algorithms/ring_impl.h and rdh_impl.h on MPI point-to-point
// (mpi/transport.h).
#include <climits>
#include <string>

#include "nxd/collectives/algorithms/rdh_impl.h"
#include "nxd/collectives/algorithms/ring_impl.h"
#include "nxd/collectives/mpi/transport.h"

namespace nxd::mpi::detail {

void MpiRequest::release() {
  if (q_ == MPI_REQUEST_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (kind_ == Kind::recv) {
    MPI_Cancel(&q_);
    MPI_Wait(&q_, MPI_STATUS_IGNORE);
  } else {
    MPI_Request_free(&q_);
  }
  q_ = MPI_REQUEST_NULL;
}

int MpiTransport::bytes(const algorithms::Buf& b) const {
  const int64_t n = b.count * dtype_size(b.dtype);
  NXD_CHECK(n <= INT_MAX, "[mpi] a message of ", n, " bytes (", b.dtype, " count ", b.count,
            ") exceeds MPI's int range on ", o_.what);
  return static_cast<int>(n);
}

void MpiTransport::check(int rc, const char* call) const {
  if (rc == MPI_SUCCESS) return;
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, s, &len);
  throw CommError(str("[mpi] ", call, " failed in ", o_.what, ": ", std::string(s, len)));
}

MpiRequest MpiTransport::isend(const algorithms::Buf& b, int peer, algorithms::Stream s) {
  MPI_Request q;
  check(MPI_Isend(b.data, bytes(b), MPI_BYTE, peer, static_cast<int>(s), o_.comm, &q), "MPI_Isend");
  return {q, MpiRequest::Kind::send};
}

MpiRequest MpiTransport::irecv(const algorithms::Buf& b, int peer, algorithms::Stream s) {
  MPI_Request q;
  check(MPI_Irecv(b.data, bytes(b), MPI_BYTE, peer, static_cast<int>(s), o_.comm, &q), "MPI_Irecv");
  return {q, MpiRequest::Kind::recv};
}

void MpiTransport::wait(MpiRequest& q) {
  check(detail::wait_all(1, q.get(), o_.waiting), "MPI_Wait");
}

void MpiTransport::wait_all(std::vector<MpiRequest>& qs) {
  for (MpiRequest& q : qs) wait(q);
  qs.clear();
}

void run_all_reduce(Algorithm a, MpiTransport& tr, const algorithms::Call& c) {
  if (a == Algorithm::rdh)
    algorithms::detail::rdh_all_reduce(tr, c);
  else
    algorithms::detail::ring_all_reduce(tr, c);
}

void run_reduce_scatter(Algorithm a, MpiTransport& tr, const algorithms::Call& c) {
  if (a == Algorithm::rdh)
    algorithms::detail::rdh_reduce_scatter(tr, c);
  else
    algorithms::detail::ring_reduce_scatter(tr, c);
}

void run_all_gather(Algorithm a, MpiTransport& tr, const algorithms::Call& c) {
  if (a == Algorithm::rdh)
    algorithms::detail::rdh_all_gather(tr, c);
  else
    algorithms::detail::ring_all_gather(tr, c);
}

}  // namespace nxd::mpi::detail
