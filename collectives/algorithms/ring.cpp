#include "nxd/collectives/algorithms/ring.h"

#include <vector>

namespace nxd::algorithms {

std::pair<int64_t, int64_t> chunk_range(int64_t count, int p, int k) {
  const int64_t base = count / p, extra = count % p;
  const int64_t begin = k * base + std::min<int64_t>(k, extra);
  return {begin, begin + base + (k < extra ? 1 : 0)};
}

namespace {
int mod(int a, int p) {
  return ((a % p) + p) % p;
}
}  // namespace

int ring_reduce_scatter(Communicator& c, void* buf, int64_t count, DType t, ReduceOp op, int tag) {
  const int p = c.size(), r = c.rank();
  const int64_t es = dtype_size(t);
  char* b = static_cast<char*>(buf);
  const int next = mod(r + 1, p), prev = mod(r - 1, p);
  std::vector<char> tmp((count / p + 1) * es);
  for (int s = 0; s < p - 1; ++s) {
    auto [sb, se] = chunk_range(count, p, mod(r - s, p));
    auto [rb, re] = chunk_range(count, p, mod(r - s - 1, p));
    Work w = c.isend(b + sb * es, se - sb, t, next, tag);
    c.recv(tmp.data(), re - rb, t, prev, tag);
    w.wait();
    // Sum only here; avg divides once at the end.
    reduce_buffers(b + rb * es, {tmp.data(), b + rb * es}, re - rb,
                   {t, op == ReduceOp::avg ? ReduceOp::sum : op, p});
  }
  const int mine = mod(r + 1, p);
  if (op == ReduceOp::avg && p > 1) {
    auto [mb, me] = chunk_range(count, p, mine);
    reduce_buffers(b + mb * es, {b + mb * es}, me - mb, {t, ReduceOp::avg, p});
  }
  return mine;
}

void ring_all_gather(Communicator& c, void* buf, int64_t count, DType t, int shift, int tag) {
  const int p = c.size(), r = c.rank();
  const int64_t es = dtype_size(t);
  char* b = static_cast<char*>(buf);
  const int next = mod(r + 1, p), prev = mod(r - 1, p);
  for (int s = 0; s < p - 1; ++s) {
    auto [sb, se] = chunk_range(count, p, mod(r + shift - s, p));
    auto [rb, re] = chunk_range(count, p, mod(r + shift - s - 1, p));
    Work w = c.isend(b + sb * es, se - sb, t, next, tag);
    c.recv(b + rb * es, re - rb, t, prev, tag);
    w.wait();
  }
}

void ring_all_reduce(Communicator& c, void* buf, int64_t count, DType t, ReduceOp op, int tag) {
  NXD_CHECK(op != ReduceOp::avg || is_floating(t),
            "[ring_all_reduce] avg needs a floating dtype, "
            "got ",
            t, " on group ", c.group_str());
  if (c.size() == 1 || count == 0) return;
  if (t == DType::bf16) {  // partial sums in f32, one rounding at the end
    std::vector<float> f(count);
    bf16_to_f32(f.data(), static_cast<const uint16_t*>(buf), count);
    ring_all_reduce(c, f.data(), count, DType::f32, op, tag);
    f32_to_bf16(static_cast<uint16_t*>(buf), f.data(), count);
    return;
  }
  ring_reduce_scatter(c, buf, count, t, op, tag);
  ring_all_gather(c, buf, count, t, /*shift=*/1, tag);
}

}  // namespace nxd::algorithms
