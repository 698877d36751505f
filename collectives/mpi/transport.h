#pragma once
// MPI point-to-point as an algorithms::Transport (algorithms/transport.h): the MPI backend's ring
// and RDH are algorithms/ring_impl.h and rdh_impl.h run on it (mpi/p2p_algorithms.cpp). Internal
// to the backend: includes <mpi.h>.
#include <mpi.h>

#include <string>
#include <utility>
#include <vector>

#include "nxd/collectives/algorithms/transport.h"
#include "nxd/collectives/mpi/mpi.h"
#include "nxd/collectives/mpi/watchdog.h"

namespace nxd::mpi::detail {

// One MPI request, owned. Destroyed before completion (an exception unwinding an algorithm), a
// receive is cancelled and a send released to complete on its own (MPI_Request_free).
class MpiRequest {
 public:
  enum class Kind : uint8_t { send, recv };
  MpiRequest() = default;
  MpiRequest(MPI_Request q, Kind k) : q_(q), kind_(k) {}
  MpiRequest(MpiRequest&& o) noexcept : q_(std::exchange(o.q_, MPI_REQUEST_NULL)), kind_(o.kind_) {}
  MpiRequest& operator=(MpiRequest&& o) noexcept {
    if (this != &o) {
      release();
      q_ = std::exchange(o.q_, MPI_REQUEST_NULL);
      kind_ = o.kind_;
    }
    return *this;
  }
  ~MpiRequest() { release(); }
  MPI_Request* get() { return &q_; }

 private:
  void release();
  MPI_Request q_ = MPI_REQUEST_NULL;
  Kind kind_ = Kind::send;
};

// What a transport is made of: the ring's own duplicate of the group's communicator (so its
// messages never match a user's tags), this member's place, the backend's pipeline settings and
// persistent scratch, and the call's name for error messages.
struct MpiTransportOptions {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  algorithms::Pipeline pipeline;
  algorithms::Scratch* scratch = nullptr;
  std::string what;  // "all_reduce on group [0,1] rank 0"
  Waiting waiting;   // the collective, for the timeout's report (watchdog.h)
};

class MpiTransport {
 public:
  using Request = MpiRequest;
  explicit MpiTransport(MpiTransportOptions o) : o_(std::move(o)) {}
  int rank() const { return o_.rank; }
  int size() const { return o_.size; }
  algorithms::Pipeline pipeline() const { return o_.pipeline; }
  algorithms::Scratch& scratch() { return *o_.scratch; }
  MpiRequest isend(const algorithms::Buf& b, int peer, algorithms::Stream s);
  MpiRequest irecv(const algorithms::Buf& b, int peer, algorithms::Stream s);
  void wait(MpiRequest& q);
  void wait_all(std::vector<MpiRequest>& qs);

 private:
  int bytes(const algorithms::Buf& b) const;
  void check(int rc, const char* call) const;
  MpiTransportOptions o_;
};

// The MPI backend's point-to-point algorithms: `a` is Algorithm::ring or rdh as choose() returned
// it (rdh's reduce_scatter and all_gather need a power-of-two group: InvalidArgument otherwise).
void run_all_reduce(Algorithm a, MpiTransport& tr, const algorithms::Call& c);
void run_reduce_scatter(Algorithm a, MpiTransport& tr, const algorithms::Call& c);
void run_all_gather(Algorithm a, MpiTransport& tr, const algorithms::Call& c);

}  // namespace nxd::mpi::detail
