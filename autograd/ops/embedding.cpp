// embedding: a row gather; the backward scatter-adds into a zeroed dweight.
#include "nxd/runtime/kernels/embedding.h"
#include "nxd/autograd/ops/nn.h"
#include "nxd/autograd/ops/nn_internal.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

using namespace nn_detail;

Tensor embedding(const Tensor& ids, const Tensor& weight) {
  OpScope scope_("embedding");
  return scope_.out(
      [&]() -> Tensor {
        const char* op = "embedding";
        NXD_CHECK(ids.defined() && (ids.dtype() == DType::i32 || ids.dtype() == DType::i64), "[",
                  op, "] ids must be i32 or i64, got ", ids.defined() ? ids.desc() : "undefined");
        check_float(op, "weight", weight);
        NXD_CHECK_SHAPE(weight.dim() == 2, "[", op, "] weight must be [V, D], got ", weight.desc());
        Shape ys = ids.shape();
        ys.push_back(weight.size(1));
        Tensor idd = ids.detach(), wd = weight.detach();
        Tensor y = empty(ys, weight.dtype(), device_of({ids, weight}));
        kernels::embedding_forward(y, idd,
                                   wd);  // gathers in any dtype (bf16 rows are copied as is)
        const DType dt = weight.dtype(), ct = compute_dtype(dt);
        const Shape ws = weight.shape();
        autograd::record(op, {weight}, {y}, [idd, ws, dt, ct](const Grads& g) -> Grads {
          Tensor dw = zeros(ws, ct, g[0].device());
          kernels::embedding_backward(dw, compute(g[0]), idd);
          return {to_dtype(dw, dt)};
        });
        return y;
      }(),
      [&] {
        return OpCall{{ids, weight}, OpAttrs()};
      });
}

}  // namespace nxd
