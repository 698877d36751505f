#include "nxd/layers/parallel/context_parallel.h"

#include <cmath>
#include <limits>

#include "nxd/autograd/function.h"
#include "nxd/collectives/parallel_state.h"
#include "nxd/runtime/context.h"
#include "nxd/runtime/kernels/attention.h"
#include "nxd/runtime/kernels/flash_attention.h"

namespace nxd {

std::vector<std::pair<int64_t, int64_t>> context_parallel_spans(int64_t seq, int rank, int size,
                                                                CpLayout layout) {
  NXD_CHECK(size >= 1 && rank >= 0 && rank < size, "[context_parallel] rank ", rank,
            " outside a group of ", size);
  const int64_t parts = layout == CpLayout::balanced ? 2 * size : size;
  NXD_CHECK_SHAPE(seq % parts == 0, "[context_parallel] sequence length ", seq,
                  " is not divisible by ", parts, " (", layout == CpLayout::balanced ? "2 x " : "",
                  "context parallel size ", size, ")");
  const int64_t c = seq / parts;
  if (layout == CpLayout::contiguous) return {{rank * c, c}};
  return {{rank * c, c}, {(parts - 1 - rank) * c, c}};
}

Tensor context_parallel_slice(const Tensor& x, int64_t dim, int rank, int size, CpLayout layout) {
  NXD_CHECK(x.defined() && dim >= 0 && dim < x.dim(), "[context_parallel_slice] dim ", dim, " of ",
            x.defined() ? x.desc() : "undefined");
  std::vector<Tensor> parts;
  for (auto [start, len] : context_parallel_spans(x.size(dim), rank, size, layout))
    parts.push_back(x.detach().narrow(dim, start, len));
  return parts.size() == 1 ? parts[0].clone() : cat_raw(parts, dim);
}

Tensor context_parallel_gather(const Tensor& local, int64_t dim, Communicator& group,
                               CpLayout layout) {
  NXD_CHECK(local.defined() && dim >= 0 && dim < local.dim(), "[context_parallel_gather] dim ", dim,
            " of ", local.defined() ? local.desc() : "undefined");
  const int p = group.size();
  const int64_t n = local.size(dim), seq = n * p;
  Tensor all = group.all_gather(local.detach().contiguous(), dim);  // members in rank order
  Tensor out = empty(all.shape(), all.dtype(), all.device());
  for (int s = 0; s < p; ++s) {
    int64_t off = s * n;
    for (auto [start, len] : context_parallel_spans(seq, s, p, layout)) {
      if (!out.is_meta()) out.narrow(dim, start, len).copy_(all.narrow(dim, off, len));
      off += len;
    }
  }
  return out;
}

namespace {

constexpr int kTagKv = 0x4350, kTagKvBack = kTagKv + 2, kTagDkv = kTagKv + 4;

// The rows of one ring step: queries [q0, q0+qn) against keys [k0, k0+kn) of the visiting block.
struct Pair {
  bool any = false;
  int64_t q0 = 0, qn = 0, k0 = 0, kn = 0;
  bool causal = false;
};

Pair pair_for(int r, int s, int64_t local, CpLayout layout) {
  if (s == r) return {true, 0, local, 0, local, true};
  if (layout == CpLayout::contiguous) {
    if (s < r) return {true, 0, local, 0, local, false};
    return {};
  }
  const int64_t c = local / 2;
  if (s < r) return {true, 0, local, 0, c, false};  // s's first chunk, seen by both of ours
  return {true, c, c, 0, local, false};             // our second chunk sees both of s's
}

// Tensors sent to the next member of the ring while the previous member's arrive.
struct Exchange {
  std::vector<Tensor> in;
  std::vector<Work> works;
  void wait() {
    for (Work& w : works) w.wait();
    works.clear();
  }
};

Exchange start_exchange(Communicator& g, const std::vector<Tensor>& out, int tag0) {
  const int p = g.size(), next = (g.rank() + 1) % p, prev = (g.rank() + p - 1) % p;
  Exchange ex;
  for (size_t i = 0; i < out.size(); ++i) {
    ex.in.push_back(empty(out[i].shape(), out[i].dtype(), out[i].device()));
    ex.works.push_back(g.isend(out[i], next, tag0 + int(i)));
    ex.works.push_back(g.irecv(ex.in.back(), prev, tag0 + int(i)));
  }
  return ex;
}

// Merges a block's output ob [B,H,n,D] and log-sum-exp lb [B,H,n] into rows [r0, r0+n) of the
// running acc [B,H,L,D], lse [B,H,L] (all contiguous): lse' = log(e^lse + e^lb),
// acc' = acc e^(lse - lse') + ob e^(lb - lse').
template <class T>
void merge_rows(const Tensor& acc, const Tensor& lse, const Tensor& ob, const Tensor& lb,
                int64_t r0) {
  const int64_t bh = ob.size(0) * ob.size(1), n = ob.size(2), d = ob.size(3), L = acc.size(2);
  T *a = acc.data<T>(), *la = lse.data<T>();
  const T *o = ob.data<T>(), *l = lb.data<T>();
  for (int64_t u = 0; u < bh; ++u)
    for (int64_t i = 0; i < n; ++i) {
      const T x = la[u * L + r0 + i], y = l[u * n + i];
      T* ar = a + (u * L + r0 + i) * d;
      const T* orow = o + (u * n + i) * d;
      if (y == -std::numeric_limits<T>::infinity()) continue;  // the block saw no key of the row
      if (x == -std::numeric_limits<T>::infinity()) {
        std::copy(orow, orow + d, ar);
        la[u * L + r0 + i] = y;
        continue;
      }
      const T m = std::max(x, y), ln = m + std::log(std::exp(x - m) + std::exp(y - m));
      const T wa = std::exp(x - ln), wb = std::exp(y - ln);
      for (int64_t j = 0; j < d; ++j) ar[j] = wa * ar[j] + wb * orow[j];
      la[u * L + r0 + i] = ln;
    }
}

// dst [B,H,L,D] rows [r0, r0+n) += src [B,H,n,D] (both contiguous).
template <class T>
void add_rows(const Tensor& dst, const Tensor& src, int64_t r0) {
  const int64_t bh = src.size(0) * src.size(1), n = src.size(2) * src.size(3);
  const int64_t L = dst.size(2) * dst.size(3), off = r0 * dst.size(3);
  T* a = dst.data<T>();
  const T* b = src.data<T>();
  for (int64_t u = 0; u < bh; ++u)
    for (int64_t i = 0; i < n; ++i) a[u * L + off + i] += b[u * n + i];
}

template <class F>
void dispatch(const Tensor& t, F&& f) {
  if (t.is_meta()) return;
  if (t.dtype() == DType::f64)
    f.template operator()<double>();
  else
    f.template operator()<float>();
}

struct RingState {
  Communicator* g = nullptr;
  RingAttentionOptions opts;
  DType priced = DType::f32;  // the inputs' dtype: bf16 attention is priced at the bf16 rate
  Tensor q, k, v;             // the inputs (detached, their own dtype and layout: nothing copied)
  Tensor out, lse;            // compute dtype, contiguous
};

// x in the compute dtype (f32 for bf16; x itself otherwise), in any layout the kernels take.
Tensor compute(const Tensor& x) {
  Tensor d = x.detach();
  return d.dtype() == DType::bf16 ? d.to(DType::f32) : d;
}
// A contiguous copy of a K/V block to send around the ring, in its own dtype (bf16 travels as
// bf16: half the bytes; each rank converts the block it computes with).
Tensor travelling(const Tensor& x) {
  return x.detach().contiguous();
}

void ring_forward(RingState& st) {
  Communicator& g = *st.g;
  const int p = g.size(), r = g.rank();
  const Tensor q = compute(st.q);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3);
  const DType dt = q.dtype();
  const Device dev = q.device();
  st.out = zeros({B, H, L, D}, dt, dev);
  st.lse = full({B, H, L}, -std::numeric_limits<double>::infinity(), dt, dev);
  const kernels::AttentionPricing priced(st.priced);
  Tensor kt = travelling(st.k), vt = travelling(st.v);
  for (int t = 0; t < p; ++t) {
    Exchange ex;
    if (t + 1 < p) ex = start_exchange(g, {kt, vt}, kTagKv);
    const Pair pr = pair_for(r, (r + p - t) % p, L, st.opts.layout);
    if (pr.any) {
      const Tensor kc = compute(kt), vc = compute(vt);
      Tensor ob = empty({B, H, pr.qn, D}, dt, dev), lb = empty({B, H, pr.qn}, dt, dev);
      kernels::flash_attention_forward(ob, lb, q.narrow(2, pr.q0, pr.qn),
                                       kc.narrow(2, pr.k0, pr.kn), vc.narrow(2, pr.k0, pr.kn),
                                       pr.causal, st.opts.scale);
      charge_compute("ring_attention_merge", 6.0 * B * H * pr.qn * D,
                     double(dtype_size(dt)) * 3.0 * B * H * pr.qn * D, dt);
      dispatch(ob, [&]<class T>() { merge_rows<T>(st.out, st.lse, ob, lb, pr.q0); });
    }
    if (t + 1 < p) {
      ex.wait();
      kt = ex.in[0];
      vt = ex.in[1];
    }
  }
}

// dq, dk, dv in the compute dtype.
std::vector<Tensor> ring_backward(const RingState& st, const Tensor& dout) {
  Communicator& g = *st.g;
  const int p = g.size(), r = g.rank();
  const Tensor q = compute(st.q);
  const int64_t L = q.size(2);
  const DType dt = q.dtype();
  const Device dev = q.device();
  Tensor dq = zeros(q.shape(), dt, dev);
  Tensor kt = travelling(st.k), vt = travelling(st.v);
  Tensor dkc = zeros(kt.shape(), dt, dev), dvc = zeros(vt.shape(), dt, dev);
  const kernels::AttentionPricing priced(st.priced);
  Exchange acc;  // the accumulators of the block being visited, arriving from the previous rank
  for (int t = 0; t < p; ++t) {
    Exchange ex;
    if (t + 1 < p) ex = start_exchange(g, {kt, vt}, kTagKvBack);
    const Pair pr = pair_for(r, (r + p - t) % p, L, st.opts.layout);
    Tensor dqb, dkb, dvb;
    if (pr.any) {
      const Tensor kb = compute(kt.narrow(2, pr.k0, pr.kn)),
                   vb = compute(vt.narrow(2, pr.k0, pr.kn));
      dqb = empty({q.size(0), q.size(1), pr.qn, q.size(3)}, dt, dev);
      dkb = empty(kb.shape(), dt, dev);
      dvb = empty(vb.shape(), dt, dev);
      kernels::flash_attention_backward(
          dqb, dkb, dvb, dout.narrow(2, pr.q0, pr.qn), q.narrow(2, pr.q0, pr.qn), kb, vb,
          st.out.narrow(2, pr.q0, pr.qn), st.lse.narrow(2, pr.q0, pr.qn).contiguous(), pr.causal,
          st.opts.scale);
    }
    if (t > 0) {
      acc.wait();
      dkc = acc.in[0];
      dvc = acc.in[1];
    }
    if (pr.any)
      dispatch(dq, [&]<class T>() {
        add_rows<T>(dq, dqb, pr.q0);
        add_rows<T>(dkc, dkb, pr.k0);
        add_rows<T>(dvc, dvb, pr.k0);
      });
    // the block's accumulators follow it; after p hops they are back at its owner
    if (p > 1) acc = start_exchange(g, {dkc, dvc}, kTagDkv);
    if (t + 1 < p) {
      ex.wait();
      kt = ex.in[0];
      vt = ex.in[1];
    }
  }
  if (p == 1) return {dq, dkc, dvc};
  acc.wait();
  return {dq, acc.in[0], acc.in[1]};
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& g,
                  const RingAttentionOptions& o) {
  const char* op = "ring_attention";
  NXD_CHECK(q.defined() && k.defined() && v.defined(), "[", op, "] undefined input");
  NXD_CHECK_SHAPE(
      q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() && q.size(2) == k.size(2) &&
          q.size(0) == k.size(0) && q.size(3) == k.size(3),
      "[", op, "] expects q [B,Hq,S,D], k and v [B,Hkv,S,D] of this rank's rows, got q=", q.desc(),
      " k=", k.desc(), " v=", v.desc());
  NXD_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype() && is_floating(q.dtype()), "[", op,
            "] needs floating inputs of one dtype, got q=", q.desc(), " k=", k.desc(),
            " v=", v.desc());
  NXD_CHECK_SHAPE(o.layout == CpLayout::contiguous || q.size(2) % 2 == 0, "[", op,
                  "] the balanced layout holds two chunks per rank: local length ", q.size(2),
                  " is odd (context parallel size ", g.size(), ")");
}

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& group,
                      const RingAttentionOptions& opts) {
  check_inputs(q, k, v, group, opts);
  auto st = std::make_shared<RingState>();
  st->g = &group;
  st->opts = opts;
  const DType dt = q.dtype();
  st->priced = dt;
  auto to_dt = [dt](const Tensor& t) { return t.dtype() == dt ? t : t.to(dt); };
  return autograd::custom(
      "ring_attention", {q, k, v},
      [st, to_dt](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        st->q = in[0].detach();
        st->k = in[1].detach();
        st->v = in[2].detach();
        ring_forward(*st);
        Tensor out = st->out;
        st->out = out.detach();  // the state must not hold the graph's output (a cycle)
        return {to_dt(out)};
      },
      [st, to_dt](const Grads& g) -> Grads {
        std::vector<Tensor> d = ring_backward(*st, compute(g[0]));
        return {to_dt(d[0]), to_dt(d[1]), to_dt(d[2])};
      })[0];
}

