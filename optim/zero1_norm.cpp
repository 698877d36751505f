// Zero1Optimizer's gradient norm and clipping (optim/zero1.h): the squared norm of this rank's
// shards, summed over the norm's groups; the shards scaled when it is over the limit.
#include <cmath>

#include "nxd/optim/items.h"
#include "nxd/optim/zero1_impl.h"

namespace nxd::optim {

using Impl = Zero1Optimizer::Impl;
using zero1_detail::Segment;
using zero1_detail::Shard;

double Zero1Optimizer::grad_sq_sum() {
  Impl& I = *impl_;
  if (!I.reduced) reduce_gradients();
  NoGradGuard ng;
  double total = 0;
  for (size_t i = 0; i < I.segs.size(); ++i) {
    const Segment& s = I.segs[i];
    const auto [lo, hi] = I.overlap(s);
    if (!I.sync->has_grad(static_cast<int>(i)) || hi <= lo || s.norm_weight == 0 || I.meta)
      continue;
    const Shard& sh = I.shards[static_cast<size_t>(s.bucket)];
    total += grad_stat(I.grad[static_cast<size_t>(s.bucket)].narrow(0, lo - sh.begin, hi - lo),
                       GradStat::sum_of_squares) *
             s.norm_weight;
  }
  return zero1_norm_sum(total, I.opts.norm_groups, *I.dp);
}

double zero1_norm_sum(double local, const NormGroups& groups, Communicator& dp) {
  for (Communicator* g : {groups.tp.get(), groups.pp.get(), groups.ep.get(), &dp})
    if (g && g->size() > 1) g->all_reduce(&local, &local, 1, DType::f64, ReduceOp::sum);
  return local;
}

void Zero1Optimizer::scale_grads(float c) {
  Impl& I = *impl_;
  if (I.meta) return;
  std::vector<int64_t> sizes;
  for (const Tensor& g : I.grad) sizes.push_back(g.numel());
  detail::for_each_item(sizes, 1, [&](size_t j, int64_t b, int64_t e) {
    float* g = I.grad[j].data<float>();
    for (int64_t k = b; k < e; ++k) g[k] *= c;
  });
}

double Zero1Optimizer::clip_grad_norm(double max_norm) {
  // the dense parameters' sum first, then the experts' (every rank in the same order)
  double total = grad_sq_sum();
  if (experts_) total += experts_->grad_sq_sum();
  const double norm = std::sqrt(total);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) {
      scale_grads(static_cast<float>(coef));
      if (experts_) experts_->scale_grads(static_cast<float>(coef));
    }
  }
  return norm;
}

}  // namespace nxd::optim
