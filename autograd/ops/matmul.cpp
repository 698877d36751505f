// matmul (torch.matmul semantics) and linear. Forward and both backward products go to BLAS
// through kernels::bmm, which takes transposed and strided views without copies: linear is one
// sgemm forward (x @ w^T through the trans flag), and backward is dx = dy @ w, dw = dy^T @ x
// (the batch folded into the inner dimension), db = sum(dy).
#include "nxd/runtime/kernels/matmul.h"
#include "nxd/autograd/ops/basic.h"
#include "nxd/runtime/kernels/reduce.h"
#include "nxd/runtime/trace_hook.h"

namespace nxd {

namespace {

Tensor mT(const Tensor& t) {
  return t.transpose(-1, -2);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  OpScope scope_("matmul");
  return scope_.out(
      [&]() -> Tensor {
        NXD_CHECK(a.defined() && b.defined(), "[matmul] undefined input");
        NXD_CHECK(is_floating(a.dtype()) && a.dtype() == b.dtype(), "[matmul] needs two floating ",
                  "tensors of one dtype, got a=", a.desc(), " b=", b.desc());
        NXD_CHECK_SHAPE(a.dim() >= 1 && b.dim() >= 1 && a.size(-1) == b.size(b.dim() == 1 ? 0 : -2),
                        "[matmul] inner dims differ: a=", a.desc(), " b=", b.desc());
        const Shape out_shape = kernels::matmul_shape(a.shape(), b.shape());
        const Device dev = a.is_meta() || b.is_meta() ? Device::meta : Device::host;
        Tensor a2 = a.dim() == 1 ? a.detach().unsqueeze(0) : a.detach();
        Tensor b2 = b.dim() == 1 ? b.detach().unsqueeze(1) : b.detach();
        Shape full = broadcast_shapes(Shape(a2.shape().begin(), a2.shape().end() - 2),
                                      Shape(b2.shape().begin(), b2.shape().end() - 2), "matmul");
        full.push_back(a2.size(-2));
        full.push_back(b2.size(-1));
        Tensor y2 = empty(full, a.dtype(), dev);
        kernels::bmm(y2, a2, b2);
        Tensor y = full == out_shape ? y2 : y2.view(out_shape);
        if (!autograd::needs_grad({a, b})) return y;
        const bool na = a.requires_grad(), nb = b.requires_grad();
        const Shape as = a.shape(), bs = b.shape();
        autograd::record("matmul", {a, b}, {y},
                         [a2 = nb ? a2 : Tensor(), b2 = na ? b2 : Tensor(), full, as, bs, na,
                          nb](const Grads& g) -> Grads {
                           Tensor g2 = g[0].reshape(full);
                           Grads r(2);
                           if (na) {  // da = g @ b^T, summed over a's broadcast batch dims
                             Shape s2 = as.size() == 1 ? Shape{1, as[0]} : as;
                             Tensor da = empty(s2, g2.dtype(), g2.device());
                             kernels::bmm(da, g2, mT(b2));
                             r[0] = da.view(as);
                           }
                           if (nb) {  // db = a^T @ g, summed over b's broadcast batch dims
                             Shape s2 = bs.size() == 1 ? Shape{bs[0], 1} : bs;
                             Tensor db = empty(s2, g2.dtype(), g2.device());
                             kernels::bmm(db, mT(a2), g2);
                             r[1] = db.view(bs);
                           }
                           return r;
                         });
        return y;
      }(),
      [&] {
        return OpCall{{a, b}, OpAttrs()};
      });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  OpScope scope_("linear");
  return scope_.out(
      [&]() -> Tensor {
        NXD_CHECK(x.defined() && w.defined(), "[linear] undefined input");
        NXD_CHECK_SHAPE(x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1), "[linear] x ",
                        x.desc(), " does not match weight ", w.desc(),
                        " (expected x[..., in] and w[out, in])");
        NXD_CHECK(is_floating(x.dtype()) && x.dtype() == w.dtype(),
                  "[linear] needs floating x and w of one dtype, got x=", x.desc(),
                  " w=", w.desc());
        const int64_t out = w.size(0);
        if (b.defined()) {
          NXD_CHECK_SHAPE(b.dim() == 1 && b.size(0) == out, "[linear] bias ", b.desc(),
                          " does not match weight ", w.desc());
          NXD_CHECK(b.dtype() == x.dtype(), "[linear] bias ", b.desc(), " dtype differs from x ",
                    x.desc());
        }
        const bool meta = x.is_meta() || w.is_meta() || (b.defined() && b.is_meta());
        Tensor x2 = x.dim() == 1 ? x.detach().unsqueeze(0) : x.detach();
        Tensor wd = w.detach();
        Shape ys = x.shape();
        ys.back() = out;
        Shape y2s = x2.shape();
        y2s.back() = out;
        Tensor y2 = empty(y2s, x.dtype(), meta ? Device::meta : Device::host);
        if (b.defined()) {
          y2.copy_(b.detach());  // broadcast the bias, then accumulate the product onto it
          kernels::bmm(y2, x2, wd.t(), 1.0, 1.0);
        } else {
          kernels::bmm(y2, x2, wd.t());
        }
        Tensor y = x.dim() == 1 ? y2.view(ys) : y2;
        std::vector<Tensor> ins =
            b.defined() ? std::vector<Tensor>{x, w, b} : std::vector<Tensor>{x, w};
        if (!autograd::needs_grad(ins)) return y;
        const bool nx = x.requires_grad(), nw = w.requires_grad(),
                   nb = b.defined() && b.requires_grad();
        const Shape xs = x.shape();
        autograd::record("linear", ins, {y},
                         [x2 = nw ? x2 : Tensor(), wd = nx ? wd : Tensor(), xs, y2s, nx, nw, nb,
                          has_b = b.defined()](const Grads& g) -> Grads {
                           Tensor g2 = g[0].shape() == y2s ? g[0] : g[0].reshape(y2s);
                           Grads r(has_b ? 3 : 2);
                           if (nx) {  // dx = dy @ w
                             Shape s2 = xs.size() == 1 ? Shape{1, xs[0]} : xs;
                             Tensor dx = empty(s2, g2.dtype(), g2.device());
                             kernels::bmm(dx, g2, wd);
                             r[0] = dx.view(xs);
                           }
                           if (nw) {  // dw = dy^T @ x, summed over the batch
                             Tensor dw = empty({g2.size(-1), x2.size(-1)}, g2.dtype(), g2.device());
                             kernels::bmm(dw, mT(g2), x2);
                             r[1] = dw;
                           }
                           if (nb) {  // db = sum of dy over everything but the last dim
                             Tensor db = empty({g2.size(-1)}, g2.dtype(), g2.device());
                             kernels::sum_to(db, g2);
                             r[2] = db;
                           }
                           return r;
                         });
        return y;
      }(),
      [&] {
        return OpCall{{x, w, b}, OpAttrs()};
      });
}

}  // namespace nxd