std::shared_ptr<Communicator> model_context_parallel_group() {
  if (!parallel_state::model_parallel_is_initialized()) return nullptr;
  if (parallel_state::get_context_parallel_size() == 1) return nullptr;
  return parallel_state::get_context_parallel_group_ptr();
}

int model_context_parallel_size() {
  auto g = model_context_parallel_group();
  return g ? g->size() : 1;
}

Tensor context_parallel_rotary(const Tensor& x, const RotaryOptions& opts, Communicator& group,
                               CpLayout layout) {
  NXD_CHECK_SHAPE(x.defined() && x.dim() == 4, "[context_parallel_rotary] expects [B,H,S,D], got ",
                  x.defined() ? x.desc() : "undefined");
  const int64_t local = x.size(2);
  std::vector<Tensor> parts;
  int64_t off = 0;
  for (auto [start, len] :
       context_parallel_spans(local * group.size(), group.rank(), group.size(), layout)) {
    RotaryOptions o = opts;
    o.position_offset = opts.position_offset + start;
    parts.push_back(rotary(narrow(x, 2, off, len), o));
    off += len;
  }
  return parts.size() == 1 ? parts[0] : cat(parts, 2);
}

namespace {
// Forward: all-reduce SUM over the group, times `fwd_scale`; backward: the gradient times
// `bwd_scale`.
Tensor reduce_scaled(const char* name, const Tensor& x, Communicator& group, double fwd_scale,
                     double bwd_scale) {
  Communicator* g = &group;
  return autograd::custom(
      name, {x},
      [g, fwd_scale](const std::vector<Tensor>& in) -> std::vector<Tensor> {
        Tensor t = in[0].dtype() == DType::bf16 ? in[0].to(DType::f32) : in[0].clone();
        g->all_reduce(t, ReduceOp::sum);
        Tensor s = mul(t, fwd_scale);
        return {s.dtype() == in[0].dtype() ? s : s.to(in[0].dtype())};
      },
      [bwd_scale](const Grads& gr) -> Grads { return {mul(gr[0], bwd_scale)}; })[0];
}
}  // namespace

Tensor context_parallel_mean_loss(const Tensor& local_sum, int64_t local_count,
                                  Communicator& group) {
  double count = double(local_count);
  group.all_reduce(&count, &count, 1, DType::f64, ReduceOp::sum);
  // no counted token anywhere: the loss is 0/0 as cross_entropy's mean gives
  return reduce_scaled("context_parallel_mean_loss", local_sum, group, 1.0 / count,
                       group.size() / count);
}

Tensor context_parallel_sum_loss(const Tensor& local_sum, Communicator& group) {
  return reduce_scaled("context_parallel_sum_loss", local_sum, group, 1.0, group.size());
}

}  // namespace nxd
