#include "nxd/trace/fuse.h"

#include "nxd/autograd/ops.h"
#include "nxd/runtime/kernels/elementwise.h"
#include "nxd/runtime/kernels/matmul.h"

namespace nxd::trace {

Tensor linear_add(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& r) {
  NXD_CHECK_SHAPE(x.dim() >= 2 && w.dim() == 2 && x.size(-1) == w.size(1) &&
                      r.size(-1) == w.size(0) && r.dim() == x.dim() && r.dtype() == x.dtype(),
                  "[linear_add] x ", x.desc(), " w ", w.desc(), " r ", r.desc());
  Tensor y = empty(r.shape(), r.dtype(), r.device());  // the output: r (+ b), then += x w^T
  if (b.defined()) {
    y.copy_(b.detach());
    kernels::binary(y, y, r.detach(), kernels::Binary::add);
  } else {
    y.copy_(r.detach());
  }
  kernels::bmm(y, x.detach(), w.detach().t(), 1.0, 1.0);
  return y;
}

int fuse_linear_residual(Graph& g) {
  const size_t nv = g.values.size();
  std::vector<int> uses(nv, 0), consumer(nv, -1);
  std::vector<char> viewed(nv, 0), is_output(nv, 0);
  for (int o : g.outputs) is_output[o] = 1;
  for (const Value& v : g.values)
    if (v.alias_of >= 0) viewed[v.alias_of] = 1;
  for (size_t k = 0; k < g.nodes.size(); ++k)
    for (int i : g.nodes[k].inputs)
      if (i >= 0) ++uses[i], consumer[i] = static_cast<int>(k);
  std::vector<char> drop(g.nodes.size(), 0);
  int fused = 0;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    Node& add = g.nodes[k];
    if (add.op != "add" || add.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const int y = add.inputs[side], r = add.inputs[1 - side];
      if (y < 0 || r < 0 || y == r) continue;
      const Value& yv = g.values[y];
      if (yv.producer < 0 || drop[yv.producer] || g.nodes[yv.producer].op != "linear") continue;
      if (uses[y] != 1 || viewed[y] || is_output[y] || yv.alias_of >= 0) continue;
      const Value& rv = g.values[r];
      if (rv.shape != yv.shape || rv.dtype != yv.dtype ||
          g.values[add.outputs[0]].shape != yv.shape)
        continue;
      const Node& lin = g.nodes[yv.producer];
      drop[yv.producer] = 1;
      add.op = "linear_add";
      add.inputs = {lin.inputs[0], lin.inputs[1], lin.inputs.size() > 2 ? lin.inputs[2] : -1, r};
      ++fused;
      break;
    }
  }
  if (!fused) return 0;
  std::vector<Node> nodes;
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    if (drop[k]) {
      for (int o : g.nodes[k].outputs) g.values[o].producer = -1;
      continue;
    }
    for (int o : g.nodes[k].outputs) g.values[o].producer = static_cast<int>(nodes.size());
    nodes.push_back(std::move(g.nodes[k]));
  }
  g.nodes = std::move(nodes);
  return fused;
}

}  // namespace nxd::trace
