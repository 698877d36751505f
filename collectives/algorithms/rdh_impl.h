#pragma once
// Recursive halving-doubling, written once against a Transport (transport.h): rdh.cpp
// instantiates it for a Communicator, mpi/p2p_algorithms.cpp for MPI point-to-point. rdh.h
// describes the algorithm; this is how it runs. Messages are whole halves (no segments): RDH is
// the latency-bound sizes' algorithm, where one message per step is what it saves.
#include <algorithm>
#include <vector>

#include "nxd/collectives/algorithms/ring_impl.h"  // Chunks, on_widened, copy_if_apart
#include "nxd/collectives/algorithms/transport.h"

namespace nxd::algorithms::detail {

inline bool pow2(int p) {
  return p > 0 && (p & (p - 1)) == 0;
}

// The halving steps' buffers: step 1 reads this member's input from `src`; every partial is
// written into `work` at its offset in the array, except the last step's, which goes to `last`
// when set (reduce_scatter's output) and stays in `work` otherwise (all_reduce).
struct HalvingPlan {
  const char* src = nullptr;
  char* work = nullptr;
  char* last = nullptr;
  ReduceOp op = ReduceOp::sum;  // the call's op: avg sums at every step and divides at the last
  int divisor = 1;              // avg's (the whole group's size)
};

template <Transport T>
class Rdh {
 public:
  // The halving-doubling core over the q = 2^k members `peers` (transport numbering) of which
  // this member is number `me`, on an array of `count` elements of `t` cut into q chunks.
  Rdh(T& tr, std::vector<int> peers, int me, const Call& c)
      : tr_(tr),
        peers_(std::move(peers)),
        q_(static_cast<int>(peers_.size())),
        me_(me),
        t_(c.dtype),
        es_(dtype_size(c.dtype)),
        ch_{.count = c.count, .p = q_} {}

  // Sends `out` to and receives `in` from `peer` (post, then finish). Empty halves (count < q)
  // are not sent: both sides know the sizes.
  struct Exchange {
    std::vector<typename T::Request> sends;
    typename T::Request recv{};
    bool receiving = false;
  };
  Exchange post(const Buf& out, const Buf& in, int peer) {
    Exchange x;
    if (out.count > 0) x.sends.push_back(tr_.isend(out, peers_[peer], Stream::reduce));
    if (in.count > 0) {
      x.recv = tr_.irecv(in, peers_[peer], Stream::reduce);
      x.receiving = true;
    }
    return x;
  }
  void finish(Exchange& x) {
    if (x.receiving) tr_.wait(x.recv);
    tr_.wait_all(x.sends);
  }
  void exchange(const Buf& out, const Buf& in, int peer) {
    Exchange x = post(out, in, peer);
    finish(x);
  }

  // lg q steps: at distance d (q/2, ..., 1) this member exchanges half of the chunks it still
  // holds with member me ^ d, keeps the half of its bit and reduces the received partial into
  // it, the lower member's partial first (both halves of the tree combine in one order). Ends
  // holding chunk `me`.
  void halving(const HalvingPlan& h) {
    int cb = 0, ce = q_;  // chunks [cb, ce) still held
    const char* from = h.src;
    const ReduceOp step = h.op == ReduceOp::avg ? ReduceOp::sum : h.op;
    for (int d = q_ / 2; d >= 1; d /= 2) {
      const int mid = cb + (ce - cb) / 2;
      const bool lower = (me_ & d) == 0;
      const int kb = lower ? cb : mid, ke = lower ? mid : ce;  // kept
      const int sb = lower ? mid : cb, se = lower ? ce : mid;  // sent
      const int64_t k0 = begin(kb), kn = begin(ke) - k0, s0 = begin(sb), sn = begin(se) - s0;
      char* tmp = Scratch::at_least(tr_.scratch().segments, kn * es_);
      exchange({const_cast<char*>(from) + s0 * es_, sn, t_}, {tmp, kn, t_}, me_ ^ d);
      char* kept = d == 1 && h.last ? h.last : h.work + k0 * es_;
      const char* own = from + k0 * es_;
      const ReduceSpec red{t_, d == 1 ? h.op : step, h.divisor};
      if (lower)
        reduce_buffers(kept, {own, tmp}, kn, red);
      else
        reduce_buffers(kept, {tmp, own}, kn, red);
      from = h.work;
      cb = kb;
      ce = ke;
    }
  }

  // lg q steps of distance 1, 2, ..., q/2: the range held doubles. This member's chunk `me` is
  // at `own` on entry (nullptr: already in `buf`; otherwise the first step sends it from there
  // and copies it into `buf` while the partner reads); every chunk is in `buf` on return.
  void doubling(char* buf, const char* own = nullptr) {
    int cb = me_, ce = me_ + 1;  // chunks held
    for (int d = 1; d < q_; d *= 2) {
      const bool lower = (me_ & d) == 0;
      const int pb = lower ? ce : cb - (ce - cb), pe = lower ? ce + (ce - cb) : cb;  // partner's
      const int64_t h0 = begin(cb), hn = begin(ce) - h0, p0 = begin(pb), pn = begin(pe) - p0;
      const bool from_own = d == 1 && own;
      char* held = buf + h0 * es_;
      Exchange x = post({from_own ? const_cast<char*>(own) : held, hn, t_},
                        {buf + p0 * es_, pn, t_}, me_ ^ d);
      if (from_own) copy_if_apart(own, held, hn * es_);
      finish(x);
      cb = std::min(cb, pb);
      ce = std::max(ce, pe);
    }
  }

