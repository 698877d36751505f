#pragma once
// What the point-to-point algorithms (ring.h, rdh.h) need from a transport, and what a call asks
// of them. Each algorithm is written once, as a template over a Transport (ring_impl.h,
// rdh_impl.h), and instantiated for two transports:
//
//   CommTransport (below)           any Communicator's isend/irecv. On the sim backend this runs
//                                   the MPI backend's exact code on rank threads: the tests cover
//                                   groups of 1-8 members (and run under TSan), and the sim clock
//                                   checks each algorithm's message pattern against its closed
//                                   form (tests/collectives/sim_model_test.cpp). The backends' own
//                                   collectives do not use it.
//   mpi::detail::MpiTransport       MPI_Isend/MPI_Irecv on a duplicate of a group's MPI
//     (mpi/transport.h)             communicator: the MPI backend's ring and RDH (mpi/mpi.h).
#include <concepts>
#include <cstdint>
#include <vector>

#include "nxd/collectives/communicator.h"

namespace nxd::algorithms {

// One collective call, the same on every member. send == recv is the in-place form (for
// reduce_scatter: recv at send + rank*count; for all_gather: send at recv + rank*count).
struct Call {
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;  // all_reduce: the array; reduce_scatter, all_gather: per member
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;  // ignored by all_gather
};

// How a pipelined algorithm cuts its messages: each step's chunk is sent in segments of
// segment_bytes (0: one message per chunk), with up to `depth` receives in flight.
struct Pipeline {
  int64_t segment_bytes = 0;
  int depth = 1;
};

// Buffers an algorithm reuses from call to call. A backend keeps one per communicator so that
// large calls do not map and fault in fresh pages every time (docs/design/collectives.md, "MPI
// backend").
struct Scratch {
  std::vector<char> segments;  // the ring's receive slots (depth x segment)
  std::vector<char> partials;  // reduce_scatter's partial chunks
  std::vector<char> widened;   // bf16 calls' f32 copy
  // `v` grown to at least `bytes` (zero-filled once); returns its data.
  static char* at_least(std::vector<char>& v, int64_t bytes) {
    if (v.size() < static_cast<size_t>(bytes)) v.resize(static_cast<size_t>(bytes));
    return v.data();
  }
};

// One message: `count` elements of `dtype` at `data` (only read when sent).
struct Buf {
  void* data = nullptr;
  int64_t count = 0;
  DType dtype = DType::f32;
};

// The two message streams of a call: messages of one stream between one pair arrive in posting
// order; the streams never match each other.
enum class Stream : uint8_t { reduce, gather };

// A transport: point-to-point messages between the members of one group (rank() of size()),
// non-blocking, each completed by wait / wait_all (which clears the vector). A Request owns its
// message: destroyed before completion (an exception unwinding an algorithm) it is cancelled or
// completed and freed. pipeline() and scratch() are the backend's settings and buffers.
template <class T>
concept Transport = requires(T& t, const T& ct, const Buf& b, int peer, Stream s,
                             typename T::Request& q, std::vector<typename T::Request>& qs) {
  { ct.rank() } -> std::same_as<int>;
  { ct.size() } -> std::same_as<int>;
  { ct.pipeline() } -> std::same_as<Pipeline>;
  { t.scratch() } -> std::same_as<Scratch&>;
  { t.isend(b, peer, s) } -> std::same_as<typename T::Request>;
  { t.irecv(b, peer, s) } -> std::same_as<typename T::Request>;
  t.wait(q);
  t.wait_all(qs);
};

// The options of the algorithms' Communicator forms (ring.h, rdh.h).
struct P2pOptions {
  Pipeline pipeline;  // default: one message per chunk, one receive in flight
  int tag = 0x7a11;   // the reduce stream's tag on the communicator; the gather stream's is tag+1
};

// A Communicator's isend/irecv as a Transport; the scratch lives as long as the transport.
class CommTransport {
 public:
  using Request = Work;
  CommTransport(Communicator& c, const P2pOptions& o) : c_(c), o_(o) {}
  int rank() const { return c_.rank(); }
  int size() const { return c_.size(); }
  Pipeline pipeline() const { return o_.pipeline; }
  Scratch& scratch() { return scratch_; }
  Work isend(const Buf& b, int peer, Stream s) {
    return c_.isend(b.data, b.count, b.dtype, peer, o_.tag + static_cast<int>(s));
  }
  Work irecv(const Buf& b, int peer, Stream s) {
    return c_.irecv(b.data, b.count, b.dtype, peer, o_.tag + static_cast<int>(s));
  }
  void wait(Work& w) { w.wait(); }
  void wait_all(std::vector<Work>& ws) {
    for (Work& w : ws) w.wait();
    ws.clear();
  }

 private:
  Communicator& c_;
  P2pOptions o_;
  Scratch scratch_;
};

// [begin, end) of chunk k when `count` elements are cut into p chunks (the first count % p
// chunks are one element longer).
std::pair<int64_t, int64_t> chunk_range(int64_t count, int p, int k);

}  // namespace nxd::algorithms
