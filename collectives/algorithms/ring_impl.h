#pragma once
// The ring algorithms, written once against a Transport (transport.h): ring.cpp instantiates them
// for a Communicator (CommTransport), mpi/p2p_algorithms.cpp for MPI point-to-point (the MPI
// backend's ring). ring.h describes the algorithms; this is how they run.
//
// Pipelining: each step's chunk is cut into segments of Pipeline::segment_bytes (one segment when
// 0); up to Pipeline::depth receives are in flight into the transport's persistent scratch slots;
// each segment is reduced as soon as it arrives (received partial first, then this member's
// values) and sent on to the next member at once, so the steps overlap. The last reduce-scatter
// step of an all-reduce sends each finished segment as the first all-gather message.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "nxd/collectives/algorithms/transport.h"

namespace nxd::algorithms::detail {

inline int mod(int a, int p) {
  return ((a % p) + p) % p;
}

// Chunk k's elements [first, first + second): `count` cut into p uneven chunks (chunk_range), or
// `per` elements each when per >= 0 (reduce_scatter, all_gather).
struct Chunks {
  int64_t count = 0, per = -1;
  int p = 1;
  std::pair<int64_t, int64_t> operator()(int k) const {
    if (per >= 0) return {k * per, per};
    auto [b, e] = chunk_range(count, p, k);
    return {b, e - b};
  }
  int64_t longest() const { return per >= 0 ? per : (count + p - 1) / p; }
};

// The reduce-scatter steps of one call. Step s (0 <= s < p-1) sends chunk first - s and reduces
// chunk first - s - 1, so the member ends holding chunk first + 1.
struct ReducePlan {
  Chunks chunks;
  int first = 0;              // the chunk sent at step 0: this member's own input
  const char* src = nullptr;  // this member's input array (chunk k at its offset)
  char* dst = nullptr;        // all_reduce: the output array; reduce_scatter: the final chunk
  char* partials = nullptr;   // reduce_scatter on 3+ members: two chunk-sized partials
  ReduceOp op = ReduceOp::sum;
  bool all_reduce = false;  // outputs at their offsets in dst; the last step starts the gather
};

template <Transport T>
class Ring {
 public:
  using Request = typename T::Request;

  Ring(T& tr, DType wire, const Chunks& ch)
      : tr_(tr),
        wire_dtype_(wire),
        elem_bytes_(dtype_size(wire)),
        group_size_(tr.size()),
        next_(mod(tr.rank() + 1, group_size_)),
        prev_(mod(tr.rank() - 1, group_size_)) {
    const Pipeline pl = tr.pipeline();
    const int64_t longest = std::max<int64_t>(1, ch.longest());
    segment_elems_ = pl.segment_bytes > 0
                         ? std::clamp<int64_t>(pl.segment_bytes / elem_bytes_, 1, longest)
                         : longest;
    depth_ = static_cast<int>(std::clamp<int64_t>(pl.depth, 1, segments(longest)));
    slots_ = Scratch::at_least(tr.scratch().segments, depth_ * segment_elems_ * elem_bytes_);
  }

  int64_t segments(int64_t n) const { return (n + segment_elems_ - 1) / segment_elems_; }
  int64_t seg_len(int64_t n, int64_t j) const {
    return std::min(segment_elems_, n - j * segment_elems_);
  }
  // `n` elements at `b`.
  struct Piece {
    const char* b;
    int64_t n;
  };
  // Sends a piece in segments on `s` (collected in `into`).
  void send_segments(const Piece& x, Stream s, std::vector<Request>& into) {
    for (int64_t j = 0; j < segments(x.n); ++j)
      send({x.b + j * segment_elems_ * elem_bytes_, seg_len(x.n, j)}, s, into);
  }

