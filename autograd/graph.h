#pragma once
// Define-by-run reverse mode. A differentiable op computes its outputs eagerly and, when grad
// mode is on and an input requires grad, records a Node holding a backward function and edges to
// the nodes of its inputs. backward() walks the graph in reverse topological order, summing the
// gradients that reach each node, and accumulates into the .grad of leaves.
//
// Writing an op (one family per file in autograd/ops/, forward and backward side by side):
//
//   Tensor gelu(const Tensor& x) {
//     Tensor xd = x.detach();                 // work on detached handles
//     Tensor y = empty_like(xd);
//     kernels::gelu_forward(y, xd);
//     autograd::record("gelu", {x}, {y}, [xd](const Grads& g) -> Grads {
//       Tensor dx = empty_like(xd);
//       kernels::gelu_backward(dx, g[0], xd);
//       return {dx};
//     });
//     return y;
//   }
//
// The backward function receives one gradient per output (zeros if an output got none) and
// returns one per input (an undefined Tensor means "no gradient"). It runs with grad mode off.
// Capture saved tensors detached: capturing an output itself would make a reference cycle.
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "nxd/runtime/tensor.h"

namespace nxd {

using Grads = std::vector<Tensor>;

namespace autograd {

using BackwardFn = std::function<Grads(const Grads& grad_outputs)>;
// A hook on a leaf: runs once the leaf's gradient for this backward pass is final, after it was
// accumulated into .grad (data-parallel buckets launch their all-reduce from here).
using GradHook = std::function<void(const Tensor& leaf)>;

struct Node;

struct Edge {
  std::shared_ptr<Node> node;  // producer of the input, or null for a leaf / constant
  int output_nr = 0;           // which output of `node`
};

struct Node {
  std::string name;
  BackwardFn backward;
  std::vector<Edge> inputs;                       // one per op input
  std::vector<std::weak_ptr<TensorImpl>> leaves;  // per input: the leaf to accumulate into
  std::vector<Shape> output_shapes;
  std::vector<DType> output_dtypes;
  std::vector<Device> output_devices;
  uint64_t sequence_nr = 0;  // creation order: later nodes run first among ready ones
};

// Per-tensor autograd state (TensorImpl::autograd).
struct AutogradMeta {
  std::shared_ptr<Node> grad_fn;  // null for leaves
  int output_nr = 0;
  std::vector<GradHook> hooks;  // leaves only
  // Leaves only: where the leaf's gradient lives (see set_grad_buffer); null = a fresh tensor.
  std::shared_ptr<TensorImpl> grad_buffer;
  // Leaves only, without a buffer: the dtype of a fresh .grad (set_grad_dtype); none = the leaf's.
  bool has_grad_dtype = false;
  DType grad_dtype = DType::f32;
};

// True when grad mode is on and any input requires grad.
bool needs_grad(const std::vector<Tensor>& inputs);

// Records `fn` as the backward of an op with these inputs and outputs (no-op unless
// needs_grad(inputs)); marks the outputs as requiring grad.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn fn);

// The node that produced t, or null for leaves and constants.
std::shared_ptr<Node> grad_fn(const Tensor& t);
bool is_leaf(const Tensor& t);

// Registers a hook on a leaf that requires grad.
void register_hook(const Tensor& leaf, GradHook hook);

// Gives a leaf that requires grad a gradient buffer: `buffer` has the leaf's shape, is contiguous
// and floating point, on the leaf's device (host or meta), and may have another dtype (an f32
// buffer for a bf16 parameter accumulates its gradients in f32: .grad is then f32). When a
// gradient reaches the leaf while its .grad is undefined, it is written into the buffer
// (converted) and .grad becomes the buffer; later gradients of the same or later passes add into
// it in place, as into any defined .grad. Setting .grad to none (zero_grad) keeps the buffer for
// the next pass. This is how flat gradient buckets (optim/grad_sync.h) make every .grad a view
// of one buffer that collectives reduce in place. An undefined `buffer` removes it.
void set_grad_buffer(const Tensor& leaf, const Tensor& buffer);
// The leaf's gradient buffer (undefined if none).
Tensor grad_buffer(const Tensor& leaf);
// Without a gradient buffer: the first gradient of a pass becomes a fresh .grad of `dtype` (f32
// for a bf16 parameter accumulates in f32 as an f32 buffer does, with no memory held between
// passes; ZeRO-2's gradients, optim/grad_sync.h). reset_grad_dtype() goes back to the leaf's.
void set_grad_dtype(const Tensor& leaf, DType dtype);
void reset_grad_dtype(const Tensor& leaf);

struct BackwardOptions {
  bool retain_graph = false;  // keep saved tensors so backward can run again
};

}  // namespace autograd

// Runs backward from `outputs`, seeded with `grads` (one per output; a scalar output may take an
// undefined grad, meaning 1). Gradients accumulate into the .grad of leaves.
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads = {},
              autograd::BackwardOptions opts = {});
inline void backward(const Tensor& output, const Tensor& grad = Tensor()) {
  backward(std::vector<Tensor>{output}, std::vector<Tensor>{grad});
}

// Gradients of `outputs` w.r.t. `inputs` without touching .grad (like torch.autograd.grad).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {},
                         autograd::BackwardOptions opts = {});

}  // namespace nxd