  int64_t begin(int k) const { return k < q_ ? ch_(k).first : ch_.count; }

 private:
  T& tr_;
  std::vector<int> peers_;
  int q_, me_;
  DType t_;
  int64_t es_;
  Chunks ch_;
};

inline std::vector<int> first_members(int p) {
  std::vector<int> v(p);
  for (int i = 0; i < p; ++i) v[i] = i;
  return v;
}

// Any group size: a group that is not a power of two first folds (among the first 2(p-q)
// members each even one sends its array to the next odd one and waits), the q remaining members
// run halving and doubling, and the odd ones send the result back.
template <Transport T>
void rdh_all_reduce(T& tr, const Call& c) {
  const int p = tr.size(), r = tr.rank();
  const int64_t es = dtype_size(c.dtype);
  if (c.count == 0) return;
  if (p == 1) return copy_if_apart(c.send, c.recv, c.count * es);
  if (c.dtype == DType::bf16)
    return on_widened(tr, c, Widened::in_place, [&](const Call& w) { rdh_all_reduce(tr, w); });
  int q = 1;
  while (q * 2 <= p) q *= 2;
  const int extra = p - q;
  const ReduceOp step = c.op == ReduceOp::avg ? ReduceOp::sum : c.op;
  char* out = static_cast<char*>(c.recv);
  const char* src = static_cast<const char*>(c.send);
  if (r < 2 * extra) {
    if (r % 2 == 0) {  // folded out: hand the array over and wait for the result
      auto s = tr.isend({const_cast<char*>(src), c.count, c.dtype}, r + 1, Stream::reduce);
      auto q0 = tr.irecv({out, c.count, c.dtype}, r + 1, Stream::gather);
      tr.wait(s);
      tr.wait(q0);
      return;
    }
    char* tmp = Scratch::at_least(tr.scratch().partials, c.count * es);
    auto q0 = tr.irecv({tmp, c.count, c.dtype}, r - 1, Stream::reduce);
    tr.wait(q0);
    reduce_buffers(out, {tmp, src}, c.count, {c.dtype, step, p});  // the even member first
    src = out;
  }
  std::vector<int> peers;
  for (int m = 0; m < p; ++m)
    if (m >= 2 * extra || m % 2 == 1) peers.push_back(m);
  const int me = r < 2 * extra ? r / 2 : r - extra;
  Rdh<T> rdh(tr, std::move(peers), me, c);
  rdh.halving({.src = src, .work = out, .op = c.op, .divisor = p});
  rdh.doubling(out);
  if (r < 2 * extra) {
    auto s = tr.isend({out, c.count, c.dtype}, r - 1, Stream::gather);
    tr.wait(s);
  }
}

// Power-of-two groups (InvalidArgument otherwise): recv = this member's reduced block.
template <Transport T>
void rdh_reduce_scatter(T& tr, const Call& c) {
  const int p = tr.size();
  NXD_CHECK(pow2(p), "[rdh_reduce_scatter] needs a power-of-two group, got size ", p);
  const int64_t es = dtype_size(c.dtype), total = c.count * p;
  if (c.count == 0) return;
  if (p == 1) return copy_if_apart(c.send, c.recv, c.count * es);
  if (c.dtype == DType::bf16)
    return on_widened(tr, c, Widened::after_inputs,
                      [&](const Call& w) { rdh_reduce_scatter(tr, w); });
  char* work = p > 2 ? Scratch::at_least(tr.scratch().partials, total * es) : nullptr;
  Rdh<T> rdh(tr, first_members(p), tr.rank(), {c.send, c.recv, total, c.dtype, c.op});
  rdh.halving({.src = static_cast<const char*>(c.send),
               .work = work,
               .last = static_cast<char*>(c.recv),
               .op = c.op,
               .divisor = p});
}

// Power-of-two groups (InvalidArgument otherwise).
template <Transport T>
void rdh_all_gather(T& tr, const Call& c) {
  const int p = tr.size(), r = tr.rank();
  NXD_CHECK(pow2(p), "[rdh_all_gather] needs a power-of-two group, got size ", p);
  const int64_t bytes = c.count * dtype_size(c.dtype);
  if (c.count == 0) return;
  if (p == 1) return copy_if_apart(c.send, c.recv, bytes);
  Rdh<T> rdh(tr, first_members(p), r, {c.send, c.recv, c.count * p, c.dtype, c.op});
  rdh.doubling(static_cast<char*>(c.recv), static_cast<const char*>(c.send));
}

}  // namespace nxd::algorithms::detail
