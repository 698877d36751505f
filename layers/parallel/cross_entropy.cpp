#include "nxd/layers/parallel/cross_entropy.h"

#include <cmath>
#include <limits>

#include "nxd/collectives/parallel_state.h"

namespace nxd {

namespace {

template <class T>
struct CeForward {
  // lc [n, vl] contiguous; writes loss [n], prob [n, vl].
  static void run(Communicator& g, const Tensor& lc, const std::vector<int64_t>& tg, int64_t vl,
                  int64_t start, int64_t vocab, int64_t ignore, double a, const Tensor& loss,
                  const Tensor& prob) {
    const int64_t n = static_cast<int64_t>(tg.size());
    const T* z = lc.data<T>();
    T* p = prob.data<T>();
    T* l = loss.data<T>();
    Tensor mx = empty({n}, lc.dtype());
    T* m = mx.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      T v = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < vl; ++j) v = std::max(v, z[i * vl + j]);
      m[i] = v;
    }
    g.all_reduce(mx, ReduceOp::max);
    Tensor st = zeros({n, 3}, lc.dtype());  // [pred, sum exp, sum shifted]
    T* s = st.data<T>();
    for (int64_t i = 0; i < n; ++i) {
      const T* zi = z + i * vl;
      T* pi = p + i * vl;
      T se = 0, ss = 0;
      for (int64_t j = 0; j < vl; ++j) {
        T sh = zi[j] - m[i];
        T e = std::exp(sh);
        pi[j] = e;
        se += e;
        ss += sh;
      }
      const int64_t t = tg[i];
      s[i * 3 + 0] = (t >= start && t < start + vl) ? zi[t - start] - m[i] : T(0);
      s[i * 3 + 1] = se;
      s[i * 3 + 2] = ss;
    }
    g.all_reduce(st, ReduceOp::sum);
    for (int64_t i = 0; i < n; ++i) {
      const T lse = std::log(s[i * 3 + 1]);
      const T inv = T(1) / s[i * 3 + 1];
      for (int64_t j = 0; j < vl; ++j) p[i * vl + j] *= inv;
      if (tg[i] == ignore) {
        l[i] = 0;
        continue;
      }
      const T nll = lse - s[i * 3 + 0];
      const T smooth = lse - s[i * 3 + 2] / static_cast<T>(vocab);
      l[i] = static_cast<T>((1 - a) * nll + a * smooth);
    }
  }

  static void backward(const Tensor& dl, const Tensor& dloss, const Tensor& prob,
                       const std::vector<int64_t>& tg, int64_t vl, int64_t start, int64_t vocab,
                       int64_t ignore, double a) {
    const int64_t n = static_cast<int64_t>(tg.size());
    const T* p = prob.data<T>();
    const T* gl = dloss.data<T>();
    T* d = dl.data<T>();
    const T av = static_cast<T>(a / static_cast<double>(vocab));
    for (int64_t i = 0; i < n; ++i) {
      T* di = d + i * vl;
      if (tg[i] == ignore) {
        for (int64_t j = 0; j < vl; ++j) di[j] = 0;
        continue;
      }
      const T gi = gl[i];
      for (int64_t j = 0; j < vl; ++j) di[j] = gi * (p[i * vl + j] - av);
      const int64_t t = tg[i];
      if (t >= start && t < start + vl) di[t - start] -= gi * static_cast<T>(1 - a);
    }
  }
};

constexpr const char* kOp = "parallel_cross_entropy";

// The leading shape of logits [..., V/tp], after checking the dtypes, the targets' shape and the
// options.
Shape checked_lead(const Tensor& logits, const Tensor& targets,
                   const ParallelCrossEntropyOptions& opts) {
  const char* op = kOp;
  NXD_CHECK(logits.defined() && (logits.dtype() == DType::f32 || logits.dtype() == DType::f64 ||
                                 logits.dtype() == DType::bf16),
            "[", op, "] logits must be f32, f64 or bf16, got ",
            logits.defined() ? logits.desc() : "undefined");
  NXD_CHECK(targets.defined() && (targets.dtype() == DType::i32 || targets.dtype() == DType::i64),
            "[", op, "] targets must be i32 or i64, got ",
            targets.defined() ? targets.desc() : "undefined");
  NXD_CHECK_SHAPE(logits.dim() >= 1, "[", op, "] logits must be [..., V/tp], got ", logits.desc());
  NXD_CHECK(opts.label_smoothing >= 0.0 && opts.label_smoothing <= 1.0, "[", op,
            "] label_smoothing must be in [0, 1], got ", opts.label_smoothing);
  Shape lead = logits.shape();
  lead.pop_back();
  NXD_CHECK_SHAPE(targets.shape() == lead, "[", op, "] targets ", targets.desc(),
                  " do not match logits ", logits.desc(), " (expected targets ", shape_str(lead),
                  ")");
  return lead;
}