  void reduce_scatter(const ReducePlan& plan) {
    const Chunks& ch = plan.chunks;
    std::vector<std::vector<Request>> sends(group_size_);  // by the step whose message they are
    const auto own = [&](int k) { return plan.src + ch(k).first * elem_bytes_; };
    send_segments({own(plan.first), ch(plan.first).second}, Stream::reduce, sends[0]);
    std::vector<Request> rq(depth_);
    const ReduceOp step_op = plan.op == ReduceOp::avg ? ReduceOp::sum : plan.op;
    for (int s = 0; s < group_size_ - 1; ++s) {
      const int k = mod(plan.first - s - 1, group_size_);
      const bool last = s == group_size_ - 2;
      // reduce_scatter's partials alternate: step s overwrites what step s-2 wrote and step s-1
      // sent.
      if (!plan.all_reduce && s >= 2) tr_.wait_all(sends[s - 1]);
      const int64_t n = ch(k).second, ns = segments(n);
      const char* mine = own(k);
      char* out = plan.all_reduce ? plan.dst + ch(k).first * elem_bytes_
                  : last          ? plan.dst
                                  : plan.partials + (s % 2) * ch(k).second * elem_bytes_;
      const ReduceSpec red{wire_dtype_, last ? plan.op : step_op, group_size_};
      for (int64_t j = 0; j < std::min<int64_t>(depth_, ns); ++j) recv(j, seg_len(n, j), rq);
      for (int64_t j = 0; j < ns; ++j) {
        tr_.wait(rq[j % depth_]);
        const int64_t len = seg_len(n, j), off = j * segment_elems_ * elem_bytes_;
        reduce_buffers(out + off, {slot(j), mine + off}, len, red);
        if (j + depth_ < ns) recv(j + depth_, seg_len(n, j + depth_), rq);
        if (!last)
          send({out + off, len}, Stream::reduce, sends[s + 1]);
        else if (plan.all_reduce)
          send({out + off, len}, Stream::gather, gather_sends_);
      }
    }
    for (auto& v : sends) tr_.wait_all(v);
  }

  // The all-gather steps: this member holds chunk `held` (chunk k at dst + its offset); step u
  // sends chunk held - u and receives chunk held - u - 1, forwarding each segment as it arrives.
  // Step 0's messages are already in gather_sends().
  void all_gather(const Chunks& ch, int held, char* dst) {
    struct Seg {
      char* b;
      int64_t n;
      bool forward;
    };
    std::vector<Seg> segs;
    for (int u = 0; u < group_size_ - 1; ++u) {
      const int k = mod(held - u - 1, group_size_);
      const auto [first, n] = ch(k);
      for (int64_t j = 0; j < segments(n); ++j)
        segs.push_back(
            {dst + (first + j * segment_elems_) * elem_bytes_, seg_len(n, j), u < group_size_ - 2});
    }
    std::vector<Request> rq;
    rq.reserve(segs.size());
    for (const Seg& g : segs)
      rq.push_back(tr_.irecv({g.b, g.n, wire_dtype_}, prev_, Stream::gather));
    for (size_t i = 0; i < segs.size(); ++i) {
      tr_.wait(rq[i]);
      if (segs[i].forward) send({segs[i].b, segs[i].n}, Stream::gather, gather_sends_);
    }
    tr_.wait_all(gather_sends_);
  }
  std::vector<Request>& gather_sends() { return gather_sends_; }

 private:
  char* slot(int64_t j) const { return slots_ + (j % depth_) * segment_elems_ * elem_bytes_; }
  void send(const Piece& x, Stream s, std::vector<Request>& into) {
    into.push_back(tr_.isend({const_cast<char*>(x.b), x.n, wire_dtype_}, next_, s));
  }
  void recv(int64_t j, int64_t n, std::vector<Request>& rq) {
    rq[j % depth_] = tr_.irecv({slot(j), n, wire_dtype_}, prev_, Stream::reduce);
  }

