#pragma once
// Custom differentiable functions, activation recomputation and gradcheck.
#include <functional>
#include <vector>

#include "nxd/autograd/graph.h"

namespace nxd::autograd {

using ForwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// A function with a user forward and backward (the tensor-parallel mappings are such functions).
// `forward` runs with grad mode off on detached inputs; `backward` gets one gradient per output
// and returns one per input (undefined = none).
std::vector<Tensor> custom(const char* name, const std::vector<Tensor>& inputs,
                           const ForwardFn& forward, BackwardFn backward);

// Activation recomputation (PyTorch's and NxD's "activation checkpointing"; nxd keeps the word
// checkpoint for saved training state, checkpoint/): runs fn without recording a graph and saves
// only `inputs`; backward reruns fn with grad on and backpropagates through the recomputed graph.
// Gradients are bitwise-identical to running fn directly (provided fn is deterministic given its
// inputs and the RNG state, which is saved and restored for the recomputation).
std::vector<Tensor> recompute(const ForwardFn& fn, const std::vector<Tensor>& inputs);

struct GradcheckOptions {
  double eps = 1e-6;  // central-difference step
  double atol = 1e-7;
  double rtol = 1e-5;
  bool check_all_outputs = true;  // projects every output onto a random direction
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first failing input and element, numeric vs analytic
};

// Compares the analytic gradient of sum_k <r_k, fn(inputs)_k> (r_k fixed random directions)
// against central differences, in double precision: floating inputs are converted to f64 first.
GradcheckResult gradcheck(const ForwardFn& fn, const std::vector<Tensor>& inputs,
                          GradcheckOptions opts = {});

}  // namespace nxd::autograd
