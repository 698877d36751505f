#include "nxd/layers/moe/dispatch.h"

#include <algorithm>
#include <numeric>

#include "nxd/autograd/function.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/sim/clock.h"

namespace nxd {

namespace {
struct A2aSeconds {
  double total = 0;
};
sim::SimClock* clock() {
  return dynamic_cast<sim::SimClock*>(current_context().cost_model());
}
}  // namespace

double moe_all_to_all_seconds() {
  return current_context().ext<A2aSeconds>().total;
}

std::vector<int64_t> gather_counts(Communicator& g, const std::vector<int64_t>& in) {
  sim::SimClock* c = clock();
  const double t0 = c ? c->now() : 0;
  const int64_t n = static_cast<int64_t>(in.size());
  std::vector<int64_t> out(static_cast<size_t>(n * g.size()));
  g.all_gather(in.data(), out.data(), n, DType::i64);
  if (c) current_context().ext<A2aSeconds>().total += c->now() - t0;
  return out;
}

namespace {
// The raw padded exchange: rows of x grouped by destination (send counts) -> grouped by source.
Tensor exchange_rows(const Tensor& x, const std::vector<int64_t>& send,
                     const std::vector<int64_t>& recv, int64_t known_cap, Communicator& g) {
  const int P = g.size();
  const int64_t D = x.size(1);
  sim::SimClock* c = clock();
  const double t0 = c ? c->now() : 0;
  struct Charge {  // the exchange's modeled time, whichever way it returns
    sim::SimClock* c;
    double t0;
    ~Charge() {
      if (c) current_context().ext<A2aSeconds>().total += c->now() - t0;
    }
  } charge{c, t0};
  int64_t local_max = 0;
  for (int p = 0; p < P; ++p) local_max = std::max({local_max, send[p], recv[p]});
  int64_t cap = known_cap;
  if (cap < 0)
    g.all_reduce(&local_max, &cap, 1, DType::i64, ReduceOp::max);
  else
    NXD_INTERNAL_CHECK(cap >= local_max, "[all_to_all_rows] cap ", cap, " below this member's ",
                       local_max, " rows to or from one member");
  Tensor xc = x.contiguous();
  const Device dev = x.device();  // meta (the planner): the buffers' bytes and the exchange's cost
  Tensor out = empty({std::accumulate(recv.begin(), recv.end(), int64_t{0}), D}, x.dtype(), dev);
  if (cap == 0) return out;
  Tensor sbuf = zeros({P * cap, D}, x.dtype(), dev), rbuf = empty({P * cap, D}, x.dtype(), dev);
  if (dev == Device::meta) {
    g.all_to_all(nullptr, nullptr, cap * D, x.dtype());
    return out;
  }
  int64_t off = 0;
  for (int p = 0; p < P; ++p) {
    if (send[p] > 0) sbuf.narrow(0, p * cap, send[p]).copy_(xc.narrow(0, off, send[p]));
    off += send[p];
  }
  g.all_to_all(sbuf.raw_data(), rbuf.raw_data(), cap * D, x.dtype());
  off = 0;
  for (int p = 0; p < P; ++p) {
    if (recv[p] > 0) out.narrow(0, off, recv[p]).copy_(rbuf.narrow(0, p * cap, recv[p]));
    off += recv[p];
  }
  return out;
}
}  // namespace

Tensor all_to_all_rows(const Tensor& x, const RowCounts& c, Communicator& g) {
  const int P = g.size();
  NXD_CHECK(static_cast<int>(c.send.size()) == P && static_cast<int>(c.recv.size()) == P,
            "[all_to_all_rows] counts for ", c.send.size(), "/", c.recv.size(),
            " members, group has ", P);
  NXD_CHECK_SHAPE(
      x.dim() == 2 && x.size(0) == std::accumulate(c.send.begin(), c.send.end(), int64_t{0}),
      "[all_to_all_rows] x must be [sum(send), D], got ", x.desc());
  Communicator* gp = &g;
  const RowCounts counts = c;
  return autograd::custom(
      "all_to_all_rows", {x},
      [counts, gp](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        return {exchange_rows(in[0], counts.send, counts.recv, counts.cap, *gp)};
      },
      [counts, gp](const Grads& gr) -> Grads {
        return {exchange_rows(gr[0], counts.recv, counts.send, counts.cap, *gp)};
      })[0];
}

}  // namespace nxd