// Shapes only (the planner): the same collectives, shape-only, and a meta loss of shape `lead`.
Tensor meta_loss(const Tensor& logits, const Shape& lead, Communicator& group) {
  const int64_t n = shape_numel(lead);
  const DType dt0 = logits.dtype(), ct0 = dt0 == DType::f64 ? DType::f64 : DType::f32;
  Communicator* g = &group;
  Shape ls = logits.shape();
  return autograd::custom(
      kOp, {logits},
      [=](const std::vector<Tensor>&) {
        g->all_reduce(empty({n}, ct0, Device::meta), ReduceOp::max);
        g->all_reduce(empty({n, 3}, ct0, Device::meta), ReduceOp::sum);
        return std::vector<Tensor>{empty(lead, ct0, Device::meta)};
      },
      [=](const Grads&) -> Grads { return {empty(ls, dt0, Device::meta)}; })[0];
}

// The n targets as integers, each ignore_index or in [0, vocab); `count` the ones not ignored.
std::vector<int64_t> read_targets(const Tensor& targets, int64_t n, int64_t ignore, int64_t vl,
                                  int tp, int64_t& count) {
  const int64_t vocab = vl * tp;
  std::vector<int64_t> tg(static_cast<size_t>(n));
  count = 0;
  std::vector<double> tv = targets.detach().to_vector();
  for (int64_t i = 0; i < n; ++i) {
    tg[i] = static_cast<int64_t>(tv[i]);
    if (tg[i] == ignore) continue;
    NXD_CHECK(tg[i] >= 0 && tg[i] < vocab, "[", kOp, "] target ", tg[i], " out of range [0, ",
              vocab, ") (local vocabulary ", vl, " x tensor parallel size ", tp, ")");
    ++count;
  }
  return tg;
}

// The per-token losses reduced as asked; the mean is over the `count` targets not ignored.
Tensor reduce_loss(const Tensor& loss, Reduction reduction, int64_t count) {
  switch (reduction) {
    case Reduction::none:
      return loss;
    case Reduction::sum:
      return sum(loss);
    case Reduction::mean:
      // Like PyTorch: NaN when every target is ignored.
      return count > 0 ? mul(sum(loss), 1.0 / static_cast<double>(count))
                       : mul(sum(loss), std::numeric_limits<double>::quiet_NaN());
  }
  return loss;
}

}  // namespace

Tensor parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                              const ParallelCrossEntropyOptions& opts, Communicator& group) {
  const char* op = kOp;
  const Shape lead = checked_lead(logits, targets, opts);
  const int64_t vl = logits.shape().back();
  const int tp = group.size();
  const int64_t vocab = vl * tp, start = vl * group.rank();
  const int64_t n = shape_numel(lead);
  const int64_t ignore = opts.ignore_index;
  const double a = opts.label_smoothing;
  if (logits.is_meta() || targets.is_meta()) {
    Tensor loss = meta_loss(logits, lead, group);
    return opts.reduction == Reduction::none ? loss : sum(loss);
  }
  int64_t count = 0;
  const std::vector<int64_t> tg = read_targets(targets, n, ignore, vl, tp, count);
  const DType dt = logits.dtype(), ct = dt == DType::f64 ? DType::f64 : DType::f32;
  Communicator* g = &group;
  Tensor prob = empty({n, vl}, ct);
  Tensor loss = autograd::custom(
      op, {logits},
      [=](const std::vector<Tensor>& in) {
        // A private copy in the compute dtype: the caller's logits are never written.
        Tensor lc = in[0].to(ct).contiguous().reshape({n, vl});
        Tensor l = empty({n}, ct);
        if (ct == DType::f64)
          CeForward<double>::run(*g, lc, tg, vl, start, vocab, ignore, a, l, prob);
        else
          CeForward<float>::run(*g, lc, tg, vl, start, vocab, ignore, a, l, prob);
        return std::vector<Tensor>{l.view(lead)};  // bf16 logits: f32 losses
      },
      [=](const Grads& gr) -> Grads {
        Tensor dloss = gr[0].to(ct).contiguous().reshape({n});
        Tensor dl = empty({n, vl}, ct);
        if (ct == DType::f64)
          CeForward<double>::backward(dl, dloss, prob, tg, vl, start, vocab, ignore, a);
        else
          CeForward<float>::backward(dl, dloss, prob, tg, vl, start, vocab, ignore, a);
        Shape ls = lead;
        ls.push_back(vl);
        return {dl.view(ls).to(dt)};
      })[0];
  return reduce_loss(loss, opts.reduction, count);
}

Tensor parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                              const ParallelCrossEntropyOptions& opts) {
  return parallel_cross_entropy(logits, targets, opts,
                                parallel_state::get_tensor_model_parallel_group());
}

}  // namespace nxd
