#include "nxd/collectives/algorithms/rdh.h"

#include <vector>

#include "nxd/collectives/algorithms/ring.h"

namespace nxd::algorithms {
namespace {

bool pow2(int p) {
  return p > 0 && (p & (p - 1)) == 0;
}

// Sends `ns` elements to and receives `nr` from `peer`. Empty halves (count < q) are not sent:
// both sides know the sizes, and a null buffer would mean a shape-only message.
void exchange(Communicator& c, const char* send, int64_t ns, char* recv, int64_t nr, DType t,
              int peer, int tag) {
  Work w;
  if (ns > 0) w = c.isend(send, ns, t, peer, tag);
  if (nr > 0) c.recv(recv, nr, t, peer, tag);
  w.wait();
}

// The halving-doubling core over the q = 2^k members listed in `peers` (communicator
// numbering); `me` is this member's index there. `reduce_op` is applied at every step (sum for
// avg: the caller divides once).
void halving(Communicator& c, const std::vector<int>& peers, int me, char* b, int64_t count,
             DType t, ReduceOp op, int tag, std::vector<char>& tmp) {
  const int q = static_cast<int>(peers.size());
  const int64_t es = dtype_size(t);
  int cb = 0, ce = q;  // chunks [cb, ce) still held
  for (int d = q / 2; d >= 1; d /= 2) {
    const int partner = me ^ d;
    const int mid = cb + (ce - cb) / 2;
    const bool lower = (me & d) == 0;
    const int kb = lower ? cb : mid, ke = lower ? mid : ce;  // kept
    const int sb = lower ? mid : cb, se = lower ? ce : mid;  // sent
    const int64_t kb0 = chunk_range(count, q, kb).first, ke0 = chunk_range(count, q, ke - 1).second;
    const int64_t sb0 = chunk_range(count, q, sb).first, se0 = chunk_range(count, q, se - 1).second;
    tmp.resize((ke0 - kb0) * es);
    exchange(c, b + sb0 * es, se0 - sb0, tmp.data(), ke0 - kb0, t, peers[partner], tag);
    char* kept = b + kb0 * es;
    // The lower member's partial first, so both halves of the tree combine in the same order.
    if (lower)
      reduce_buffers(kept, {kept, tmp.data()}, ke0 - kb0, {t, op, q});
    else
      reduce_buffers(kept, {tmp.data(), kept}, ke0 - kb0, {t, op, q});
    cb = kb;
    ce = ke;
  }
}

void doubling(Communicator& c, const std::vector<int>& peers, int me, char* b, int64_t count,
              DType t, int tag) {
  const int q = static_cast<int>(peers.size());
  const int64_t es = dtype_size(t);
  int cb = me, ce = me + 1;  // chunks held
  for (int d = 1; d < q; d *= 2) {
    const int partner = me ^ d;
    const bool lower = (me & d) == 0;
    const int pb = lower ? ce : cb - (ce - cb), pe = lower ? ce + (ce - cb) : cb;  // partner's
    const int64_t hb0 = chunk_range(count, q, cb).first, he0 = chunk_range(count, q, ce - 1).second;
    const int64_t pb0 = chunk_range(count, q, pb).first, pe0 = chunk_range(count, q, pe - 1).second;
    exchange(c, b + hb0 * es, he0 - hb0, b + pb0 * es, pe0 - pb0, t, peers[partner], tag);
    cb = std::min(cb, pb);
    ce = std::max(ce, pe);
  }
}

std::vector<int> identity(int p) {
  std::vector<int> v(p);
  for (int i = 0; i < p; ++i) v[i] = i;
  return v;
}

ReduceOp step_op(ReduceOp op) {
  return op == ReduceOp::avg ? ReduceOp::sum : op;
}

void divide_chunk(char* b, int64_t count, int q, int k, DType t, int p) {
  auto [lo, hi] = chunk_range(count, q, k);
  const int64_t es = dtype_size(t);
  reduce_buffers(b + lo * es, {b + lo * es}, hi - lo, {t, ReduceOp::avg, p});
}

}  // namespace

void rdh_reduce_scatter(Communicator& c, void* buf, int64_t count, DType t, ReduceOp op, int tag) {
  const int p = c.size();
  NXD_CHECK(pow2(p), "[rdh_reduce_scatter] needs a power-of-two group, got size ", p, " on group ",
            c.group_str());
  NXD_CHECK(op != ReduceOp::avg || is_floating(t),
            "[rdh_reduce_scatter] avg needs a floating dtype, got ", t, " on group ",
            c.group_str());
  if (p == 1 || count == 0) return;
  std::vector<char> tmp;
  char* b = static_cast<char*>(buf);
  halving(c, identity(p), c.rank(), b, count, t, step_op(op), tag, tmp);
  if (op == ReduceOp::avg) divide_chunk(b, count, p, c.rank(), t, p);
}

void rdh_all_gather(Communicator& c, void* buf, int64_t count, DType t, int tag) {
  const int p = c.size();
  NXD_CHECK(pow2(p), "[rdh_all_gather] needs a power-of-two group, got size ", p, " on group ",
            c.group_str());
  if (p == 1 || count == 0) return;
  doubling(c, identity(p), c.rank(), static_cast<char*>(buf), count, t, tag);
}

void rdh_all_reduce(Communicator& c, void* buf, int64_t count, DType t, ReduceOp op, int tag) {
  NXD_CHECK(op != ReduceOp::avg || is_floating(t),
            "[rdh_all_reduce] avg needs a floating dtype, got ", t, " on group ", c.group_str());
  const int p = c.size(), r = c.rank();
  if (p == 1 || count == 0) return;
  if (t == DType::bf16) {  // partial sums in f32, one rounding at the end
    std::vector<float> f(count);
    bf16_to_f32(f.data(), static_cast<const uint16_t*>(buf), count);
    rdh_all_reduce(c, f.data(), count, DType::f32, op, tag);
    f32_to_bf16(static_cast<uint16_t*>(buf), f.data(), count);
    return;
  }
  char* b = static_cast<char*>(buf);
  const int64_t es = dtype_size(t);
  int q = 1;
  while (q * 2 <= p) q *= 2;
  const int extra = p - q;
  // Fold: even members below 2*extra hand their array to the next odd member and sit out.
  std::vector<int> peers;
  for (int m = 0; m < p; ++m)
    if (m >= 2 * extra || m % 2 == 1) peers.push_back(m);
  std::vector<char> tmp;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      c.send(b, count, t, r + 1, tag);
      c.recv(b, count, t, r + 1, tag);
      return;
    }
    tmp.resize(count * es);
    c.recv(tmp.data(), count, t, r - 1, tag);
    reduce_buffers(b, {tmp.data(), b}, count, {t, step_op(op), p});  // the even member first
  }
  const int me = r < 2 * extra ? r / 2 : r - extra;
  halving(c, peers, me, b, count, t, step_op(op), tag, tmp);
  if (op == ReduceOp::avg) divide_chunk(b, count, q, me, t, p);
  doubling(c, peers, me, b, count, t, tag);
  if (r < 2 * extra) c.send(b, count, t, r - 1, tag);
}

}  // namespace nxd::algorithms
