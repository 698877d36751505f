// cross_entropy with ignore_index and label smoothing (PyTorch's formula; see
// runtime/kernels/cross_entropy.h). Logits [..., V] with targets [...] are flattened to rows.
#include <cmath>

#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/kernels/cross_entropy.h"

namespace nxd {

using namespace nn_detail;

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& opts) {
  const char* op = "cross_entropy";
  check_float(op, "logits", logits);
  NXD_CHECK(targets.defined() && (targets.dtype() == DType::i32 || targets.dtype() == DType::i64),
            "[", op, "] targets must be i32 or i64, got ",
            targets.defined() ? targets.desc() : "undefined");
  NXD_CHECK_SHAPE(logits.dim() >= 1, "[", op, "] logits must be [N, V], got ", logits.desc());
  Shape lead = logits.shape();
  const int64_t v = lead.back();
  lead.pop_back();
  NXD_CHECK_SHAPE(targets.shape() == lead, "[", op, "] targets ", targets.desc(),
                  " do not match logits ", logits.desc(), " (expected targets ", shape_str(lead),
                  ")");
  const int64_t n = shape_numel(lead);
  const DType dt = logits.dtype(), ct = compute_dtype(dt);
  const Device dev = device_of({logits, targets});
  Tensor lc = compute(logits).reshape({n, v}), tc = targets.detach().reshape({n});
  Tensor rows = empty({n}, ct, dev), lse = empty({n}, ct, dev);
  const int64_t count =
      kernels::cross_entropy_forward(rows, lse, lc, tc, opts.ignore_index, opts.label_smoothing);
  Tensor loss;
  if (opts.reduction == Reduction::none) {
    loss = rows.view(lead);
  } else {
    loss = empty({}, ct, dev);
    if (dev == Device::host) {
      double s = 0;
      for (double r : rows.to_vector()) s += r;
      // mean over non-ignored rows; like PyTorch, NaN when every row is ignored
      loss.fill_(opts.reduction == Reduction::mean ? s / double(count) : s);
    }
  }
  const Reduction red = opts.reduction;
  const int64_t ii = opts.ignore_index;
  const double ls = opts.label_smoothing;
  const Shape lshape = logits.shape();
  autograd::record(op, {logits}, {loss},
                   [lc, tc, lse, count, red, ii, ls, lshape, dt, ct, n](const Grads& g) -> Grads {
                     Tensor dloss;
                     if (red == Reduction::none) {
                       dloss = compute(g[0]).reshape({n});
                     } else {
                       dloss = empty({n}, ct, g[0].device());
                       if (!g[0].is_meta()) {
                         double gv = g[0].item();
                         dloss.fill_(red == Reduction::mean ? (count > 0 ? gv / count : 0.0) : gv);
                       }
                     }
                     Tensor dl = empty({n, lshape.back()}, ct, lc.device());
                     kernels::cross_entropy_backward(dl, dloss, lc, lse, tc, ii, ls);
                     return {to_dtype(dl.view(lshape), dt)};
                   });
  return loss;
}

}  // namespace nxd