  T& tr_;
  DType wire_dtype_;              // the dtype on the wire (and of every buffer)
  int64_t elem_bytes_;            // its size in bytes
  int group_size_, next_, prev_;  // members; the ring's next and previous member
  int64_t segment_elems_ = 1;     // elements per pipeline segment
  int depth_ = 1;                 // segments received in flight
  char* slots_ = nullptr;         // depth_ receive slots of segment_elems_ each (scratch)
  std::vector<Request> gather_sends_;
};

// Where a bf16 reduction's f32 copy puts its result: over its input (all_reduce), or after the
// size() * count inputs (reduce_scatter).
enum class Widened : uint8_t { in_place, after_inputs };

// bf16 reductions run on an f32 copy in the transport's scratch (partial sums travel in f32) and
// round once at the end.
template <Transport T, class F>
void on_widened(T& tr, const Call& c, Widened layout, F&& run) {
  const int64_t inputs = layout == Widened::in_place ? c.count : c.count * tr.size();
  const int64_t outputs = layout == Widened::in_place ? 0 : c.count;
  float* f = reinterpret_cast<float*>(
      Scratch::at_least(tr.scratch().widened, (inputs + outputs) * int64_t{sizeof(float)}));
  bf16_to_f32(f, static_cast<const uint16_t*>(c.send), inputs);
  float* out = f + (inputs + outputs - c.count);
  run(Call{f, out, c.count, DType::f32, c.op});
  f32_to_bf16(static_cast<uint16_t*>(c.recv), out, c.count);
}

// A group of one: the result is this member's input (avg divides by 1).
inline void copy_if_apart(const void* send, void* recv, int64_t bytes) {
  if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
}

template <Transport T>
void ring_all_reduce(T& tr, const Call& c) {
  const int p = tr.size();
  if (c.count == 0) return;
  if (p == 1) return copy_if_apart(c.send, c.recv, c.count * dtype_size(c.dtype));
  if (c.dtype == DType::bf16)
    return on_widened(tr, c, Widened::in_place, [&](const Call& w) { ring_all_reduce(tr, w); });
  const Chunks ch{.count = c.count, .p = p};
  Ring<T> ring(tr, c.dtype, ch);
  // Member r sends its own chunk r first and ends the reduce-scatter holding chunk r + 1.
  ring.reduce_scatter({.chunks = ch,
                       .first = tr.rank(),
                       .src = static_cast<const char*>(c.send),
                       .dst = static_cast<char*>(c.recv),
                       .op = c.op,
                       .all_reduce = true});
  ring.all_gather(ch, mod(tr.rank() + 1, p), static_cast<char*>(c.recv));
}

template <Transport T>
void ring_reduce_scatter(T& tr, const Call& c) {
  const int p = tr.size();
  if (c.count == 0) return;
  const int64_t es = dtype_size(c.dtype), bytes = c.count * es;
  if (p == 1) return copy_if_apart(c.send, c.recv, bytes);
  if (c.dtype == DType::bf16)
    return on_widened(tr, c, Widened::after_inputs,
                      [&](const Call& w) { ring_reduce_scatter(tr, w); });
  const Chunks ch{.per = c.count, .p = p};
  Ring<T> ring(tr, c.dtype, ch);
  char* partials = p > 2 ? Scratch::at_least(tr.scratch().partials, 2 * bytes) : nullptr;
  // Member r ends holding chunk r: its first message is chunk r - 1.
  ring.reduce_scatter({.chunks = ch,
                       .first = mod(tr.rank() - 1, p),
                       .src = static_cast<const char*>(c.send),
                       .dst = static_cast<char*>(c.recv),
                       .partials = partials,
                       .op = c.op});
}

template <Transport T>
void ring_all_gather(T& tr, const Call& c) {
  const int p = tr.size(), r = tr.rank();
  if (c.count == 0) return;
  const int64_t bytes = c.count * dtype_size(c.dtype);
  char* dst = static_cast<char*>(c.recv);
  char* mine = dst + r * bytes;
  if (p == 1) return copy_if_apart(c.send, mine, bytes);
  const Chunks ch{.per = c.count, .p = p};
  Ring<T> ring(tr, c.dtype, ch);
  ring.send_segments({static_cast<const char*>(c.send), c.count}, Stream::gather,
                     ring.gather_sends());
  copy_if_apart(c.send, mine, bytes);  // the send buffer is only read meanwhile
  ring.all_gather(ch, r, dst);
}

}  // namespace nxd::algorithms::detail
